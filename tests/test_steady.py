"""A timed loop's steady steps in C (``SteadyLoop``, ``_steady.c``) against the generator's own loop (the Python
twin, ``STEPWATCH_PURE_PYTHON=1``): the same records to the nanosecond on a counting clock, at every way the
steady state ends (a step's end that is not steady, an item whose step cannot be opened, the end of the data, an
exception from the data, a loop left early or closed)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

from stepwatch import Stopwatch, _loops

from .test_speedups import compiled_and_pure_output, run

PROGRAM = """
import itertools
import stepwatch

import sys
from stepwatch import _loops

ticks = itertools.count(0, 7)
sw = stepwatch.Stopwatch(warmup=2, clock=lambda: next(ticks))
sw.enable()
for i in sw.timed_iter(range(40)):  # stepwatch's own cost timed on the first steps: a tick each, not steady
    pass
outcomes = []
if _loops.SteadyLoop is not None:  # (compiled) which way each delegation to the steady steps ended, on stderr
    real = _loops.SteadyLoop
    def recording(*args):
        outcomes.append(real(*args))
        return outcomes[-1]
    _loops.SteadyLoop = recording

def records():
    summary = sw.summary()
    phase = summary.phases["train"]
    rows = sorted((path, stage.calls, stage.total_ns) for path, stage in phase.stages.items())
    return rows, phase.steps, sw.tree.phases["train"].schedule_pos, sw.periodic.ticks, len(sw.stacks.thread_stack())

def data(n, fail_at=None, leak_at=None):
    for i in range(n):
        if i == fail_at:
            raise KeyError(i)
        if i == leak_at:
            sw.timed("leaked").__enter__()  # a block left open by the data: the step cannot be opened on top of it
        yield i

for i in sw.timed_iter(data(12)):  # the end of the data
    with sw.timed("work"):
        pass
print("exhausted", records())
for i in sw.timed_iter(data(12)):  # left early
    if i == 8:
        break
print("break", records())
try:
    for i in sw.timed_iter(data(12, fail_at=6)):  # an exception from the data, the wait open
        pass
except KeyError:
    pass
print("data raised", records())
try:
    for i in sw.timed_iter(data(12)):  # an exception from the body (the generator closed when dropped)
        if i == 7:
            raise ValueError(i)
except ValueError:
    pass
print("body raised", records())
for i in sw.timed_iter(data(12)):  # switched off for two steps: not steady, then steady again
    if i == 4:
        sw.disable()
    if i == 6:
        sw.enable()
print("switched", records())
for i in sw.timed_iter(data(12, leak_at=5)):  # an item fetched whose step cannot be opened
    pass
print("leaked", records())
for i in sw.timed_iter(data(12)):  # a loop inside each step, and the records reset in the middle
    for j in sw.timed_iter(range(3), stage="inner_wait", body="inner"):
        pass
    if i == 6:
        sw.reset()
print("nested, reset", records())
print([steps.state()[3] for steps in outcomes], file=sys.stderr)
"""


def test_the_steady_steps_record_what_the_generator_records() -> None:
    """Every way out of the steady state, in C and in the generator's loop: the same rows, totals, steps,
    schedule positions, training steps counted and stacks left behind."""
    output = compiled_and_pure_output(PROGRAM)
    lines = output.splitlines()
    assert [line.split()[0] for line in lines] == [
        "exhausted",
        "break",
        "data",
        "body",
        "switched",
        "leaked",
        "nested,",
    ]
    assert all(line.endswith(", 1)") for line in lines)  # each loop left the stack as it found it
    compiled = run([sys.executable, "-c", PROGRAM])
    # every way out of the steady steps was taken: the end of the data (3), a close (break, the body's exception:
    # still running, 0), the data's exception (0), a step's end switched off (1), an item whose step could not
    # be opened (2), a step's end after a reset (1)
    assert compiled.stderr.strip() == "[3, 0, 0, 0, 1, 3, 2, 3, 1, 3]"


def loop_steps(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The SteadyLoop objects the loops make from now on (the C type itself, behind a recording factory)."""
    if _loops.SteadyLoop is None:
        pytest.fail("the development install was expected to build the C speedups")
    made: list[Any] = []
    real = _loops.SteadyLoop

    def recording(*args: Any) -> Any:
        made.append(real(*args))
        return made[-1]

    monkeypatch.setattr(_loops, "SteadyLoop", recording)
    return made


def numbers(n: int, leak_at: int | None = None, sw: Stopwatch | None = None) -> Iterator[int]:
    for i in range(n):
        if i == leak_at and sw is not None:
            sw.timed("leaked").__enter__()
        yield i


def test_a_steady_loop_runs_its_steps_in_c_until_the_data_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain loop hands its steps to C once, after its first step, and gets them back at the end of the
    data with the wait it opened dropped (the end of the data is no wait)."""
    made = loop_steps(monkeypatch)
    sw = Stopwatch()
    sw.enable()
    for _ in sw.timed_iter(numbers(50)):
        pass
    assert len(made) == 1  # after stepwatch's own cost was timed on the first steps (a tick each)
    wait_frame, body_frame, index, outcome, item = made[0].state()
    assert (body_frame, index, outcome, item) == (None, 50, _loops.EXHAUSTED, None)
    assert wait_frame is not None and wait_frame not in sw.stacks.thread_stack()
    phase = sw.summary().phases["train"]
    assert phase.steps == 49 and phase.stages["loader"].calls == 49  # (+ the first step, the first batch)
    assert sw.periodic.ticks == 50


def test_the_steady_steps_hand_back_what_they_cannot_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step that ends while switched off goes back to the generator before anything is done (the step still
    open); an item fetched with a block left open on top of the wait goes back with the item, which the loop
    still gives, in order."""
    made = loop_steps(monkeypatch)
    sw = Stopwatch()
    sw.enable()
    for _ in sw.timed_iter(numbers(40)):  # stepwatch's own cost timed on the first steps
        pass
    made.clear()
    seen = []
    for i in sw.timed_iter(numbers(20)):
        seen.append(i)
        if i == 5:
            sw.disable()
        if i == 8:
            sw.enable()
    assert seen == list(range(20))
    outcomes = [steps.state()[3] for steps in made]
    assert outcomes[0] == 1 and outcomes[-1] == _loops.EXHAUSTED  # before a step's end, then the end of the data
    made.clear()
    seen.clear()
    for i in sw.timed_iter(numbers(20, leak_at=9, sw=sw)):
        seen.append(i)
    assert seen == list(range(20))
    assert made[0].state()[3] == _loops.FETCHED
    assert len(sw.stacks.thread_stack()) == 1  # the block the data left open went with its loop
