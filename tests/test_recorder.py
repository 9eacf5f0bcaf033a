"""Recording: timed blocks, timed iterators, hierarchy, threads, phases, counters, schedule."""

from __future__ import annotations

import math
import sys
import threading
from typing import Any

import pytest

import stepwatch
from stepwatch import StageStats, Stopwatch

from .conftest import OVERHEAD_S, FakeClock, spin

MS = 1e-3


def enabled(**kwargs: object) -> Stopwatch:
    sw = Stopwatch(**kwargs)  # type: ignore[arg-type]
    sw.enable()
    return sw


# -- timing on controlled busy-waits (5% on means, 2 points on shares) ---------------------------------------


def assert_measures(stage: StageStats, truths: list[float]) -> None:
    """Each measurement holds its workload (never less) plus at most the timer's slack, in order."""
    measured = [ns * 1e-9 for ns in stage.recent_ns]
    assert len(measured) == len(truths)
    for got, truth in zip(measured, truths, strict=True):
        assert truth <= got < truth + OVERHEAD_S


def test_block_matches_what_the_busy_wait_measured_itself() -> None:
    sw = enabled()
    truths = []
    for _ in range(20):
        with sw.timed("work"):
            took = spin(2 * MS)
        truths.append(took)
    stage = sw.summary().stages["work"]
    assert stage.calls == 20
    assert_measures(stage, truths)
    assert stage.min >= 2 * MS  # the nominal length: a lower bound only
    assert stage.total == pytest.approx(sum(truths), abs=20 * OVERHEAD_S)


def test_loop_breakdown_means_and_shares() -> None:
    waits: list[float] = []

    def batches():  # each item takes at least 1 ms to produce
        for i in range(30):
            waits.append(spin(1 * MS))
            yield i

    sw = enabled()
    forwards, backwards = [], []
    for _ in sw.timed_iter(batches()):
        with sw.timed("forward"):
            took = spin(1 * MS)
        forwards.append(took)
        with sw.timed("backward"):
            took = spin(2 * MS)
        backwards.append(took)
    summary = sw.summary()
    stages = summary.stages
    assert [stages[p].calls for p in ("step", "step/forward", "step/backward")] == [29] * 3
    # the first step of the epoch is a one-off, wait and body: reported apart
    assert [stages[p].calls for p in ("first_batch", "first_step", "first_step/forward")] == [1, 1, 1]
    assert stages["loader"].calls == 29 and summary.main_phase.steps == 29
    assert_measures(stages["loader"], waits[1:])
    assert_measures(stages["step/forward"], forwards[1:])
    assert_measures(stages["step/backward"], backwards[1:])
    steps = [f + b for f, b in zip(forwards[1:], backwards[1:], strict=True)]
    assert sum(steps) <= stages["step"].total < sum(steps) + 29 * 3 * OVERHEAD_S
    # Shares against the truth: never below what the workloads took over the loop as measured, never above
    # what they took plus the timer's slack over what the whole loop's workloads took (a preemption outside
    # the busy-waits can only lengthen the loop).
    loop_s = summary.main_phase.measured
    truth_s = sum(waits[1:]) + sum(steps)
    for share, truths, calls in (
        (summary.share("loader"), waits[1:], 29),
        (summary.share("step/backward"), backwards[1:], 29),
    ):
        assert sum(truths) / loop_s <= share <= (sum(truths) + calls * OVERHEAD_S) / truth_s
    assert summary.share("step/backward") == pytest.approx(sum(backwards[1:]) / truth_s, abs=0.05)
    assert summary.share("loader") + summary.share("step") == pytest.approx(1.0, abs=1e-12)


def test_breakdown_adds_up_to_its_parent_exactly(clock: FakeClock) -> None:
    sw = enabled(clock=clock)
    with sw.timed("outer"):
        clock.advance(5)
        with sw.timed("a"):
            clock.advance(10)
        with sw.timed("b"):
            clock.advance(20)
            with sw.timed("deep"):
                clock.advance(7)
        clock.advance(3)
    stages = sw.summary().stages
    assert stages["outer"].total_ns == 45
    assert stages["outer/other"].total_ns == 8
    assert stages["outer/b/other"].total_ns == 20
    children = ("outer/a", "outer/b", "outer/other")
    assert sum(stages[p].total_ns for p in children) == stages["outer"].total_ns
    assert list(stages) == ["outer", "outer/a", "outer/b", "outer/b/deep", "outer/b/other", "outer/other"]
    assert "outer/a/other" not in stages  # a leaf has no uncovered part to show


def test_same_name_nests_inside_itself(clock: FakeClock) -> None:
    sw = enabled(clock=clock)
    with sw.timed("x"):
        clock.advance(1)
        with sw.timed("x"):
            clock.advance(2)
    assert sw.summary().stages["x"].total_ns == 3
    assert sw.summary().stages["x/x"].total_ns == 2


def test_decorator_times_each_call(clock: FakeClock) -> None:
    sw = enabled(clock=clock)

    @sw.timed("fn")
    def work(n: int) -> int:
        clock.advance(n)
        return n * 2

    assert work(5) == 10 and work(7) == 14
    assert work.__name__ == "work"
    stage = sw.summary().stages["fn"]
    assert (stage.calls, stage.total_ns, stage.min_ns, stage.max_ns) == (2, 12, 5, 7)


def test_exception_records_the_block_and_propagates_unchanged(clock: FakeClock) -> None:
    sw = enabled(clock=clock)
    error = RuntimeError("boom")
    with pytest.raises(RuntimeError) as raised, sw.timed("outer"), sw.timed("inner"):
        clock.advance(4)
        raise error
    assert raised.value is error
    stages = sw.summary().stages
    assert stages["outer/inner"].total_ns == 4 and stages["outer"].calls == 1
    with sw.timed("after"):  # the stack is clean again: not nested under "outer"
        pass
    assert "after" in sw.summary().stages


def test_threads_record_every_block_with_their_own_nesting() -> None:
    sw = enabled()
    per_thread = 5000
    barrier = threading.Barrier(4)

    def worker() -> None:
        barrier.wait()
        for _ in range(per_thread):
            with sw.timed("t"), sw.timed("inner"):
                pass

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stages = sw.summary().stages
    assert stages["t"].calls == 4 * per_thread
    assert stages["t/inner"].calls == 4 * per_thread
    assert set(stages) == {"t", "t/inner", "t/other"}


def test_validation_of_stage_names() -> None:
    sw = Stopwatch()
    for bad in ("", "a/b", "other"):
        with pytest.raises(ValueError):
            sw.timed(bad)
    with pytest.raises(ValueError):
        sw.timed_iter([], phase="")


# -- disabled ---------------------------------------------------------------------------------------------


def test_disabled_records_nothing_and_timed_iter_is_the_plain_iterator() -> None:
    sw = Stopwatch()
    data = [1, 2, 3]
    iterator = sw.timed_iter(data)
    assert type(iterator) is type(iter(data))
    with sw.timed("x"):
        pass
    sw.count(samples=3)
    assert list(iterator) == [1, 2, 3]
    assert not sw.summary().phases


def test_disable_mid_block_drops_the_open_block(clock: FakeClock) -> None:
    sw = enabled(clock=clock)
    with sw.timed("open"):
        sw.disable()
    sw.enable()
    with sw.timed("later"):
        clock.advance(1)
    assert set(sw.summary().stages) == {"later"}


def test_default_instance_module_functions() -> None:
    stepwatch.enable()
    with stepwatch.timed("a"):
        pass
    for _ in stepwatch.timed_iter(range(3)):
        stepwatch.count(samples=2)
    summary = stepwatch.summary()
    assert summary.stages["a"].calls == 1
    assert summary.stages["loader"].calls + summary.stages["first_batch"].calls == 3
    assert summary.main_phase.counters["samples"] == 4  # the first step's count is apart, like its time
    assert "loader" in stepwatch.report()
    stepwatch.disable()
    stepwatch.reset()
    assert not stepwatch.summary().phases


def test_instances_are_independent() -> None:
    a, b = enabled(), Stopwatch()
    with a.timed("x"), b.timed("y"):
        pass
    assert set(a.summary().stages) == {"x"}
    assert not b.summary().phases


# -- timed_iter -------------------------------------------------------------------------------------------


class Closing:
    """An iterator that remembers being closed."""

    def __init__(self, n: int) -> None:
        self.items = iter(range(n))
        self.closed = False

    def __iter__(self) -> Closing:
        return self

    def __next__(self) -> int:
        return next(self.items)

    def close(self) -> None:
        self.closed = True


def test_final_stop_iteration_is_not_a_wait(clock: FakeClock) -> None:
    sw = enabled(clock=clock)

    class Slow:
        def __init__(self) -> None:
            self.n = 0

        def __iter__(self) -> Slow:
            return self

        def __next__(self) -> int:
            clock.advance(100)
            self.n += 1
            if self.n > 3:
                raise StopIteration
            return self.n

    for _ in sw.timed_iter(Slow()):
        clock.advance(10)
    stages = sw.summary().stages
    assert stages["loader"].calls == 2 and stages["loader"].total_ns == 200
    assert stages["first_batch"].calls == 1 and stages["first_batch"].total_ns == 100
    assert stages["step"].calls == 2 and stages["step"].total_ns == 20
    assert stages["first_step"].calls == 1 and stages["first_step"].total_ns == 10
    assert sw.summary().main_phase.steps == 2


def test_break_records_partial_body_and_closes_iterator(clock: FakeClock) -> None:
    sw = enabled(clock=clock)
    source = Closing(10)
    for i in sw.timed_iter(source):
        clock.advance(5)
        if i == 2:
            break
    assert source.closed
    assert sw.summary().stages["step"].calls == 2  # steps 1 and 2 (step 2 left by break); step 0 apart
    assert sw.summary().stages["step"].total_ns == 10


def test_exception_in_body_records_partial_body_and_closes_iterator(clock: FakeClock) -> None:
    sw = enabled(clock=clock)
    source = Closing(10)

    def run() -> None:
        for i in sw.timed_iter(source):
            clock.advance(5)
            if i == 1:
                raise KeyError("x")

    with pytest.raises(KeyError):
        run()
    assert source.closed
    assert sw.summary().stages["step"].calls == 1
    assert sw.summary().stages["first_step"].calls == 1


def test_return_from_body_closes_iterator(clock: FakeClock) -> None:
    sw = enabled(clock=clock)
    source = Closing(10)

    def first() -> int:
        for i in sw.timed_iter(source):
            clock.advance(5)
            return i
        raise AssertionError

    assert first() == 0
    assert source.closed
    assert sw.summary().stages["first_step"].total_ns == 5  # the only step: the epoch's first


def test_error_from_the_data_propagates_and_keeps_the_wait(clock: FakeClock) -> None:
    sw = enabled(clock=clock)

    def broken():
        yield 1
        clock.advance(9)
        raise ValueError("bad sample")

    with pytest.raises(ValueError, match="bad sample"):
        for _ in sw.timed_iter(broken()):
            pass
    assert sw.summary().stages["loader"].calls == 1  # the failed wait after the first batch
    with sw.timed("free"):
        pass
    assert "free" in sw.summary().stages


def test_nested_loop_nests_under_the_step(clock: FakeClock) -> None:
    sw = enabled(clock=clock)
    for _ in sw.timed_iter(range(2)):
        for _ in sw.timed_iter(range(3), stage="micro_loader", body="micro"):
            clock.advance(1)
    stages = sw.summary().stages
    assert stages["step/micro"].calls == 3 and stages["first_step/micro"].calls == 3
    assert stages["step/micro_loader"].calls == 3  # an inner loop has no first step of its own
    assert sw.summary().main_phase.steps == 1


# -- phases, accumulation, counters -----------------------------------------------------------------------


def test_train_and_val_are_reported_apart(clock: FakeClock) -> None:
    sw = enabled(clock=clock)
    for _ in range(2):
        for _ in sw.timed_iter(range(4)):
            with sw.timed("forward"):
                clock.advance(10)
            sw.count(samples=8)
        for _ in sw.timed_iter(range(2), phase="val"):
            with sw.timed("forward"):
                clock.advance(3)
            sw.count(samples=16)
    summary = sw.summary()
    assert list(summary.phases) == ["train", "val"]
    train, val = summary.phases["train"], summary.phases["val"]
    assert train.stages["step/forward"].calls == 6 and train.stages["step/forward"].mean == 10e-9
    assert val.stages["step/forward"].calls == 2 and val.stages["step/forward"].mean == 3e-9
    assert train.counters == {"samples": 48} and val.counters == {"samples": 32}  # first steps apart
    assert dict(summary.stages) == dict(train.stages)
    text = sw.report()
    assert "· train ·" in text and "· val ·" in text


def test_gradient_accumulation_optimizer_row_is_per_call(clock: FakeClock) -> None:
    sw = enabled(clock=clock)
    for i in sw.timed_iter(range(12)):
        with sw.timed("backward"):
            clock.advance(10)
        if i % 4 == 3:
            with sw.timed("optimizer"):
                clock.advance(100)
    stages = sw.summary().stages
    assert stages["step/optimizer"].calls == 3
    assert stages["step/optimizer"].mean == pytest.approx(100e-9)
    assert stages["step"].calls == 11 and stages["first_step"].calls == 1


def test_throughput_is_total_units_over_total_loop_time(clock: FakeClock) -> None:
    sw = enabled(clock=clock)
    sizes = [99, 10, 30, 20]
    durations = [9_000_000, 1_000_000, 4_000_000, 5_000_000]  # per-step rates would average differently
    for size, ns in zip(sw.timed_iter(sizes), durations, strict=True):
        clock.advance(ns)
        sw.count(samples=size, tokens=size * 100)
    throughput = sw.summary().throughput  # the first step (99 in 9 ms) is a one-off, counts and time alike
    assert throughput["samples"] == pytest.approx(60 / 0.010)
    assert throughput["tokens"] == pytest.approx(6000 / 0.010)


def test_count_rejects_non_numbers() -> None:
    sw = enabled()
    for bad in ("3", None, True, float("nan")):
        with pytest.raises(TypeError):
            sw.count(samples=bad)  # type: ignore[arg-type]


# -- schedule ---------------------------------------------------------------------------------------------


def measured_steps(sw: Stopwatch, clock: FakeClock, n: int, epoch: int = 0) -> list[int]:
    """Runs one epoch of n steps, step i lasting epoch*1000 + i ns, and returns which steps were recorded."""
    for i in sw.timed_iter(range(n)):
        clock.advance(epoch * 1000 + i)
    stages = sw.summary().stages
    recent = [ns for path in ("first_step", "step") if path in stages for ns in stages[path].recent_ns]
    return sorted(ns - epoch * 1000 for ns in recent if 0 <= ns - epoch * 1000 < 1000)


def test_warmup_skips_first_steps_of_each_iterator(clock: FakeClock) -> None:
    sw = enabled(clock=clock, warmup=2)
    assert measured_steps(sw, clock, 5) == [2, 3, 4]
    assert measured_steps(sw, clock, 5, epoch=1) == [2, 3, 4]  # a new epoch warms up again
    assert sw.summary().main_phase.steps == 6


def test_active_window_then_nothing(clock: FakeClock) -> None:
    sw = enabled(clock=clock, warmup=1, active=3)
    assert measured_steps(sw, clock, 6) == [1, 2, 3]
    with sw.timed("outside"):  # outside the window, blocks cost the disabled path and record nothing
        pass
    assert "outside" not in sw.summary().stages


def test_every_period_repeats_the_window(clock: FakeClock) -> None:
    sw = enabled(clock=clock, active=2, every=5)
    assert measured_steps(sw, clock, 12) == [0, 1, 5, 6, 10, 11]


def test_blocks_in_unmeasured_steps_are_not_recorded(clock: FakeClock) -> None:
    sw = enabled(clock=clock, warmup=3)
    for _ in sw.timed_iter(range(5)):
        with sw.timed("forward"):
            clock.advance(1)
        sw.count(samples=1)
    summary = sw.summary()
    assert summary.stages["step/forward"].calls == 2
    assert summary.main_phase.counters["samples"] == 2


def test_schedule_arguments_are_checked() -> None:
    with pytest.raises(ValueError):
        Stopwatch(warmup=-1)
    with pytest.raises(ValueError):
        Stopwatch(every=5)
    with pytest.raises(ValueError):
        Stopwatch(active=5, every=3)


def test_other_row_is_exact_in_total_and_has_no_spread(clock: FakeClock) -> None:
    sw = enabled(clock=clock)
    for ns in (10, 30):
        with sw.timed("parent"):
            clock.advance(ns)
            with sw.timed("child"):
                clock.advance(5)
    other = sw.summary().stages["parent/other"]
    assert (other.calls, other.total_ns) == (2, 40)
    assert other.mean == pytest.approx(20e-9)
    assert not other.spread
    assert all(math.isnan(v) for v in (other.std, other.min, other.max, other.p50))
    line = next(line for line in sw.report().splitlines() if line.strip().startswith("other"))
    assert line.split()[4:9] == ["-", "-", "-", "-", "-"]
    assert "other" not in stepwatch.render(sw.summary(), "tsv").splitlines()[0]


def test_timed_accepts_the_stage_by_keyword_and_has_help() -> None:
    sw = enabled()
    with sw.timed(stage="kw"):
        pass
    assert sw.summary().stages["kw"].calls == 1
    assert "Time a block" in (stepwatch.timed.__doc__ or "")


def test_block_spanning_the_end_of_the_window_is_recorded_and_leaves_no_trace(clock: FakeClock) -> None:
    sw = enabled(clock=clock, active=2)
    with sw.timed("epoch"):
        for _ in sw.timed_iter(range(5)):
            with sw.timed("forward"):
                clock.advance(1)
    for _ in sw.timed_iter(range(3)):  # outside the window, with nothing left open
        with sw.timed("unmeasured"):
            pass
    assert not sw.stacks.hot  # so leaving a block costs what it costs with the stopwatch off
    stages = sw.summary().stages
    assert "step/unmeasured" not in stages
    assert stages["epoch"].calls == 1
    assert stages["step/forward"].calls + stages["first_step/forward"].calls == 2  # rooted at the phase
    sw.schedule = type(sw.schedule)()  # measure again, from the top level
    sw.stacks.set_window(True)
    with sw.timed("after"):
        pass
    assert "after" in sw.summary().stages  # not nested under a stale "epoch" frame


# -- hardening: what a training job passes in never crashes it later ------------------------------------


def counted(sw: Stopwatch) -> dict[str, float]:
    return dict(sw.summary().main_phase.counters)


def test_count_accepts_numpy_and_torch_scalars_from_the_first_call() -> None:
    import numpy as np
    import torch

    sw = Stopwatch(warmup=2)
    sw.enable()
    values = [np.int64(32), np.float32(1.5), torch.tensor(32), torch.tensor(0.5), 7]
    for _ in sw.timed_iter(range(4)):  # two warm-up steps, then two measured ones
        sw.count(samples=values[0], tokens=values[1], atoms=values[2], loss=values[3], plain=values[4])
    assert counted(sw) == {"samples": 64, "tokens": 3.0, "atoms": 64, "loss": 1.0, "plain": 14}
    assert all(type(value) in (int, float) for value in counted(sw).values())
    assert "samples/s" in sw.report()


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "32", None, True, b"1", [1], "nan"], ids=repr)
def test_count_rejects_what_is_not_a_finite_number_whether_measuring_or_not(bad: object) -> None:
    import numpy as np
    import torch

    off = Stopwatch()  # not measuring: checked all the same
    with pytest.raises(TypeError, match="finite number"):
        off.count(x=bad)  # type: ignore[arg-type]
    on = enabled()
    with pytest.raises(TypeError, match="finite number"):
        on.count(x=bad)  # type: ignore[arg-type]
    for tensorish in (torch.tensor([1, 2]), torch.tensor(True), np.bool_(True), np.float64("nan")):
        with pytest.raises(TypeError, match="finite number"):
            on.count(x=tensorish)
    assert counted(on) == {}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"warmup": None},
        {"warmup": -1},
        {"warmup": 1.5},
        {"active": "3"},
        {"every": True},
        {"window": 10**30},
        {"window": 0},
        {"window": None},
        {"active": 2, "every": 1},
        {"every": 5},
    ],
    ids=repr,
)
def test_schedule_values_fail_at_construction(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Stopwatch(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("kwargs", [{"warmup": -1}, {"active": -2}, {"every": 1.5}, {"warmup": "2"}], ids=repr)
def test_enable_checks_the_schedule_before_changing_anything(kwargs: dict[str, object]) -> None:
    sw = Stopwatch(warmup=2, active=3, every=5)
    with pytest.raises(ValueError):
        sw.enable(**kwargs)  # type: ignore[arg-type]
    assert not sw.is_enabled()
    assert (sw.schedule.warmup, sw.schedule.active, sw.schedule.every) == (2, 3, 5)


def test_enable_changes_only_the_schedule_parts_given() -> None:
    sw = Stopwatch(warmup=2, active=3, every=5)
    sw.enable(warmup=0)
    sw.disable()
    assert (sw.schedule.warmup, sw.schedule.active, sw.schedule.every) == (0, 3, 5)


def test_largest_window_works_in_a_loop() -> None:
    from stepwatch._schedule import MAX_WINDOW

    sw = enabled(window=MAX_WINDOW)
    for _ in sw.timed_iter(range(3)):
        with sw.timed("x"):
            pass
    assert sw.summary().stages["step/x"].calls == 2


@pytest.mark.parametrize("value", [1e308, 10**400, -1e308], ids=["float", "huge int", "negative"])
def test_counters_never_break_saving_or_reporting(tmp_path: object, value: float) -> None:
    import pathlib

    sw = enabled()
    for _ in sw.timed_iter(range(3)):
        sw.count(x=value)
    total = counted(sw)["x"]
    assert math.isfinite(float(total)) and abs(total) == sys.float_info.max
    path = pathlib.Path(str(tmp_path)) / "run.json"
    sw.save(path)
    assert "x/s" in sw.report()
    assert stepwatch.load(path).main_phase.counters["x"] == total
    assert stepwatch.render(stepwatch.load(path), "json")


def test_stage_names_are_capped_and_memory_stays_bounded(caplog: pytest.LogCaptureFixture) -> None:
    import tracemalloc

    from stepwatch._constants import MAX_STAGES, OVERFLOW

    sw = enabled()
    for i in range(MAX_STAGES + 5_000):
        with sw.timed(f"batch_{i}"):
            pass
    tracemalloc.start()  # from past the cap: what is allocated from now on and still held at the end
    for i in range(MAX_STAGES + 5_000, MAX_STAGES + 25_000):
        with sw.timed(f"batch_{i}"):
            pass
    grown = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    stages = sw.summary().stages
    assert len(stages) <= MAX_STAGES + 1
    assert stages[OVERFLOW].calls == 25_000  # every block past the first 10,000 names
    assert grown < 2**20  # 20,000 more names cost nothing that stays
    assert sum("distinct stages" in record.message for record in caplog.records) == 1
    assert "batch_" in caplog.text and OVERFLOW in sw.report()
    off = Stopwatch()
    for i in range(MAX_STAGES + 100):
        with off.timed(f"n{i}"):
            pass
    assert len(off._blocks) <= MAX_STAGES + 1


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda sw: sw.timed_iter([], stage="x", body="x"), "must differ"),
        (lambda sw: sw.timed_iter([], stage="first_batch"), "reserved"),
        (lambda sw: sw.timed_iter([], body="first_batch"), "reserved"),
        (lambda sw: sw.timed("a\nb"), "control characters"),
        (lambda sw: sw.timed("a\tb"), "control characters"),
        (lambda sw: sw.timed(["a"]), "non-empty string"),
        (lambda sw: sw.timed({"a": 1}), "non-empty string"),
        (lambda sw: sw.timed("(overflow)"), "reserved"),
        (lambda sw: sw.timed_iter([], phase="a\nb"), "control characters"),
    ],
    ids=[
        "same stage and body",
        "stage first_batch",
        "body first_batch",
        "newline",
        "tab",
        "list",
        "dict",
        "overflow",
        "phase newline",
    ],
)
def test_bad_names_get_a_value_error(call: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call(enabled())
