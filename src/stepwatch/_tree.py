"""The recording's data: a tree of stage nodes per phase, the frames of open blocks, and worker totals.

A stage node holds a buffer of raw durations and exact running statistics; the buffer is folded into the
statistics every ``FOLD`` measurements. Open blocks live on a per-thread stack of ``(owner, node, start_ns)``
frames. A frame whose measurement must not count (its block was open when the stopwatch was switched off or
reset, or it overlapped another block out of order) points at :data:`DROPPED`, a node that forgets what it is
given, so dropping costs the hot path nothing.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from ._constants import DEFAULT_PHASE, FOLD, MAX_STAGES, OVERFLOW
from ._dataloader.in_workers import WorkerReport
from ._figures import StageStats, WorkerStats
from ._stats import Partial, RunningStats, partial_of

LOOP = object()
"""Owner of a timed iterator's wait or body frame."""

Frame = tuple[Any, "Node", int]
"""An open block on a thread's stack: (owner, stage node, start in ns). The owner is the timed block,
:data:`LOOP` for a timed iterator's wait or body, or None for a phase root."""


class Node:
    """One stage in the hierarchy of one phase: its buffers, statistics and children by name."""

    __slots__ = (
        "batches",
        "buf",
        "children",
        "device_buf",
        "device_stats",
        "in_workers",
        "path",
        "peak_allocated",
        "peak_reserved",
        "stats",
    )

    def __init__(self, path: str, window: int) -> None:
        self.path = path
        self.children: dict[str, Node] = {}
        self.buf: list[int] = []
        self.batches: list[tuple[int, int]] = []  # (calls, total ns) of calls timed together: a batch's reads
        self.stats = RunningStats(window=window)
        self.device_buf: list[int] = []
        self.device_stats = RunningStats(window=window)
        self.peak_allocated = -1  # bytes; -1: never measured on a device
        self.peak_reserved = -1
        self.in_workers = False  # measured in DataLoader worker processes, not inside its parent's time

    def child_path(self, name: str) -> str:
        return f"{self.path}/{name}" if self.path else name

    def clear(self) -> None:
        """Forgets every measurement below and at this node; the nodes stay, so open frames stay valid."""
        self.buf.clear()
        self.batches.clear()
        self.device_buf.clear()
        self.stats.clear()
        self.device_stats.clear()
        self.peak_allocated = self.peak_reserved = -1
        self.in_workers = False  # set again by the next worker report; a run without workers has none
        for child in self.children.values():
            child.clear()


class _AlwaysFull(list[int]):
    """The buffer of :data:`DROPPED`: it always reads as full, so every dropped block's exit calls the
    stopwatch's fold, which forgets it and notices when the last dropped block has closed."""

    def __len__(self) -> int:
        return FOLD


class _Sink(dict[str, Node]):
    """Children of :data:`DROPPED`: every name is DROPPED again, so blocks opened under a dropped one drop."""

    def get(self, key: str, default: Any = None) -> Node:
        return DROPPED


DROPPED = Node("<dropped>", 1)
DROPPED.children = _Sink()
DROPPED.buf = _AlwaysFull()


class Phase:
    """Recording state of one phase (``train``, ``val``, ...)."""

    __slots__ = (
        "batch_samples",
        "consuming",
        "count_calls",
        "counters",
        "counting",
        "device_busy_ns",
        "device_caught_up",
        "device_idle_ns",
        "device_steps",
        "in_first_step",
        "loop_ns",
        "name",
        "root",
        "schedule_pos",
        "steps",
        "workers",
    )

    def __init__(self, name: str, window: int) -> None:
        self.name = name
        self.root = Node("", window)
        self.workers: dict[int, WorkerTotals] = {}
        self.counters: dict[str, float] = {}
        self.counting = 0  # Python writers of the counters now (under the count lock): C's writer then takes it
        self.clear()

    def clear(self) -> None:
        self.root.clear()
        self.counters = {}
        # the samples that watch() and auto() counted from the batches, apart from the program's own counters; None
        # once the program counts samples itself, which replaces theirs from then on (see counted())
        self.batch_samples: int | None = 0
        self.count_calls = 0  # count() calls that added to the counters: stepwatch's own cost counts them
        self.loop_ns = 0
        self.steps = 0
        self.schedule_pos = 0
        self.device_busy_ns = 0
        self.device_idle_ns = 0
        self.device_steps = 0
        self.device_caught_up = 0
        self.workers = {}
        # [start, end] (end 0: still running) of each watch() loop, on CLOCK_MONOTONIC; a running one is kept
        # (its loop still ends it), counted from now
        running = [interval for interval in getattr(self, "consuming", []) if interval[1] == 0]
        for interval in running:
            interval[0] = time.perf_counter_ns()
        self.consuming: list[list[int]] = running
        self.in_first_step = False  # counts made now belong to the one-off first step: not counted

    def counted(self) -> dict[str, float]:
        """The counters as reported: the program's own, with the samples counted from the batches added to its
        ``samples`` (the batches' count, where the program counts none; saturating as a counter does)."""
        counters = self.counters
        batches = self.batch_samples
        if not batches:
            return counters
        merged = {"samples": min(counters.get("samples", 0) + batches, sys.float_info.max)}  # first, as counted
        merged.update((unit, value) for unit, value in counters.items() if unit != "samples")
        return merged

    def move_into(self, target: Phase) -> None:
        """Hands everything recorded here to ``target``, which holds nothing; this phase is left empty, its
        root node the same object (threads' stacks stand on it)."""
        target.root.children, self.root.children = self.root.children, {}
        for name in _RECORDED:
            setattr(target, name, getattr(self, name))
        self.clear()


_RECORDED = (
    "batch_samples",
    "count_calls",
    "counters",
    "consuming",
    "device_busy_ns",
    "device_caught_up",
    "device_idle_ns",
    "device_steps",
    "loop_ns",
    "schedule_pos",
    "steps",
    "workers",
)


class StageTree:
    """The recorded stages of every phase, owned by one :class:`~stepwatch.Stopwatch`: the phases by name,
    which root is which phase, and the count of stages against :data:`MAX_STAGES` (past it, new names go to
    the parent's overflow row, warned about once). ``phases`` is only ever mutated, never rebound: the recorder
    keeps it as a handle for ``count()``'s hot path. ``lock`` guards the tree and the threads' stacks;
    ``count_lock``, the phases' counters."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.lock = threading.RLock()
        self.count_lock = threading.Lock()
        self.phases: dict[str, Phase] = {}
        self.phase_of_root: dict[Node, str] = {}
        self.node_count = 0
        self.overflow_warned = False
        self.loader_configs: dict[str, dict[str, Any]] = {}  # phase -> its DataLoader's configuration (advice)
        self.looped: dict[str, None] = {}  # the phases that ran an outermost loop, in order

    def start_afresh(self) -> None:
        """In a forked DataLoader worker: new locks (a parent's thread may have held them at the fork), and no
        phase keeps what the parent recorded."""
        self.lock = threading.RLock()
        self.count_lock = threading.Lock()
        for phase in self.phases.values():
            phase.clear()

    def is_main(self, phase: str) -> bool:
        """Notes that ``phase`` runs an outermost loop; whether it is the run's main phase, the one warm-up
        applies to: ``train``, or in a run without it, the first phase that ran a loop."""
        looped = self.looped
        looped.setdefault(phase, None)
        return phase == (DEFAULT_PHASE if DEFAULT_PHASE in looped else next(iter(looped)))

    def rename(self, old: str, new: str) -> None:
        """Files what phase ``old`` recorded, and what is known of it, under ``new``. The phase under the old
        name stays, empty: threads' stacks stand on its root."""
        with self.lock:
            self.phases[old].move_into(self.phase(new))
            if old in self.loader_configs:
                self.loader_configs[new] = self.loader_configs.pop(old)
            if old in self.looped:
                self.looped = {new if name == old else name: None for name in self.looped}

    def phase(self, name: str) -> Phase:
        """The phase ``name``, made on first use."""
        phase = self.phases.get(name)
        if phase is None:
            with self.lock:
                phase = self.phases.get(name)
                if phase is None:
                    phase = self.phases[name] = Phase(name, self.window)
                    self.phase_of_root[phase.root] = name
        return phase

    def add_child(self, parent: Node, name: str) -> Node:
        """A new stage under ``parent``; past :data:`MAX_STAGES` stages, the parent's overflow row."""
        with self.lock:
            node = parent.children.get(name)
            if node is None:
                if self.node_count >= MAX_STAGES and name != OVERFLOW:
                    self.warn_overflow(name)
                    name = OVERFLOW
                    node = parent.children.get(name)
                if node is None:
                    node = parent.children[name] = Node(parent.child_path(name), self.window)
                    self.node_count += 1
            return node

    def warn_overflow(self, name: str) -> None:
        if not self.overflow_warned:
            self.overflow_warned = True
            logging.getLogger("stepwatch").warning(
                "stepwatch: more than %s distinct stages (the latest: %r); new ones are folded into one %r row."
                " Use a fixed set of names: put varying parts (batch numbers, ids) in counters, not in names",
                f"{MAX_STAGES:,}",
                name,
                OVERFLOW,
            )


class WorkerTotals:
    """What the batches from one DataLoader worker id told the main process, across its restarts."""

    __slots__ = ("batches", "busy_ns", "cpu_ns", "queued_ns", "spans", "wait_ns", "wall_before_ns")

    def __init__(self) -> None:
        self.batches = 0
        self.busy_ns = 0
        self.cpu_ns = 0  # the worker's CPU time on its batches; -1 once a part of it is unknown (a resumed run)
        self.queued_ns = 0  # its time waiting for a core on its batches; -1 once a part of it is unknown
        self.wait_ns = 0
        self.spans: dict[int, list[int]] = {}  # pid -> [started_ns, last_ready_ns]
        self.wall_before_ns = 0  # carried over from a resumed run

    def add(self, report: WorkerReport, received_ns: int) -> None:
        _, pid, started, busy, ready = report[:5]
        self.batches += 1
        self.busy_ns += busy
        if self.cpu_ns >= 0:
            self.cpu_ns += report[6]
        queued = report[7]
        self.queued_ns = self.queued_ns + queued if self.queued_ns >= 0 and queued >= 0 else -1
        self.wait_ns += max(received_ns - ready, 0)
        span = self.spans.get(pid)
        if span is None:  # from its first counted batch's start: start-up and uncounted batches are not idle
            self.spans[pid] = [max(started, ready - busy), ready]
        elif ready > span[1]:
            span[1] = ready

    def stats(self, worker_id: int, loops: LoopTimes) -> WorkerStats:
        """Its figures; its wall time counts only while a loop consumed its loader (``loops``), so the time
        persistent workers sit idle during a validation pass between epochs is not idleness."""
        wall = self.wall_before_ns + loops.overlap_ns(self.spans.values())
        return WorkerStats(worker_id, self.batches, self.busy_ns, wall, self.wait_ns, self.cpu_ns, self.queued_ns)


class LoopTimes:
    """A phase's loops over their loaders (``[start, end]``, end 0: still running, until ``now``), ordered once
    for every worker's wall time. A worker's spans (one per process it ran in) and the loops both grow by one an
    epoch; summing every pair made a summary of a long run (each ``metrics()`` of a ``log_every`` logger, on the
    training thread) cost its epochs squared: 1,000 epochs of 8 restarting workers, 3.8 s. Each span visits only
    the loops that can reach it: those starting before its end, latest first, until none of the earlier ones
    ends after its start."""

    __slots__ = ("_ordered", "_reach", "_starts")

    def __init__(self, intervals: list[list[int]], now: int) -> None:
        self._ordered = sorted((start, end or now) for start, end in intervals)
        self._starts = [start for start, _ in self._ordered]
        self._reach = list(itertools.accumulate((end for _, end in self._ordered), max))  # latest end of the first i+1

    def overlap_ns(self, spans: Iterable[list[int]]) -> int:
        """The time each of ``spans`` (``[first, last]``) spent inside each loop, summed over every pair."""
        ordered, reach = self._ordered, self._reach
        total = 0
        for first, last in spans:
            index = bisect.bisect_left(self._starts, last) - 1
            while index >= 0 and reach[index] > first:
                start, end = ordered[index]
                total += max(min(last, end) - max(first, start), 0)
                index -= 1
        return total


def fold(node: Node) -> None:
    """Folds a node's buffered measurements into its statistics (callers hold the stopwatch's lock)."""
    if node is DROPPED:
        list.clear(node.buf)
        node.device_buf.clear()
        return
    if node.batches:
        batches = node.batches
        count = len(batches)
        node.stats.add_sample_batches(batches[:count])
        del batches[:count]
    for buf, stats in ((node.buf, node.stats), (node.device_buf, node.device_stats)):
        count = len(buf)
        chunk = buf[:count]
        del buf[:count]  # appends racing with this land after ``count`` and stay
        stats.add_batch(chunk)


def collect(node: Node, out: dict[str, StageStats]) -> None:
    """Adds ``node``'s recorded descendants to ``out``, depth first, each parent before its children and
    ``<parent>/other`` (derived from the totals) after them."""
    for child in node.children.values():
        if child.buf or child.device_buf or child.batches:
            fold(child)
        below: dict[str, StageStats] = {}
        collect(child, below)
        if child.stats.calls == 0 and not below:
            continue
        parent = StageStats.from_running(child.path, child.stats)
        if child.in_workers:
            parent = replace(parent, in_workers=True)
        if child.device_stats.calls or child.peak_allocated >= 0:
            parent = parent.with_device(
                StageStats.from_running(child.path, child.device_stats) if child.device_stats.calls else None,
                child.peak_allocated if child.peak_allocated >= 0 else None,
                child.peak_reserved if child.peak_reserved >= 0 else None,
            )
        out[child.path] = parent
        out.update(below)
        direct = [
            below[grandchild.path]
            for grandchild in child.children.values()
            # time measured in workers ran beside a main-process parent, not inside it
            if grandchild.path in below and grandchild.in_workers == child.in_workers
        ]
        if direct and parent.calls:
            other = StageStats.uncovered(parent, direct)
            out[other.path] = replace(other, in_workers=True) if child.in_workers else other


def take_from(node: Node, taken: dict[str, Partial]) -> None:
    """Folds each stage's measurements here (in the worker, beside the main process) and hands them over."""
    for child in node.children.values():
        stats = child.stats
        if child.batches:
            fold(child)
        if stats.calls:  # more than a fold's worth since the last batch
            stats.add_batch(child.buf)
            child.buf = []
            taken[child.path] = stats.partial()
            stats.clear()
        elif child.buf:
            taken[child.path] = partial_of(child.buf, stats.window)
            child.buf = []
        take_from(child, taken)


def pop_frame(stack: list[Any], frame: Any) -> bool:
    """Removes ``frame`` (and anything left above it) from ``stack``; False if it is no longer there."""
    for position in range(len(stack) - 1, 0, -1):
        if stack[position] is frame:
            del stack[position:]
            return True
    return False


def dropped_copy(frame: Any) -> Frame:
    """The frame of an open block whose measurement no longer counts: the same owner, so its exit still
    finds it, and :data:`DROPPED` as its node. Phase roots (owner None) are structure, kept as they are."""
    if frame[0] is None:
        return frame  # type: ignore[no-any-return]
    return (frame[0], DROPPED, 0)
