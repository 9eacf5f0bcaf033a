"""Statistics: exact totals, percentiles, merging, bounded memory."""

from __future__ import annotations

import random
import statistics
import tracemalloc

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stepwatch import Stopwatch
from stepwatch._block_base import COMPILED, fold_durations
from stepwatch._figures import StageStats
from stepwatch._schema import check_stats
from stepwatch._stats import RunningStats, percentile, python_fold_durations
from stepwatch._tree import LoopTimes

from .conftest import FakeClock


def test_percentile_matches_numpy_linear() -> None:
    rng = random.Random(3)
    values = sorted(rng.randrange(1, 10**6) for _ in range(501))
    for q in (0, 1, 50, 90, 99, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert np.isnan(percentile([], 50))


def test_mean_std_min_max_are_exact() -> None:
    rng = random.Random(1)
    values = [rng.randrange(1_000, 5_000_000) for _ in range(5000)]
    stats = RunningStats(window=100)
    for chunk in range(0, len(values), 333):
        stats.add_batch(values[chunk : chunk + 333])
    stage = StageStats.from_running("s", stats)
    assert stage.calls == 5000
    assert stage.total_ns == sum(values)
    assert stage.mean == pytest.approx(statistics.fmean(values) / 1e9, rel=1e-12)
    assert stage.std == pytest.approx(statistics.stdev(values) / 1e9, rel=1e-9)
    assert (stage.min_ns, stage.max_ns) == (min(values), max(values))
    assert stage.recent_ns == tuple(values[-100:])  # the window holds the most recent measurements


def test_merge_is_exact() -> None:
    rng = random.Random(2)
    a_values = [rng.randrange(10, 10**7) for _ in range(700)]
    b_values = [rng.randrange(10, 10**9) for _ in range(300)]
    a, b, both = RunningStats(), RunningStats(), RunningStats()
    a.add_batch(a_values)
    b.add_batch(b_values)
    both.add_batch(a_values + b_values)
    merged = a.merge(b)
    for field in ("calls", "total_ns", "sumsq_ns", "min_ns", "max_ns"):
        assert getattr(merged, field) == getattr(both, field)
    assert list(merged.recent) == list(both.recent)
    left = StageStats.from_running("s", a).merge(StageStats.from_running("s", b))
    assert left == StageStats.from_running("s", both)


def test_merge_with_empty_side() -> None:
    a = RunningStats()
    a.add_batch([5, 7])
    merged = RunningStats().merge(a)
    assert (merged.calls, merged.min_ns, merged.max_ns) == (2, 5, 7)


def test_single_call_has_zero_std() -> None:
    stats = RunningStats()
    stats.add_batch([42])
    assert StageStats.from_running("s", stats).std == 0.0


def test_summaries_of_two_recordings_merge_exactly(clock: FakeClock) -> None:
    def record(*epochs: list[int]) -> Stopwatch:
        sw = Stopwatch(clock=clock)
        sw.enable()
        for durations in epochs:
            for ns in sw.timed_iter(durations):
                with sw.timed("work"):
                    clock.advance(ns)
                sw.count(samples=1)
        return sw

    a, b, both = record([5, 9, 2]), record([7, 1]), record([5, 9, 2], [7, 1])
    merged = a.summary().merge(b.summary())
    expected = both.summary()
    assert dict(merged.stages) == dict(expected.stages)
    assert merged.main_phase.counters == expected.main_phase.counters
    assert merged.main_phase.loop_ns == expected.main_phase.loop_ns
    assert merged.main_phase.steps == 3  # 2 + 1: each epoch's first step is reported apart


def test_memory_does_not_grow_with_the_number_of_blocks() -> None:
    sw = Stopwatch()
    sw.enable()
    block = sw.timed("stage")
    for _ in range(5000):  # reach steady state: node, buffers and window exist
        with block:
            pass
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for _ in range(250_000):  # any object kept per block (16 bytes at least) would hold 4 MB
        with block:
            pass
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    growth = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert sw.summary().stages["stage"].calls == 255_000
    assert growth < 1024 * 1024, f"heap grew by {growth} bytes"


@given(st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 10**12)), min_size=1, max_size=30))
def test_samples_read_together_keep_exact_totals_and_a_consistent_spread(batches: list[tuple[int, int]]) -> None:
    stats = RunningStats(window=8)
    for samples, total in batches:
        stats.add_samples(samples, total)
    assert stats.calls == sum(samples for samples, _ in batches)
    assert stats.total_ns == sum(total for _, total in batches)
    assert stats.sumsq_ns * stats.calls >= stats.total_ns**2  # never a negative variance
    assert stats.min_ns is not None and stats.max_ns is not None
    assert stats.min_ns * stats.calls <= stats.total_ns <= stats.max_ns * stats.calls
    assert list(stats.recent) == [total // samples for samples, total in batches][-8:]  # a mean per batch
    check_stats(stats.to_dict(), "stats")  # what a saved run's schema accepts
    stage = StageStats.from_running("loader/dataset", stats)
    assert stage.mean == pytest.approx(stats.total_ns / stats.calls / 1e9)
    assert stage.std >= 0


@given(
    st.lists(st.tuples(st.integers(-2, 4096), st.integers(0, 10**15)), max_size=40),
    st.lists(st.tuples(st.integers(1, 64), st.integers(0, 10**9)), max_size=5),
)
def test_batches_folded_together_are_what_each_folded_alone_would_be(
    batches: list[tuple[int, int]], before: list[tuple[int, int]]
) -> None:
    """The fold of a buffer of batches against the formulas of one batch at a time (ceil of total^2 / calls,
    the mean rounded down and up), after some batches already folded; batches of no samples are skipped."""
    together = RunningStats(window=16)
    together.add_sample_batches(before)
    together.add_sample_batches(batches)
    calls = total = sumsq = 0
    low: int | None = None
    high: int | None = None
    recent: list[int] = []
    for samples, total_ns in before + batches:
        if samples <= 0:
            continue
        calls, total = calls + samples, total + total_ns
        sumsq += -(-total_ns * total_ns // samples)
        mean_low, mean_high = total_ns // samples, -(-total_ns // samples)
        low = mean_low if low is None else min(low, mean_low)
        high = mean_high if high is None else max(high, mean_high)
        recent.append(mean_low)
    assert (together.calls, together.total_ns, together.sumsq_ns) == (calls, total, sumsq)
    assert (together.min_ns, together.max_ns) == (low, high)
    assert list(together.recent) == recent[-16:]


@given(
    st.lists(
        st.one_of(
            st.integers(-(2**53) + 1, 2**53 - 1),
            st.integers(0, 10**7),
            st.sampled_from([2**53, -(2**53), 2**63, 10**30, -1, 0]),
        ),
        max_size=40,
    ),
    st.lists(st.integers(0, 10**9), max_size=5),
)
def test_a_buffer_folds_as_the_builtins_fold_it(durations: list[int], before: list[int]) -> None:
    """The buffer's fold (in one pass in C where compiled: ``_fold.c``) against the builtins' loops, exactly:
    its totals, extremes and window, after measurements already folded; values of 2**53 or more, which the C
    fold leaves to Python, among them."""
    stats = RunningStats(window=8)
    stats.add_batch(list(before))
    stats.add_batch(list(durations))
    everything = before + durations
    if fold_durations is not None and durations:
        folded = fold_durations(list(durations))
        exact = all(abs(value) < 2**53 for value in durations)
        assert folded == (python_fold_durations(durations) if exact else None)
    assert (stats.calls, stats.total_ns) == (len(everything), sum(everything))
    assert stats.sumsq_ns == sum(value * value for value in everything)
    assert (stats.min_ns, stats.max_ns) == ((min(everything), max(everything)) if everything else (None, None))
    assert list(stats.recent) == everything[-8:]


def test_the_fold_of_a_long_buffer_and_of_what_is_not_a_list() -> None:
    """Sums past 64 bits stay exact (a square of 2**53 - 1, many times); a tuple or a list of floats folds
    through the builtins."""
    assert (fold_durations is not None) == COMPILED  # the C fold is in use wherever the blocks are compiled
    big = [2**53 - 1] * 3000
    stats = RunningStats()
    stats.add_batch(big)
    assert (stats.total_ns, stats.sumsq_ns) == (3000 * (2**53 - 1), 3000 * (2**53 - 1) ** 2)
    if fold_durations is not None:
        assert fold_durations(big) == python_fold_durations(big)
        assert fold_durations([1, 2.0]) is None and fold_durations((1, 2)) is None  # type: ignore[arg-type]
        assert fold_durations([-(2**53) + 1]) == (-(2**53) + 1, (2**53 - 1) ** 2, -(2**53) + 1, -(2**53) + 1)
    stats.add_batch((5, 7))
    assert (stats.calls, stats.min_ns, stats.max_ns) == (3002, 5, 2**53 - 1)


def pairwise_overlap(spans: list[list[int]], intervals: list[list[int]], now: int) -> int:
    """What ``LoopTimes.overlap_ns`` must equal: every span against every interval."""
    return sum(max(min(last, end or now) - max(first, start), 0) for first, last in spans for start, end in intervals)


moments = st.integers(min_value=1, max_value=10_000)


@given(
    spans=st.lists(st.lists(moments, min_size=2, max_size=2), max_size=12),
    intervals=st.lists(
        st.tuples(moments, st.integers(min_value=0, max_value=10_000)).map(list), max_size=12
    ),  # end 0: a loop still running; others may end before they start, overlap or nest
    now=moments,
)
def test_worker_wall_time_inside_loops_equals_every_pair_summed(
    spans: list[list[int]], intervals: list[list[int]], now: int
) -> None:
    assert LoopTimes(intervals, now).overlap_ns(spans) == pairwise_overlap(spans, intervals, now)


def test_worker_wall_time_of_many_epochs_of_restarting_workers() -> None:
    # an epoch's loop and, inside it, one process of a worker that restarts each epoch; the last loop still runs
    intervals = [[1_500 * epoch, 1_500 * epoch + 1_000] for epoch in range(2_000)]
    intervals[-1][1] = 0
    spans = [[1_500 * epoch + 10, 1_500 * epoch + 990] for epoch in range(2_000)]
    assert LoopTimes(intervals, now=10**9).overlap_ns(spans) == 2_000 * 980
