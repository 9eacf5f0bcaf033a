"""torch.compile seen: a real model compiled (backend ``aot_eager``, which runs through the same compile callbacks
as inductor without needing a C compiler) that recompiles on a shape change at a known step; the compilations are
their own row, out of the steady-state steps, named in the report, the verdict, the timeline and the saved run."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

import stepwatch
from stepwatch import Stopwatch

from .conftest import stepwatch_command

pytestmark = pytest.mark.slow

PROGRAMS = Path(__file__).parent / "programs"
EXAMPLES = Path(__file__).parent.parent / "examples"


@pytest.mark.parametrize("warmup", [0, 3])
def test_a_recompilation_at_a_known_step_is_its_own_row_out_of_the_steps(tmp_path: Path, warmup: int) -> None:
    """With warm-up too: the first compilation happens in it (step 0 in the list: which warm-up step is not known),
    the recompilation is still at step 11."""
    torch._dynamo.reset()  # what other tests compiled in this process: its frames, their dynamic shapes
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    compiled = torch.compile(model, backend="aot_eager")
    sw = Stopwatch(trace_steps=40, warmup=warmup)
    sw.enable()
    for index in sw.timed_iter(range(30)):
        x = torch.randn(8 if index < 10 else 12, 16)  # a new shape at the 11th step
        with sw.timed("forward"):
            y = compiled(x)
        with sw.timed("backward"):
            y.sum().backward()
    summary = sw.summary()
    events = summary.metadata["compiles"]
    recompiled = [event for event in events if event[3]]
    assert len(recompiled) == 1 and recompiled[0][0] == 11 and recompiled[0][1] == "0/1", events
    assert all(event[0] == (0 if warmup else 1) for event in events if not event[3])  # the first: step 1
    train = summary.phases["train"]
    assert train.stages["compile"].calls == len(events) and train.steps == (30 - warmup if warmup else 29)
    compile_s = sum(event[2] for event in events)
    assert train.stages["compile"].total == pytest.approx(compile_s, rel=1e-6)
    # out of every step and block it ran in: the slowest step and forward take less than half the recompilation
    # (not all steps together: under two CPU hogs on 2 cores 29 steps of 24-32 ms outgrew a 0.35 s recompilation)
    assert train.stages["step"].max < recompiled[0][2] / 2, (train.stages["step"].max, recompiled[0][2])
    assert train.stages["step/forward"].max < recompiled[0][2] / 2
    assert any(event.path == "compile" for event in summary.trace)  # marked in the timeline
    text = stepwatch.render(summary)
    line = next(line for line in text.splitlines() if line.startswith("torch.compile: "))
    assert f", 1 recompilation (at step 11): {compile_s:.1f} s, " in line
    assert line.split(" s, ")[0] in stepwatch.render(summary, "html")
    sw.save(tmp_path / "run.json")
    assert line.split(" s, ")[0] in stepwatch.render(stepwatch.load(tmp_path / "run.json"))  # (the run's wall grew)


def test_stepwatch_run_sees_the_compilations_of_an_unmodified_script(tmp_path: Path) -> None:
    done = stepwatch_command("run", "-o", "run.json", str(EXAMPLES / "compiled_train.py"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "training done" in done.stdout
    run = stepwatch.load(tmp_path / "run.json")
    recompiled = [event for event in run.metadata["compiles"] if event[3]]
    assert [event[0] for event in recompiled] == [11], run.metadata["compiles"]
    assert "1 recompilation (at step 11)" in done.stderr
    assert "recompiling is " in done.stderr or "compiling is " in done.stderr  # a short run: a large share


def test_a_run_without_torch_compile_says_nothing_of_it() -> None:
    """(Its loop waits for its data: a compute-bound verdict's advice names torch.compile among the remedies.)"""

    def waited_for() -> Iterator[int]:
        for item in range(4):
            time.sleep(0.003)
            yield item

    sw = Stopwatch()
    sw.enable()
    for _ in sw.timed_iter(waited_for()):
        pass
    summary = sw.summary()
    assert summary.metadata["compiles"] == [] and "torch.compile" not in stepwatch.render(summary)


def test_reset_forgets_the_compilations_of_the_run() -> None:
    """After ``reset()`` the compilations seen before are no longer the run's: not in its metadata, and they keep
    no later FLOP counting from counting (a Lightning run after a compiled model's, in one process)."""
    torch._dynamo.reset()
    compiled = torch.compile(nn.Linear(16, 1), backend="aot_eager")
    sw = Stopwatch()
    sw.enable()
    for _ in sw.timed_iter(range(3)):
        compiled(torch.randn(8, 16))
    assert sw.summary().metadata["compiles"]
    sw.reset()
    for _ in sw.timed_iter(range(3)):
        pass
    summary = sw.summary()
    assert summary.metadata["compiles"] == [] and "compile" not in summary.phases["train"].stages


def test_flops_are_not_counted_under_torch_compile_which_keeps_compiling() -> None:
    """A compiled function called under torch's FLOP counter goes back to eager for the rest of the run (it stops
    recompiling): with compiled code in the run, the counting is skipped and the report says why."""
    torch._dynamo.reset()
    compiled = torch.compile(nn.Linear(16, 1), backend="aot_eager")
    sw = Stopwatch(flops=True)
    sw.enable()
    for index in sw.timed_iter(range(14)):
        with sw.timed("forward"):
            y = compiled(torch.randn(8 if index < 10 else 12, 16))
        y.sum().backward()
    summary = sw.summary()
    assert summary.metadata["flops"] == {}
    assert [event[0] for event in summary.metadata["compiles"] if event[3]] == [11]  # it still recompiles
    assert "FLOPs: not counted: the model runs under torch.compile" in stepwatch.render(summary)


def test_stepwatch_run_counts_a_compiled_models_flops_on_an_eager_step(tmp_path: Path) -> None:
    """Under ``stepwatch run --flops`` the counted step calls the compiled model's ``_orig_mod``: exact FLOPs
    (Linear 16->32 and 32->1 on 8 samples: forward 8,704; backward 9,216, the first layer's input needing no
    gradient), and the model still compiles afterwards (its recompilation at step 11)."""
    done = stepwatch_command("run", "--flops", "-o", "run.json", str(EXAMPLES / "compiled_train.py"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "global hooks" not in done.stderr
    run = stepwatch.load(tmp_path / "run.json")
    record = run.metadata["flops"]["train"]
    assert (record["forward"], record["backward"], record["at_step"]) == (8704, 9216, 2)
    assert [event[0] for event in run.metadata["compiles"] if event[3]] == [11]


def test_a_stopwatch_that_watched_for_compilations_is_freed_when_dropped() -> None:
    """torch keeps its compiler callbacks for the process: stepwatch's reach their stopwatch weakly, so a dropped
    stopwatch (and all it recorded) is freed, and the next one's install removes the callbacks left behind."""
    import gc
    import weakref

    import torch._dynamo  # noqa: F401  (the compiler loaded: a loop's start installs the callbacks)
    from torch._dynamo.callback import callback_handler

    from stepwatch._compile import WeakCallback

    sw = Stopwatch()
    sw.enable()
    for _ in sw.timed_iter(range(3)):
        pass
    assert sw.compiles.installed
    gone = weakref.ref(sw)
    del sw
    gc.collect()
    assert gone() is None
    other = Stopwatch()
    other.enable()
    for _ in other.timed_iter(range(3)):
        pass
    for callbacks in (callback_handler.start_callbacks, callback_handler.end_callbacks):
        ours = [callback for callback in callbacks if isinstance(callback, WeakCallback)]
        assert ours and not any(callback.dead for callback in ours)
        assert any(callback.watch() is other.compiles for callback in ours)
