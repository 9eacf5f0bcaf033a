from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import stepwatch
from stepwatch._schedule import Schedule

ROOT = Path(__file__).resolve().parents[1]


def spin(seconds: float) -> float:
    """Busy-wait at least ``seconds`` and return how long it really took, by its own clock.

    The returned time is the truth a timing test compares stepwatch with: on a loaded machine a 2 ms busy-wait
    takes 4 ms, and the timer is right to say so. The nominal length is only a lower bound."""
    start = time.perf_counter()
    deadline = start + seconds
    now = start
    while now < deadline:
        now = time.perf_counter()
    return now - start


OVERHEAD_S = 0.0005
"""Slack per measurement between stepwatch's figure and the workload's own: the timer's overhead and the code
around the workload, with room for a rare preemption in that gap."""


class FakeClock:
    """A nanosecond clock that moves only when told to, for exact arithmetic in tests."""

    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now

    def advance(self, ns: int) -> None:
        self.now += ns


def rank_runs(clock: FakeClock, forward_ms: Sequence[int], steps: int, **options: Any) -> list[stepwatch.Summary]:
    """One run per rank of a job, on the controlled clock: ``steps`` loop items of a 1 ms wait and a ``forward`` of
    ``forward_ms[rank]`` ms, 2 samples each; the metadata names the rank and the world size."""
    runs = []
    for rank, forward in enumerate(forward_ms):
        sw = stepwatch.Stopwatch(clock=clock, **options)
        sw.enable()
        for _ in sw.timed_iter(range(steps)):
            clock.advance(1_000_000)
            with sw.timed("forward"):
                clock.advance(forward * 1_000_000)
            sw.count(samples=2)
        summary = sw.summary()
        metadata = {**summary.metadata, "rank": rank, "world_size": len(forward_ms)}
        runs.append(dataclasses.replace(summary, metadata=metadata))
    return runs


@pytest.fixture
def auto() -> Iterator[None]:
    """Auto-instrumentation on for the test, and off, with the default stopwatch cleared, after it."""
    stepwatch.auto()
    try:
        yield
    finally:
        stepwatch.auto(False)
        stepwatch.disable()
        stepwatch.reset()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(autouse=True)
def default_stopwatch_is_left_clean() -> Iterator[None]:
    """No test may leak state through the module-level default stopwatch."""
    assert not stepwatch.is_enabled(), "a previous test left the default stopwatch enabled"
    assert not stepwatch.summary().phases, "a previous test left recordings in the default stopwatch"
    yield
    leaked_enabled = stepwatch.is_enabled()
    leaked_data = bool(stepwatch.summary().phases)
    default = stepwatch._default
    leaked_schedule = default.schedule != Schedule() or default.window_end.stop or default.live is not None
    stepwatch.disable()
    stepwatch.reset()
    default.schedule, default.window_end.stop, default.live = Schedule(), False, None
    assert not leaked_enabled, "test left the default stopwatch enabled"
    assert not leaked_data, "test left recordings in the default stopwatch"
    assert not leaked_schedule, "test left the default stopwatch's schedule, stop or live view changed"


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for child Python processes: the package importable, stepwatch's switches unset."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPWATCH")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


PYTHON = sys.executable


def stepwatch_command(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m stepwatch ARGS`` in a real subprocess, in ``cwd``, its output captured."""
    return subprocess.run(
        [PYTHON, "-m", "stepwatch", *args],
        cwd=cwd,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
