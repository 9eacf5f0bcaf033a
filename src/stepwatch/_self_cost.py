"""stepwatch's own cost, in every report: the blocks it timed in the main process (a stage's calls: loader waits,
steps, timed and auto-instrumented blocks) times the cost of one block, calibrated once in this process.

The calibration (a few milliseconds, at the first ``enable()``) times blocks of a private stopwatch around a small
matrix product (torch's, when the program imported it; else a copy of 64 KiB) against the same loop without
them: in a real step a block runs with its caches emptied by the step's own work, which makes it cost
several times its tight-loop figure (measured with Valgrind's cache simulation, ``benchmarks/in_situ.py``); a
tight loop would understate it. Better still, once the training has run a few steps, stepwatch's own step
boundary is timed in place on each of its next steps (:class:`InSitu`), and their median is the figure. Reads
the summary only for the estimate; the cost per operation is kept in the run's metadata (``block_ns``),
so a saved run says it again.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ._constants import FIRST_BATCH, FIRST_STEP, OTHER

if TYPE_CHECKING:
    from ._recorder import Stopwatch
    from ._summary import Summary

ROUNDS = 9
BLOCKS_PER_ROUND = 100
SCRATCH = 64 * 1024

_calibrated: float | None = None
_calibrating = False


STEP_ROWS = ("step", FIRST_STEP)
"""The rows whose children auto-instrumentation's wrappers open (forward, loss, backward, optimizer, ...)."""
PIPELINE_ROWS = ("dataset", "dataset_batch", "collate")
"""The rows ``watch()``'s wrappers of a dataset's ``__getitems__`` and a ``collate_fn`` time, one call a batch."""
LOADER_ROWS = ("loader", FIRST_BATCH)
"""The rows of a loop's batch waits: one a batch, each carrying its worker's report when workers run."""

PATCHED_IN_C_WEIGHT = 0.2
"""A patched call whose wrapper runs in C (``_auto_calls.c``), in operations, beyond the block it opens (counted
among the blocks): it does what a hand-written ``with timed(...)`` does around its block, and a fifth of a
block more (Valgrind: about 5.6k instructions a wrapped call and its block, against 4.7k a hand-written block)."""

BLOCK_IN_C_WEIGHT = 0.3
"""A timed block whose entry and exit ran in C (``metadata.blocks_in_c``), and a step whose steady boundary did
(``_boundary.c``, ``_steady.c``: its loop's two frames swapped in C), in operations. The operation's cost is measured on
stepwatch's step boundary where it runs in Python (the steps that measure it take the general path), and the C
one costs a fraction of it in the same place (in ``benchmarks/auto.py``'s step: five blocks 8.3 us a step,
1.7 us each, against a boundary of 6.2 us: 0.27). A ``dataset`` row's reads count as one operation a batch,
and its wrapper as a patched call, unless the run's single-process reads and collate ran in C
(``metadata.reads_in_c``: the default stopwatch's, ``_fetch.c``), where the reads are a block in C and the
two wrappers patched calls in C: together about a block's in-place cost (in ``auto.py``'s step the fetch took
3.5 us more than torch's, bracketed, against 4 us an operation)."""

IN_C_AT_A_BLOCK = ("blocks in C", "steps in C", "count() calls in C")
"""The kinds of operation weighed at :data:`BLOCK_IN_C_WEIGHT`: a ``count()`` in C (``_counter.c``, ``_counts.c``)
does about what a block's entry does (in a tight loop 127 ns against a block's 162)."""

PYTHON_ROWS = ("dataset",)
"""The rows counted as frames opened and closed in Python where the reads did not run in C (see above)."""

IN_SITU = 24
"""Blocks timed between the training's own steps (one a step, from the third) for the in-situ cost."""


def block_ns() -> float | None:
    """What one timed block costs in this process, in nanoseconds (None before :func:`calibrate` ran)."""
    return _calibrated


def calibrating() -> bool:
    """Whether a private stopwatch of this module is being enabled (it measures nothing of itself)."""
    return _calibrating


class InSitu:
    """The cost of an operation where the training's operations run, on :data:`IN_SITU` steps from the third:
    what stepwatch's own step boundary took in place (``boundaries``: from the loop resuming after the program's
    step, its caches left as the program's work left them, to the boundary's work done). A stopwatch on a clock
    of its own has no boundary measured on the real one: there, one block of a private stopwatch is timed
    between two steps instead (``samples``; where stepwatch's own code has just run, warmer, it reads about half
    as much). Their median replaces the calibrated figure once there are five."""

    def __init__(self, sw: Stopwatch, make: Callable[[], Stopwatch]) -> None:
        self.boundaries: list[int] = []
        self.samples: list[int] = []
        self._sw = sw
        self._make = make
        self._private: Stopwatch | None = None
        self.remove = sw.periodic.add(1, self.tick, "stepwatch's own cost")

    def tick(self, step: int) -> None:
        arrived = time.perf_counter_ns()
        taken = self.boundaries if self._sw.clock is time.perf_counter_ns else self.samples
        if step < 3 or len(taken) >= IN_SITU:
            return  # the first steps warm up what they run
        if taken is self.boundaries:
            taken.append(arrived - self._sw.periodic.resumed_ns)
        else:
            taken.append(self._block_between_steps())
        if len(taken) >= IN_SITU:
            self.remove()

    def _block_between_steps(self) -> int:
        global _calibrating
        if self._private is None:
            _calibrating = True
            try:
                self._private = self._make()
                self._private.enable()
            finally:
                _calibrating = False
        timed = self._private.timed
        clock = time.perf_counter_ns
        start = clock()
        with timed("in situ"):
            pass
        return clock() - start

    @property
    def value(self) -> float | None:
        taken = self.boundaries or self.samples
        return float(statistics.median(taken)) if len(taken) >= 5 else None


def calibrate(stopwatch: Callable[[], Stopwatch]) -> None:
    """Measures the cost of a block once in this process (``stopwatch`` makes the private stopwatch it times;
    the calibration's own ``enable()`` does not measure again)."""
    global _calibrated, _calibrating
    if _calibrated is not None or _calibrating:
        return
    _calibrating = True
    try:
        _calibrated = _calibrate(stopwatch())
    finally:
        _calibrating = False


def _calibrate(sw: Stopwatch) -> float:
    sw.enable()
    timed = sw.timed
    clock = time.perf_counter_ns
    work = _step_work()

    def rounds(with_blocks: bool) -> int:
        start = clock()
        if with_blocks:
            for _ in range(BLOCKS_PER_ROUND):
                with timed("calibration"):
                    work()  # what runs in a block of a real step: other code and data through the caches
        else:
            for _ in range(BLOCKS_PER_ROUND):
                work()  # the program without stepwatch has no block at all
        return clock() - start

    differences = []
    for _ in range(ROUNDS):
        plain, blocks = rounds(False), rounds(True)
        differences.append((blocks - plain) / BLOCKS_PER_ROUND)
    sw.disable()
    return max(statistics.median(differences), 1.0)


def _step_work() -> Callable[[], object]:
    """A step's work in miniature: a small matrix product when torch is already imported (its kernels and
    dispatcher evict what a block keeps in the caches, as a training step does), else a copy of 64 KiB."""
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "randn"):
        matrix = torch.randn(8, 8)
        return lambda: matrix @ matrix
    source = bytearray(SCRATCH)
    return lambda: bytes(source)


def blocks_timed(summary: Summary) -> int:
    """The blocks the main process timed: every stage's calls, but the computed ``other`` rows, what DataLoader
    workers timed (their time is not the training loop's), and a ``dataset`` row's per-sample calls: its samples
    are read under one block per batch, as many as its parent's calls."""
    counts = operations(summary)
    return counts["blocks"] + counts["blocks in C"]


def operations(summary: Summary) -> dict[str, int]:
    """What stepwatch did in the main process, by kind: ``blocks`` (:func:`blocks_timed`); ``steps``, each
    step's boundary (ending one step, starting the next wait: the schedule, periodic calls, the window); ``patched
    calls``, auto-instrumentation's wrappers and hooks (each block it opened inside a step, the optimizer's
    second hook, and its loop around each batch, which counts the batch's samples) and ``watch()``'s wrappers of
    a dataset's reads and a collate function that run in the main process (one a batch each); ``worker
    reports``, one a batch from DataLoader workers, unpacked and merged; ``count() calls`` that added to the
    counters (auto's sample count among them). Where auto's wrappers ran in C (``metadata.auto_in_c``), the
    calls of theirs that open a block and its loop around each batch (``AutoSteps``, built with them) are
    ``patched calls in C``, which :func:`own_share` weighs at :data:`PATCHED_IN_C_WEIGHT`; where the blocks ran
    in C (``metadata.blocks_in_c``), those but the reads' own rows are ``blocks in C``, the steps ``steps in
    C`` and the counts ``count() calls in C`` (built with them), weighed at :data:`BLOCK_IN_C_WEIGHT`; where the
    single-process reads and collate ran in C too (``metadata.reads_in_c``), the reads' rows are ``blocks in C``
    and ``watch()``'s two wrappers ``patched calls in C`` (but that of a dataset reading its own batches, in
    Python)."""
    kinds = (
        "blocks",
        "blocks in C",
        "steps",
        "steps in C",
        "patched calls",
        "patched calls in C",
        "worker reports",
        "count() calls",
        "count() calls in C",
    )
    counts = dict.fromkeys(kinds, 0)
    auto = summary.metadata.get("auto") is not None
    wrappers = "patched calls in C" if summary.metadata.get("auto_in_c") is True else "patched calls"
    compiled = summary.metadata.get("blocks_in_c") is True
    reads_in_c = compiled and summary.metadata.get("reads_in_c") is True
    in_python = () if reads_in_c else PYTHON_ROWS
    pipeline = "patched calls in C" if reads_in_c else "patched calls"
    for phase in summary.phases.values():
        counts["steps in C" if compiled else "steps"] += phase.steps
        counts["count() calls in C" if compiled else "count() calls"] += phase.count_calls
        from_workers = False
        for path, stage in phase.stages.items():
            parent, _, name = path.rpartition("/")
            if stage.in_workers:
                from_workers = True
                continue
            if name == OTHER:
                continue
            blocks = "blocks in C" if compiled and name not in in_python else "blocks"
            if name == "dataset" and parent in phase.stages:
                counts[blocks] += min(stage.calls, phase.stages[parent].calls)
            else:
                counts[blocks] += stage.calls
            if auto and parent in STEP_ROWS:
                counts[wrappers] += stage.calls * (2 if name == "optimizer" else 1)
            elif name in PIPELINE_ROWS and parent in LOADER_ROWS:  # watch()'s wrapper of the dataset, the collate
                wrapper = "patched calls" if name == "dataset_batch" else pipeline  # (its own reads: Python's)
                counts[wrapper] += min(stage.calls, phase.stages[parent].calls)
        batches = sum(phase.stages[row].calls for row in LOADER_ROWS if row in phase.stages)
        if auto:  # auto's loop around watch(): each batch passes through it (AutoSteps: built with its wrappers)
            counts[wrappers] += batches
        if from_workers:
            counts["worker reports"] += batches
    return counts


def own_share(summary: Summary, counts: dict[str, int] | None = None) -> float | None:
    """The estimate as a share of the measured time, or None without a calibrated cost or a measured time
    (``counts``: the run's :func:`operations`, when the caller has them already)."""
    cost = summary.metadata.get("block_ns")
    measured = sum(phase.measured_ns for phase in summary.phases.values())
    if not isinstance(cost, (int, float)) or isinstance(cost, bool) or not measured:
        return None
    counts = counts or operations(summary)
    weighed = (
        sum(counts.values())
        - (1 - PATCHED_IN_C_WEIGHT) * counts.get("patched calls in C", 0)
        - (1 - BLOCK_IN_C_WEIGHT) * sum(counts.get(kind, 0) for kind in IN_C_AT_A_BLOCK)
    )
    return weighed * cost / measured


def own_cost(summary: Summary) -> str | None:
    """The report's last line: ``stepwatch's own cost: about 0.3% of the measured time (...)``."""
    counts = operations(summary)
    share = own_share(summary, counts)
    if share is None:
        return None
    kinds = ", ".join(f"{count:,} {kind}" for kind, count in counts.items() if count)
    weights = [
        f"a {one} at {weight:.0%} of that"
        for weighed, one, weight in (
            (sum(counts[kind] for kind in IN_C_AT_A_BLOCK), "block, step or count in C", BLOCK_IN_C_WEIGHT),
            (counts["patched calls in C"], "patched call in C", PATCHED_IN_C_WEIGHT),
        )
        if weighed
    ]
    in_c = "".join(f", {weight}" for weight in weights)
    return (
        f"stepwatch's own cost: about {share:.1%} of the measured time ({kinds}, at ~"
        f"{summary.metadata['block_ns'] / 1e3:.1f} us each{in_c}, measured in this process)"
    )
