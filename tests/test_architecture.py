"""The layout holds by construction: no import cycle at run time, public modules pin their surface, and
``docs/architecture.md``'s table of modules says what the code imports."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from .conftest import ROOT

PACKAGE = ROOT / "src" / "stepwatch"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


class _Imports(ast.NodeVisitor):
    """The stepwatch modules a module imports when it is imported or when its functions run (imports inside
    functions included); those under ``if TYPE_CHECKING:`` never run and are left out."""

    def __init__(self, module: str) -> None:
        self.package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
        self.found: set[str] = set()

    def visit_If(self, node: ast.If) -> None:
        if "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self.found.update(alias.name for alias in node.names if alias.name in MODULES)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            parts = self.package.split(".")[: len(self.package.split(".")) - node.level + 1]
            base = ".".join(parts + ([node.module] if node.module else []))
        for alias in node.names:  # `from . import _plot` imports a module; `from ._x import name`, ._x
            target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
            if target in MODULES:
                self.found.add(target)


def imports_of(module: str) -> set[str]:
    visitor = _Imports(module)
    visitor.visit(ast.parse(MODULES[module].read_text()))
    return visitor.found - {module}


GRAPH = {module: imports_of(module) for module in MODULES}


def test_no_module_imports_itself_back_at_run_time() -> None:
    finished: set[str] = set()

    def walk(module: str, path: list[str]) -> None:
        if module in path:
            cycle = [*path[path.index(module) :], module]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if module not in finished:
            for imported in sorted(GRAPH[module]):
                walk(imported, [*path, module])
            finished.add(module)

    for module in sorted(GRAPH):
        walk(module, [])


def test_the_graph_sees_function_local_imports() -> None:
    """A check that cannot fail is no check: the graph holds imports made inside functions."""
    assert "stepwatch._render.html" in GRAPH["stepwatch._render"]  # imported when a page is rendered
    assert "stepwatch._recorder" not in GRAPH["stepwatch._default_instance"]  # only under TYPE_CHECKING


@pytest.mark.parametrize(
    ("module", "public"),
    [
        (
            "stepwatch.distributed",
            {
                "AllRanks",
                "GATHER_TIMEOUT",
                "MAX_GATHER_TIMEOUT",
                "RANK_FIELD",
                "all_ranks_path",
                "combine_jobs",
                "gather",
                "gather_timeout",
                "in_job",
                "is_rank_zero",
                "rank_info",
                "rank_path",
            },
        ),
        ("stepwatch.integrations.lightning", {"StepwatchProfiler"}),
        ("stepwatch.integrations.transformers", {"Attachment", "attach", "metrics"}),
        ("stepwatch.integrations.tensorboard", {"log"}),
    ],
)
def test_public_modules_pin_their_surface(module: str, public: set[str]) -> None:
    imported = importlib.import_module(module)
    assert set(imported.__all__) == public
    assert all(hasattr(imported, name) for name in public)


def documented_modules() -> dict[str, tuple[str, str]]:
    """``docs/architecture.md``'s modules table: file -> (concern, imports)."""
    rows = {}
    for line in (ROOT / "docs" / "architecture.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and cells[0].endswith(".py`"):
            rows[cells[0].strip("`")] = (cells[1], cells[2])
    return rows


def file_of(module: str) -> str:
    return MODULES[module].relative_to(PACKAGE).as_posix()


def test_the_architecture_table_lists_every_module_and_what_it_imports() -> None:
    rows = documented_modules()
    assert sorted(rows) == sorted(file_of(module) for module in MODULES)
    short = {module: module.removeprefix("stepwatch.").removeprefix("stepwatch") or "stepwatch" for module in MODULES}
    by_short = {name: module for module, name in short.items()}
    for module, imported in GRAPH.items():
        concern, imports = rows[file_of(module)]
        assert concern, file_of(module)
        outside_notes = re.sub(r"\([^)]*\)", "", imports)  # "(extra `demo`)" names an extra, not a module
        named = {by_short[name] for name in re.findall(r"`([\w.]+)`", outside_notes) if name in by_short}
        said = f"{file_of(module)}: the table says {sorted(named)}, the code imports {sorted(imported)}"
        assert named == imported, said
