"""stepwatch's own cost in every report: what it did (blocks, step boundaries, patched calls, worker reports,
``count()`` calls), at a cost per operation calibrated in this process; the estimate checked against a direct
on/off measurement of blocks around the same kind of work (and, by hand, against ``benchmarks/auto.py`` and
``overhead.py``)."""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import stepwatch
from stepwatch import Stopwatch, Summary, _block_base
from stepwatch._self_cost import (
    BLOCK_IN_C_WEIGHT,
    IN_SITU,
    _calibrate,
    block_ns,
    blocks_timed,
    operations,
    own_share,
)

from .conftest import FakeClock

MS = 1_000_000


def test_the_report_ends_with_the_blocks_timed_at_the_calibrated_cost(tmp_path: Path) -> None:
    clock = FakeClock()
    sw = Stopwatch(clock=clock)
    sw.enable()
    for _ in sw.timed_iter(range(11)):
        with sw.timed("forward"):
            clock.advance(2 * MS)
        with sw.timed("backward"):
            clock.advance(3 * MS)
    summary = sw.summary()
    cost = summary.metadata["block_ns"]
    # measured between the training's own steps once it has five samples (after steps 3 to 11 here), else calibrated
    assert sw.in_situ is not None and len(sw.in_situ.samples) == 9
    assert not sw.in_situ.boundaries  # a clock of its own: the step boundary is not measured on the real one
    assert cost == sw.in_situ.value and 0 < cost < MS
    assert block_ns() is not None
    # loader and step of each of 11 steps (the first apart, as first_batch and first_step) and their two blocks
    assert blocks_timed(summary) == 11 * 4
    # and the boundaries of the 10 steps of the steady state (the first is a one-off)
    # where the blocks are compiled, the blocks and the loop's rows ran in C, and the steady step boundaries too:
    # weighed at BLOCK_IN_C_WEIGHT there
    in_c = summary.metadata["blocks_in_c"]
    assert in_c is _block_base.COMPILED
    assert operations(summary) == {
        "blocks": 0 if in_c else 44, "blocks in C": 44 if in_c else 0, "steps": 0 if in_c else 10,
        "steps in C": 10 if in_c else 0, "patched calls": 0, "patched calls in C": 0, "worker reports": 0,
        "count() calls": 0, "count() calls in C": 0,
    }  # fmt: skip
    measured = sum(phase.measured_ns for phase in summary.phases.values())
    share = (54 * BLOCK_IN_C_WEIGHT if in_c else 54) * cost / measured
    assert own_share(summary) == pytest.approx(share)
    last = stepwatch.render(summary).rstrip().splitlines()[-1]
    kinds = "44 blocks in C, 10 steps in C" if in_c else "44 blocks, 10 steps"
    weight = ", a block, step or count in C at 30% of that" if in_c else ""
    assert last == (
        f"stepwatch's own cost: about {share:.1%} of the measured time ({kinds}, at ~{cost / 1e3:.1f} us"
        f" each{weight}, measured in this process)"
    )
    pure = replace(summary, metadata={**summary.metadata, "blocks_in_c": False})  # saved by pure Python: all at 1
    assert operations(pure)["blocks"] == 44 and own_share(pure) == pytest.approx(54 * cost / measured)
    sw.save(tmp_path / "run.json")
    assert stepwatch.render(stepwatch.load(tmp_path / "run.json")).rstrip().splitlines()[-1] == last


def test_the_cost_of_an_operation_is_the_step_boundary_measured_in_place() -> None:
    """On the real clock, the figure is the median of what stepwatch's own step boundary took in place (from the
    loop resuming after the step to the boundary's work done), on 24 steps from the third; no private stopwatch
    is made to time blocks between steps (the fallback of a stopwatch on a clock of its own)."""
    sw = Stopwatch()
    sw.enable()
    for _ in sw.timed_iter(range(40)):
        busy_wait(0.0002)
    in_situ = sw.in_situ
    assert in_situ is not None and len(in_situ.boundaries) == IN_SITU
    assert not in_situ.samples and in_situ._private is None
    assert all(0 < sample < MS for sample in in_situ.boundaries)
    assert in_situ.value == statistics.median(in_situ.boundaries) == sw.summary().metadata["block_ns"]


def busy_wait(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_the_calibrated_cost_is_within_a_factor_of_two_of_blocks_measured_on_and_off() -> None:
    """Blocks around a small matrix product, the calibration's kind of work: the cost per block measured directly
    (the same loop with stepwatch on and off, paired, medians) against the calibration, taken in turn. Rounds
    as short as the calibration's, so that a round the scheduler pre-empts on a loaded machine is one of many,
    left out by the median, rather than in every round (a round of 2,000 blocks was, under two CPU hogs)."""
    torch.set_num_threads(1)
    matrix = torch.randn(8, 8)

    def loop(sw: Stopwatch | None, blocks: int = 100) -> int:
        start = time.perf_counter_ns()
        if sw is None:
            for _ in range(blocks):
                matrix @ matrix
        else:
            timed = sw.timed
            for _ in range(blocks):
                with timed("product"):
                    matrix @ matrix
        return time.perf_counter_ns() - start

    sw = Stopwatch()
    sw.enable()
    assert block_ns() is not None  # the process's own calibration ran at the first enable()
    loop(sw), loop(None)
    ratios = []  # each calibration against the direct cost measured just before it: this machine changes speed
    for _ in range(11):
        direct = statistics.median((loop(sw) - loop(None)) / 100 for _ in range(21))
        ratios.append(_calibrate(Stopwatch()) / direct)
    assert 0.5 <= statistics.median(ratios) <= 2, ratios


def loader(workers: int) -> DataLoader[tuple[torch.Tensor, ...]]:
    """Six batches of four samples."""
    return DataLoader(TensorDataset(torch.randn(24, 4), torch.randn(24, 1)), batch_size=4, num_workers=workers)


def test_the_pipeline_wrappers_in_the_main_process_and_the_worker_reports_are_counted() -> None:
    """Without workers, ``watch()``'s wrappers of the dataset and the collate run in the main process, once a batch
    each (the samples of a batch are read in one block); with a worker, each batch brings back one report."""
    for workers, expected in (
        (0, {"patched calls": 12, "worker reports": 0}),
        (1, {"patched calls": 0, "worker reports": 6}),
    ):
        sw = Stopwatch()
        sw.enable()
        for _ in sw.watch(loader(workers)):
            with sw.timed("forward"):
                pass
        counts = operations(sw.summary())
        assert {kind: counts[kind] for kind in expected} == expected, workers
        # loader and step of each batch, the forward, and in the main process the dataset's and collate's blocks
        assert counts["blocks"] + counts["blocks in C"] == 6 * (5 if workers == 0 else 3)
        assert counts["steps"] + counts["steps in C"] == 5
        # all but the per-sample reads in C where compiled (the loop's rows, the forward, the collate): a stopwatch
        # of its own reads in Python
        in_python = (6 if workers == 0 else 0) if _block_base.COMPILED else 6 * (5 if workers == 0 else 3)
        assert counts["blocks"] == in_python
        assert sw.summary().metadata["reads_in_c"] is False


def watched_by_default(data: DataLoader[Any], *blocks: str) -> Summary:
    """One epoch of ``data`` watched by the default stopwatch, ``blocks`` timed in each step: its summary, the
    default stopwatch left off and empty."""
    stepwatch.enable()
    try:
        for _ in stepwatch.watch(data):
            for name in blocks:
                with stepwatch.timed(name):
                    pass
        return stepwatch.summary()
    finally:
        stepwatch.disable()
        stepwatch.reset()


def test_the_default_stopwatchs_reads_and_collate_in_c_are_counted_as_such() -> None:
    """The default stopwatch's single-process reads and collate run in C where compiled (``_fetch.c``): the reads'
    rows are blocks in C, the two wrappers patched calls in C."""
    summary = watched_by_default(loader(0), "forward")
    counts = operations(summary)
    compiled = _block_base.COMPILED
    assert summary.metadata["reads_in_c"] is compiled
    assert counts["patched calls in C"] == (12 if compiled else 0) and counts["patched calls"] == (
        0 if compiled else 12
    )
    assert counts["blocks"] == (0 if compiled else 6 * 5) and counts["blocks in C"] == (6 * 5 if compiled else 0)
    python = operations(replace(summary, metadata={**summary.metadata, "reads_in_c": False}))
    assert python["patched calls"] == 12 and python["blocks"] == (6 if compiled else 6 * 5)


def test_a_dataset_reading_its_own_batches_is_counted_in_python_beside_the_collate_in_c() -> None:
    class Batched(TensorDataset):
        def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, ...]]:
            return [self[index] for index in indices]

    summary = watched_by_default(DataLoader(Batched(torch.randn(24, 4)), batch_size=4))
    counts = operations(summary)
    assert "loader/dataset_batch" in summary.stages
    if _block_base.COMPILED:  # its reads are Python's (TimedGetItems.read), the collate C's
        assert counts["patched calls"] == 6 and counts["patched calls in C"] == 6
    else:
        assert counts["patched calls"] == 12 and counts["patched calls in C"] == 0


def test_auto_instrumentations_patched_calls_are_counted(auto: None) -> None:
    """Each block auto-instrumentation opens in a step comes from a wrapper or a hook (the optimizer's two: before
    and after its step), and each batch passes through its loop around ``watch()``."""
    model, criterion = nn.Linear(4, 1), nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader(0):
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    summary = stepwatch.summary()
    counts = operations(summary)
    # forward, loss, backward, zero_grad once and the optimizer twice, over 6 steps, from wrappers in C where
    # they are built; dataset and collate wrappers; auto's loop, once a batch (in C with the wrappers)
    in_c = summary.metadata["auto_in_c"]
    assert in_c is _block_base.COMPILED is summary.metadata["reads_in_c"]  # the default stopwatch's reads
    assert counts["patched calls in C"] == (6 * 6 + 2 * 6 + 6 if in_c else 0)
    assert counts["patched calls"] == (0 if in_c else 6 + 6 * 6 + 2 * 6)
    # and the sample count of each step but the first (a one-off: neither its time nor its counts are measured),
    # in C where the blocks are
    assert counts["count() calls in C" if in_c else "count() calls"] == 5
    # a wrapper in C is weighed at a fifth of an operation beyond the block it opens (counted among the blocks)
    measured = sum(phase.measured_ns for phase in summary.phases.values())
    at_a_block = counts["blocks in C"] + counts["steps in C"] + counts["count() calls in C"]
    operations_weighed = sum(counts.values()) - (0.8 * 9 * 6 if in_c else 0) - 0.7 * at_a_block
    assert own_share(summary) == pytest.approx(operations_weighed * summary.metadata["block_ns"] / measured)
    last = stepwatch.render(summary).rstrip().splitlines()[-1]
    assert ("54 patched calls in C" in last and "a patched call in C at 20% of that" in last) is in_c, last
    pure = replace(summary, metadata={**summary.metadata, "auto_in_c": False, "reads_in_c": False})  # all at 1
    assert operations(pure)["patched calls"] == 2 * 6 + 6 + 6 * 6 and operations(pure)["patched calls in C"] == 0


def test_count_calls_are_counted_kept_and_resumed(tmp_path: Path) -> None:
    """Each ``count()`` that adds to the counters is one operation of stepwatch's own: counted per phase, in the
    report's last line, kept by a saved run and by a checkpoint's state; a count outside the measured steps is
    not."""
    clock = FakeClock()
    sw = Stopwatch(clock=clock)
    sw.count(samples=4)  # not measuring yet
    sw.enable()
    for _ in sw.timed_iter(range(6)):
        clock.advance(MS)
        sw.count(samples=4, tokens=64)
    for _ in sw.timed_iter(range(3), phase="val"):
        sw.count(samples=2)
    summary = sw.summary()
    assert summary.phases["train"].count_calls == 5 and summary.phases["val"].count_calls == 2
    in_c = "count() calls in C" if summary.metadata["blocks_in_c"] else "count() calls"  # (Counter, _counter.c)
    assert operations(summary)[in_c] == 7
    assert f"7 {in_c}" in stepwatch.render(summary).rstrip().splitlines()[-1]
    sw.save(tmp_path / "run.json")
    assert stepwatch.load(tmp_path / "run.json").phases["train"].count_calls == 5
    resumed = Stopwatch(clock=clock)
    resumed.load_state_dict(sw.state_dict())
    resumed.enable()
    for _ in resumed.timed_iter(range(3)):
        resumed.count(samples=4)
    assert resumed.summary().phases["train"].count_calls == 5 + 2
