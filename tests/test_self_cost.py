"""stepwatch's own cost in every report: the blocks it timed, at a cost per block calibrated in this process;
the estimate checked against a direct on/off measurement of blocks around the same kind of work."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

import stepwatch
from stepwatch import Stopwatch
from stepwatch._self_cost import block_ns, blocks_timed, own_share

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
    assert cost == sw.in_situ.value and 0 < cost < MS
    assert block_ns() is not None
    # loader and step of each of 11 steps (the first apart, as first_batch and first_step) and their two blocks
    assert blocks_timed(summary) == 11 * 4
    measured = sum(phase.measured_ns for phase in summary.phases.values())
    share = 44 * cost / measured
    assert own_share(summary) == share
    last = stepwatch.render(summary).rstrip().splitlines()[-1]
    assert last == (
        f"stepwatch's own cost: about {share:.1%} of the measured time (44 blocks timed at ~{cost / 1e3:.1f} us each,"
        " measured in this process)"
    )
    sw.save(tmp_path / "run.json")
    assert stepwatch.render(stepwatch.load(tmp_path / "run.json")).rstrip().splitlines()[-1] == last


def test_the_calibrated_cost_is_within_a_factor_of_two_of_blocks_measured_on_and_off() -> None:
    """Blocks around a small matrix product, the calibration's kind of work: the cost per block measured directly
    (the same loop with stepwatch on and off, paired, medians) against the calibrated figure."""
    torch.set_num_threads(1)
    matrix = torch.randn(8, 8)

    def loop(sw: Stopwatch | None, blocks: int = 2000) -> int:
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
    loop(sw), loop(None)
    direct = statistics.median((loop(sw) - loop(None)) / 2000 for _ in range(9))
    calibrated = block_ns()
    assert calibrated is not None
    assert direct / 2 <= calibrated <= direct * 2, (direct, calibrated)
