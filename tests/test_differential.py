"""Random programs of stepwatch calls record the same with the compiled blocks (``_speedups.c``) as with their
Python twin (``STEPWATCH_PURE_PYTHON``): nested blocks, exceptions through them, loops watched and timed, broken
out of and in another phase, threads, generators suspended inside a block, blocks closed out of order or never,
``count()``, switching off and on, ``reset()`` and a state reloaded, on a new stopwatch and on the default one, with
a schedule (warm-up steps and a measured window) or without. The compiled paths
hand every case but the common one to general code; a program that takes a case to the wrong path, or a common
path that writes what the general one would not, records other stages, calls, steps, counters or drops.

Each example is a batch of programs run by ``tests/programs/block_ops.py`` in two processes, one per
implementation, and compared program by program. The same programs, run here, also check what a run keeps across
a checkpoint, a saved file and every format it renders to, and a data pipeline's rows with and without workers.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stepwatch
from stepwatch import Stopwatch

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "tests" / "programs" / "block_ops.py"
AUTO_PROGRAM = ROOT / "tests" / "programs" / "auto_ops.py"
NAMES = st.sampled_from(["a", "b", "c"])

leaves = st.one_of(
    st.tuples(st.just("block"), NAMES, st.just([])),
    st.tuples(st.just("count"), st.integers(1, 64)),
    st.tuples(st.just("crossed"), NAMES, NAMES),
    st.just(("toggle",)),
    st.just(("reset",)),
    st.just(("reload",)),
    st.tuples(st.just("opened"), NAMES),
)


def nested(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    bodies = st.lists(children, max_size=3)
    return st.one_of(
        st.tuples(st.just("block"), NAMES, bodies),
        st.tuples(st.just("raise"), NAMES, bodies),
        st.tuples(
            st.just("loop"),
            st.sampled_from(["watch", "iter"]),
            st.integers(0, 6),
            st.none() | st.integers(0, 5),
            st.sampled_from([None, "val"]),
            bodies,
        ),
        st.tuples(st.just("thread"), bodies),
        st.tuples(st.just("generator"), NAMES, bodies),
    )


operations = st.recursive(leaves, nested, max_leaves=10)
schedules = st.just({}) | st.integers(1, 4).flatmap(
    lambda active: st.fixed_dictionaries(
        {"warmup": st.integers(0, 3), "active": st.just(active)}, optional={"every": st.integers(active, 6)}
    )
)
programs = st.fixed_dictionaries(
    {
        "on": st.sampled_from(["new", "default"]),
        "ops": st.lists(operations, max_size=4),
        "schedule": schedules,
        "log_every": st.none() | st.integers(1, 3),
    }
)


models = st.recursive(
    st.sampled_from(["linear", "relu"]), lambda inner: st.lists(inner, min_size=1, max_size=3), max_leaves=6
)
loops = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(["train", "val"]),
        "written": st.sampled_from(["for", "next"]),
        "batches": st.integers(0, 5),
        "break_at": st.none() | st.integers(0, 4),
        "extras": st.lists(
            st.sampled_from(["twice", "submodule", "refuse", "accumulate", "timed", "count"]), unique=True
        ),
    }
)
training_programs = st.fixed_dictionaries(
    {
        "model": st.lists(models, min_size=1, max_size=3),
        "loss": st.sampled_from(["module", "function"]),
        "loops": st.lists(loops, min_size=1, max_size=3),
    }
)


def recorded(path: Path, pure: bool, program: Path = PROGRAM) -> list[str]:
    """``program``'s lines for the programs in ``path``, after the line saying which blocks ran them."""
    env = {key: value for key, value in os.environ.items() if key not in ("STEPWATCH", "STEPWATCH_PURE_PYTHON")}
    if pure:
        env["STEPWATCH_PURE_PYTHON"] = "1"
    result = subprocess.run(
        [sys.executable, str(program), str(path)], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    compiled, *lines = result.stdout.splitlines()
    assert compiled == f"compiled blocks: {not pure}"
    return lines


def recorded_the_same(batch: list[dict[str, Any]], path: Path, program: Path) -> None:
    """``batch`` written to ``path`` and run by ``program`` on each implementation: the same records, program by
    program."""
    path.write_text(json.dumps(batch))
    compiled, pure = recorded(path, pure=False, program=program), recorded(path, pure=True, program=program)
    assert len(compiled) == len(pure) == len(batch)
    for written, in_c, in_python in zip(batch, compiled, pure, strict=True):
        assert json.loads(in_c) == json.loads(in_python), json.dumps(written)


@pytest.mark.slow
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batch=st.lists(programs, min_size=25, max_size=25))
def test_random_programs_record_the_same_with_the_compiled_blocks_and_the_python_twin(
    tmp_path_factory: pytest.TempPathFactory, batch: list[dict[str, Any]]
) -> None:
    """The module's check: it found a thread taking an ended thread's open blocks at a switch (``test_switching.py``),
    where the two implementations agreed with each other but not from one run to the next."""
    recorded_the_same(batch, tmp_path_factory.mktemp("programs") / "programs.json", PROGRAM)


@pytest.mark.slow
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batch=st.lists(training_programs, min_size=15, max_size=15))
def test_random_trainings_record_the_same_under_auto_with_its_compiled_wrappers_and_the_python_twin(
    tmp_path_factory: pytest.TempPathFactory, batch: list[dict[str, Any]]
) -> None:
    """The same for training loops under ``auto()``, whose wrappers of module calls, optimizers and the loader
    run in C (``_auto_calls.c``, ``_auto_steps.c``) or in Python: models nested in several ways, a loss module or
    function, training and validation loops written as ``for`` statements or with ``next()``, broken out of, with
    a second forward, a submodule called alone, a forward that raises, accumulated gradients, a block and a
    ``count()`` of the program's own (``tests/programs/auto_ops.py``)."""
    recorded_the_same(batch, tmp_path_factory.mktemp("trainings") / "programs.json", AUTO_PROGRAM)


@pytest.mark.slow
def test_three_written_programs_record_the_same_in_both_and_what_they_ran() -> None:
    """The random programs' check, on three written ones whose records are known: a watched loop with nested
    blocks, a count and an exception, then two blocks crossed; the default stopwatch in a validation loop broken out
    of, with a generator's block and a thread, then switched off and on inside a block; a reset, then a block left
    open inside another."""
    path = ROOT / "tests" / "programs" / "block_ops.json"
    compiled, pure = recorded(path, pure=False), recorded(path, pure=True)
    assert compiled == pure
    watched, validation, left_open = (json.loads(line) for line in compiled)
    train = watched["phases"]["train"]
    assert ["step/a/b", 3] in train["stages"] and ["step/c", 3] in train["stages"], train
    assert ["loader/dataset", 6] in train["stages"] and train["steps"] == 3, train
    assert train["counters"] == {"samples": 9} and watched["dropped"] == 2, watched
    assert ["step/g/x", 2] in validation["phases"]["val"]["stages"], validation
    assert validation["phases"]["train"]["stages"] == [["t", 3]], validation  # the thread's blocks, at its top
    assert not any(path.startswith(("a", "b")) for path, _ in validation["phases"]["train"]["stages"])
    assert left_open["phases"]["train"]["stages"] == [["a", 0], ["a/o", 0], ["a/o/b", 1]], left_open  # z forgotten


def block_ops() -> ModuleType:
    """``tests/programs/block_ops.py``, imported here (its programs run in this process)."""
    spec = importlib.util.spec_from_file_location("block_ops", PROGRAM)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RUNNER = block_ops()
unswitched = st.recursive(  # no switch, reset or block left open across the checkpoint: what a training would save
    st.one_of(
        st.tuples(st.just("block"), NAMES, st.just([])),
        st.tuples(st.just("count"), st.integers(1, 64)),
        st.tuples(st.just("crossed"), NAMES, NAMES),
    ),
    nested,
    max_leaves=8,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(first=st.lists(unswitched, max_size=3), second=st.lists(unswitched, max_size=3))
def test_a_run_split_by_a_checkpoint_records_what_it_records_whole(first: list[Any], second: list[Any]) -> None:
    """Random programs (as above, without a switch, a reset or a block left open: what a training saves) run whole,
    and run in two parts with ``state_dict()`` saved through ``torch.save`` and loaded
    (``weights_only=True``) into a new stopwatch between them: the same stages and calls, steps, counters and
    ``count()`` calls. It found a resumed run counting the batches' samples where the program's own count had
    replaced them, and a loop left in a function that never closed (``test_resume.py``, ``test_switching.py``)."""
    first, second = json.loads(json.dumps(first)), json.loads(json.dumps(second))  # (tuples as JSON gives them)
    whole = stepwatch_running()
    RUNNER.run(whole, first + second)
    part = stepwatch_running()
    RUNNER.run(part, first)
    saved = io.BytesIO()
    torch.save({"stepwatch": part.state_dict()}, saved)
    saved.seek(0)
    resumed = stepwatch_running()
    resumed.load_state_dict(torch.load(saved, weights_only=True)["stepwatch"])
    RUNNER.run(resumed, second)
    assert RUNNER.records(resumed.summary(), resumed) == RUNNER.records(whole.summary(), whole)
    for sw in (whole, part, resumed):
        sw.disable()


def stepwatch_running() -> Stopwatch:
    sw = Stopwatch()
    sw.enable()
    return sw


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(program=programs, trace_steps=st.sampled_from([None, 5]))
def test_a_random_run_saved_and_loaded_is_the_same_and_renders_in_every_format(
    tmp_path_factory: pytest.TempPathFactory, program: dict[str, Any], trace_steps: int | None
) -> None:
    """Any run, saved and loaded, is the summary it saved (but its elapsed time, which runs on between the two), and
    renders as text, CSV, TSV, JSON, a trace and a page, and as the report, without an error."""
    program = json.loads(json.dumps(program))
    sw = Stopwatch()
    sw.enable(**program["schedule"], trace_steps=trace_steps)
    RUNNER.run(sw, program["ops"])
    summary = sw.summary()
    path = tmp_path_factory.mktemp("run") / "run.json"
    sw.save(path)
    saved, loaded = summary.to_dict(), stepwatch.load(path).to_dict()
    saved.pop("elapsed")
    loaded.pop("elapsed")
    assert loaded == saved
    for kind in ("text", "csv", "tsv", "json", "trace", "html"):
        assert isinstance(stepwatch.render(summary, kind), str)
    assert "stepwatch" in sw.report()
    sw.disable()


class Pipeline(torch.utils.data.Dataset[torch.Tensor]):
    """A dataset whose reads run nested blocks of the program's own, and a transform timed by name."""

    def __init__(self, length: int, plan: list[Any], transform: bool) -> None:
        self.length, self.plan, self.transform = length, plan, transform

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        run_plan(self.plan)
        sample = torch.tensor([float(index)])
        return DOUBLED(sample) if self.transform else sample


def run_plan(plan: list[Any]) -> None:
    for name, inside in plan:
        with stepwatch.timed(name):
            run_plan(inside)


def doubled(sample: torch.Tensor) -> torch.Tensor:
    return sample * 2


DOUBLED = stepwatch.timed_transform(doubled, "augment")


def packed(batch: list[torch.Tensor]) -> torch.Tensor:
    with stepwatch.timed("pack"):
        return torch.utils.data.default_collate(batch)  # type: ignore[no-any-return]


plans = st.recursive(
    st.just([]), lambda inner: st.lists(st.tuples(st.sampled_from(["read", "decode"]), inner), max_size=2), max_leaves=3
)


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    length=st.integers(1, 10),
    batch_size=st.integers(1, 4),
    plan=plans,
    transform=st.booleans(),
    own_collate=st.booleans(),
    epochs=st.integers(1, 2),
    break_at=st.none() | st.integers(0, 3),
    persistent=st.booleans(),
)
def test_a_random_pipeline_records_the_same_rows_with_and_without_workers(
    length: int,
    batch_size: int,
    plan: list[Any],
    transform: bool,
    own_collate: bool,
    epochs: int,
    break_at: int | None,
    persistent: bool,
) -> None:
    """Blocks nested in a dataset's reads, a timed transform and a collate of the program's own record the same
    rows, calls, steps and samples whether the batches are made in the training's process or in two workers (forked,
    persistent or not), over one or two epochs, broken out of or not."""
    plan = json.loads(json.dumps(plan))

    def rows(workers: int) -> dict[str, Any]:
        stepwatch.disable()
        stepwatch.reset()
        stepwatch.enable()
        loader = torch.utils.data.DataLoader(
            Pipeline(length, plan, transform),
            batch_size=batch_size,
            num_workers=workers,
            collate_fn=packed if own_collate else None,
            persistent_workers=persistent and workers > 0,
        )
        for _ in range(epochs):
            for index, _batch in enumerate(stepwatch.watch(loader)):
                if index == break_at:
                    break
                with stepwatch.timed("forward"):
                    pass
        try:
            return RUNNER.records(stepwatch.summary(), stepwatch._default_instance.stopwatch)  # type: ignore[no-any-return]
        finally:
            stepwatch.disable()
            stepwatch.reset()

    assert rows(2) == rows(0)
