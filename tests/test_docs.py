"""Every example in the README and the documentation runs: each fenced ``python`` or ``bash`` block is executed
(unless the line above it says ``<!-- not run: why -->``), and an output shown after a block (marked
``<!-- output of the block above -->``) is what a real run prints, in its shape: every line shown, its figures
aside, is a line the run printed. The docs' home page is the README, its links made relative to ``docs/``; the
site itself is built with ``mkdocs build --strict`` by ``make docs`` (run by ``make test``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted(path for path in (ROOT / "docs").glob("*.md") if path.name != "index.md")]
NOT_RUN = re.compile(r"<!-- not run: (.+) -->")
OUTPUT = "<!-- output of the block above -->"

PRELUDE = """
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import stepwatch

torch.manual_seed(0)
device = "cpu"
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
criterion = nn.MSELoss()
opt = optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
dataset = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
loader = train_loader = DataLoader(dataset, batch_size=32)
val_loader = DataLoader(dataset, batch_size=64)


def train_step(batch):
    x, y = batch
    with stepwatch.timed("forward"):
        out = model(x)
    loss = criterion(out, y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def random_crop(image):
    return image


stepwatch.enable()  # a run recorded, training then validation, as a script has by the time it reads figures
for batch in stepwatch.watch(train_loader):
    train_step(batch)
    stepwatch.count(samples=32)
with torch.no_grad():
    for x, y in stepwatch.watch(val_loader, phase="val"):
        model(x)
a, b = stepwatch.summary(), stepwatch.summary()
run_a, run_b = stepwatch.load("runs/w0.json"), stepwatch.load("runs/w2.json")
"""


@dataclass
class Block:
    page: str
    line: int
    language: str
    code: str
    not_run: str | None
    output: str | None

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a page, with the marks around them."""
    lines = path.read_text(encoding="utf-8").split("\n")
    found: list[Block] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("```"):
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        above = lines[i - 1] if i else ""
        mark = NOT_RUN.fullmatch(above.strip())
        block = Block(path.name, i + 1, lines[i][3:].strip(), "\n".join(lines[i + 1 : end]), None, None)
        block.not_run = mark.group(1) if mark else None
        if above.strip() == OUTPUT and found:
            found[-1].output = block.code
        else:
            found.append(block)
        i = end + 1
    return found


EXAMPLES = [block for page in PAGES for block in blocks(page) if block.language in ("python", "bash")]


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the examples run: a training script as ``train.py`` (and as a module, ``mypkg.train``), the
    repository's examples, and saved runs under the names the examples read."""
    where = tmp_path_factory.mktemp("docs")
    shutil.copytree(ROOT / "examples", where / "examples")
    shutil.copy(ROOT / "examples" / "plain_train.py", where / "train.py")
    (where / "mypkg").mkdir()
    (where / "mypkg" / "__init__.py").write_text("")
    shutil.copy(ROOT / "examples" / "plain_train.py", where / "mypkg" / "train.py")
    (where / "runs").mkdir()
    for workers in (0, 2):
        done = run_shell(
            f"stepwatch run -q --trace-steps 5 -o runs/w{workers}.json train.py --epochs 1 --workers {workers}",
            where,
        )
        assert done.returncode == 0, done.stderr
    for name in ("runs/a.json", "run.json", "runs/before.json", "before.json", "after.json"):
        shutil.copy(where / "runs" / "w0.json", where / name)
    # the pictures compare 0 and 2 workers; the CI gates' examples (before.json, after.json) compare a run with
    # itself, which passes whatever the machine's load (the gates' failures: test_analysis.py, test_cli.py)
    shutil.copy(where / "runs" / "w2.json", where / "runs" / "after.json")
    return where


def run_shell(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("STEPWATCH")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_every_example_is_run_or_says_why_not() -> None:
    assert len(EXAMPLES) >= 20
    for block in EXAMPLES:
        assert block.not_run is None or len(block.not_run) > 10, block


@pytest.mark.parametrize("block", [b for b in EXAMPLES if b.not_run is None], ids=str)
def test_example_runs(block: Block, sandbox: Path) -> None:
    if block.language == "python":
        script = sandbox / "example.py"
        script.write_text(PRELUDE + "\n" + block.code + "\n")
        done = run_shell(f"python {script.name}", sandbox)
    else:
        done = run_shell(block.code, sandbox)
    assert done.returncode == 0, f"{block}: {done.stderr[-2000:]}"
    if block.output is not None:
        printed = {shape(line) for line in (done.stdout + done.stderr).splitlines()}
        for line in block.output.splitlines():
            assert shape(line) in printed, f"{block}: {line!r} is not what a run prints"


def shape(line: str) -> str:
    """A line with its figures aside: numbers as ``#``, the prefix of a unit scaled to the figure (``MFLOP/s``,
    ``GFLOP/s``: a slower machine prints the one below) as none, runs of spaces as one."""
    line = re.sub(r"\b[kMGTPE]FLOP", "FLOP", re.sub(r"\d[\d,.]*", "#", line))
    return re.sub(r"\s+", " ", line).strip()


def test_the_docs_home_page_is_the_readme() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8").replace("](docs/", "](")
    readme = readme.replace(
        "The documentation site is built from `docs/` (`make docs`, MkDocs with the Material theme; open\n"
        "`site/index.html`): ",
        "The pages: ",
    )
    assert (ROOT / "docs" / "index.md").read_text(encoding="utf-8") == readme


def test_the_readme_is_short_and_starts_with_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.encode()) < 12 * 1024
    assert readme.split("\n")[3:6] == [
        "```bash",
        "make demo   # creates .venv, trains a small CNN twice (0, then 2 DataLoader workers): reports, verdicts,"
        " comparison",
        "make test   # creates .venv the same way, then runs ruff, mypy, the docs' strict build and the whole test"
        " suite",
    ]


def test_the_api_reference_shows_the_docstrings_cross_references_as_names() -> None:
    """mkdocstrings leaves Sphinx roles as written; the site's hook (registered in mkdocs.yml) turns each rendered
    role into the name it refers to."""
    sys.path.insert(0, str(ROOT))
    try:
        import mkdocs_hooks
    finally:
        sys.path.remove(str(ROOT))
    assert "mkdocs_hooks.py" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    rendered = (
        "a :class:<code>~stepwatch._stacks.ThreadStacks</code>, :func:<code>stepwatch.metrics</code> and"
        " :meth:<code>Stopwatch.count &lt;stepwatch.Stopwatch.count&gt;</code>; <code>:class:</code> as code stays"
    )
    assert mkdocs_hooks.on_page_content(rendered) == (
        "a <code>ThreadStacks</code>, <code>stepwatch.metrics</code> and <code>Stopwatch.count</code>;"
        " <code>:class:</code> as code stays"
    )


def test_an_output_is_compared_with_its_figures_and_their_units_prefixes_aside() -> None:
    assert shape("562 MFLOP/s (forward 5.74 GFLOP/s)") == shape("1.2 GFLOP/s (forward 980 MFLOP/s)")
    assert shape("loader   62   0.215") == shape("loader 6 1.5")
    assert shape("FLOPs: 2.2 MFLOP a step") != shape("FLOPs: 2.2 MFLOP a batch")
