"""Right figures on every pipeline shape: the first step of an epoch, loops of another phase inside a step,
throughput without a loop, reports taken mid-step."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from stepwatch import Stopwatch
from stepwatch._analysis import compare

from .conftest import FakeClock

MS = 1_000_000


def waits(clock: FakeClock, n: int, wait_ns: int) -> Iterator[int]:
    for i in range(n):
        clock.advance(wait_ns)
        yield i


def test_the_whole_first_step_is_apart_times_and_counts_alike(clock: FakeClock) -> None:
    sw = Stopwatch(clock=clock)
    sw.enable()
    started = clock.now
    for _ in sw.timed_iter(waits(clock, 8, 8 * MS)):  # 8 steps of an 8 ms wait and a 2 ms body
        with sw.timed("forward"):
            clock.advance(2 * MS)
        sw.count(samples=32)
    wall_per_step = (clock.now - started) / 8 / 1e9
    summary = sw.summary()
    phase = summary.main_phase
    assert phase.steps == 7
    assert phase.measured / phase.steps == pytest.approx(wall_per_step) == pytest.approx(0.010)
    assert summary.throughput["samples"] == pytest.approx(32 / 0.010)  # 3,200/s, as the wall clock says
    assert compare(summary, summary).step.before == pytest.approx(0.010)
    assert [phase.stages[p].calls for p in ("first_batch", "first_step", "first_step/forward")] == [1, 1, 1]
    assert phase.share("loader") + phase.share("step") == pytest.approx(1.0)
    rows = {line.split()[0]: line.split() for line in sw.report().splitlines() if line.startswith(("first", "  "))}
    assert rows["first_batch"][-1] == "-" and rows["first_step"][-1] == "-"  # outside the 100%


def test_throughput_without_a_loop_is_not_made_up(clock: FakeClock) -> None:
    sw = Stopwatch(clock=clock)
    sw.enable()
    for _ in range(10):
        with sw.timed("forward"):
            clock.advance(MS)
        clock.advance(9 * MS)  # time between the blocks: the span the counts cover is unknown
        sw.count(samples=32)
    summary = sw.summary()
    assert summary.throughput == {}
    assert "samples counted, no rate: without a timed loop the span is unknown" in sw.report()


def test_report_mid_step_counts_agree(clock: FakeClock) -> None:
    sw = Stopwatch(clock=clock)
    sw.enable()
    for i in sw.timed_iter(waits(clock, 12, MS)):
        clock.advance(MS)
        if i == 10:
            phase = sw.summary().main_phase
            assert phase.steps == phase.stages["step"].calls == 9  # steps 1..9 are done, 10 is under way
            assert f"{phase.steps} steps" in sw.report()


def test_a_validation_loop_inside_a_training_step_is_not_charged_to_it(clock: FakeClock) -> None:
    sw = Stopwatch(clock=clock)
    sw.enable()
    with sw.timed("epoch"):
        for k, _ in enumerate(sw.timed_iter(waits(clock, 40, 7 * MS))):
            with sw.timed("forward"):
                clock.advance(3 * MS)
            if k % 10 == 9:  # as Lightning and the HF Trainer do: evaluate every N steps, inside the epoch
                with sw.timed("evaluate"):
                    for _ in sw.timed_iter(waits(clock, 5, 4 * MS), phase="val"):
                        with sw.timed("forward"):
                            clock.advance(2 * MS)
    summary = sw.summary()
    train, val = summary.phases["train"], summary.phases["val"]
    assert train.stages["step"].mean == pytest.approx(0.003)  # the val loops are not in the step
    assert train.stages["step/evaluate"].total == pytest.approx(0.0)
    assert train.measured == pytest.approx(39 * 0.010)
    assert train.share("loader") == pytest.approx(0.7)
    assert summary.verdict.label == "highly input-bound"
    assert summary.stages["epoch"].total == pytest.approx(40 * 0.010)  # the epoch block without the 4 val loops
    assert val.steps == 4 * 4 and val.stages["step/forward"].mean == pytest.approx(0.002)
    assert val.measured == pytest.approx(16 * 0.006)


def test_warmup_applies_to_training_not_to_a_short_validation(clock: FakeClock) -> None:
    sw = Stopwatch(clock=clock, warmup=5)
    sw.enable()
    for _ in range(2):
        for _ in sw.timed_iter(waits(clock, 10, MS)):
            clock.advance(MS)
        for _ in sw.timed_iter(waits(clock, 4, MS), phase="val"):  # 4 batches, fewer than the warm-up
            clock.advance(MS)
    summary = sw.summary()
    assert summary.phases["train"].steps == 2 * 5  # 5 warm-up steps skipped in each epoch
    assert summary.phases["val"].steps == 2 * 3  # all measured (the first of each run reported apart)
    assert summary.phases["val"].stages["first_step"].calls == 2


def test_warmup_applies_to_the_first_phase_of_a_run_without_train(clock: FakeClock) -> None:
    sw = Stopwatch(clock=clock, warmup=2)
    sw.enable()
    for _ in sw.timed_iter(waits(clock, 6, MS), phase="pretrain"):
        clock.advance(MS)
    for _ in sw.timed_iter(waits(clock, 3, MS), phase="val"):
        clock.advance(MS)
    assert sw.summary().phases["pretrain"].steps == 4 and sw.summary().phases["val"].steps == 2
