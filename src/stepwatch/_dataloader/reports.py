"""The recording's side of DataLoader workers: a worker's own recording started, its measurements taken for
each batch's report, and the reports filed in the main process under the loader stage waiting for them.

The part of :class:`~stepwatch.Stopwatch` (its ``workers``) that the worker transport (``in_workers``, ``watch``)
calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from .._stats import Partial
from .._trace import Trace
from .._tree import DROPPED, Node, WorkerTotals, take_from
from .in_workers import WorkerReport

if TYPE_CHECKING:
    from .._recorder import Stopwatch


class WorkerSide:
    """The DataLoader workers' side of one :class:`~stepwatch.Stopwatch`: starting a worker's recording,
    taking its measurements, filing them in the main process. Owns ``nodes``: (loader node, worker path) ->
    the node a report's measurements are filed into, found once. ``keep_timeline`` is the stopwatch's own way
    to replace its timeline (its blocks are made again with it)."""

    def __init__(self, stopwatch: Stopwatch, keep_timeline: Callable[[Trace | None], None]) -> None:
        self.stopwatch = stopwatch
        self.keep_timeline = keep_timeline
        self.nodes: dict[tuple[Node, str], Node] = {}

    def start(self, trace: bool = False) -> None:
        """In a DataLoader worker: a clean, enabled recording that never autosaves. A forked worker inherits
        the parent's recording, stacks and locks (possibly held by a parent thread at the fork): all new. With
        ``trace``, its blocks' events ride on each batch's report to the main process's timeline."""
        sw = self.stopwatch
        sw.tree.start_afresh()
        sw.stacks.start_afresh()
        sw.loops.forget()
        sw.span.clear()
        self.nodes.clear()
        self.keep_timeline(Trace(1) if trace else None)
        sw.out = None
        sw.enable()

    def take(self) -> dict[str, Partial]:
        """In a worker: hands over every measurement recorded since the last call, and forgets it."""
        taken: dict[str, Partial] = {}
        tree = self.stopwatch.tree
        with tree.lock:
            for phase in tree.phases.values():
                take_from(phase.root, taken)
        return taken

    def consuming_interval(self) -> list[int]:
        """A watch() loop starts consuming its loader now, in the current thread's phase: [start, end]."""
        stacks = self.stopwatch.stacks
        stacks.thread_stack()
        phase = self.stopwatch.tree.phase(stacks.phase_name())
        interval = [time.perf_counter_ns(), 0]
        phase.consuming.append(interval)
        return interval

    def receive(self, report: WorkerReport, offset: int = 0) -> None:
        """In the main process: files a batch's worker measurements under the loader stage now waiting;
        ``offset`` keeps the workers of several watched loaders apart."""
        sw = self.stopwatch
        stacks = sw.stacks
        if not stacks.measuring:
            return
        received = time.perf_counter_ns()  # the workers' clock: CLOCK_MONOTONIC, shared by the host
        prefix = stacks.thread_stack()[-1][1]
        if prefix is DROPPED:
            return
        tree = sw.tree
        phase = tree.phase(stacks.phase_name())
        resolved = self.nodes
        timeline = sw.timeline
        with tree.lock:
            for path, partial in report[5].items():
                node = resolved.get((prefix, path))
                if node is None:
                    node = prefix
                    for part in path.split("/"):
                        node = node.children.get(part) or tree.add_child(node, part)
                        node.in_workers = True
                    resolved[(prefix, path)] = node
                node.stats.absorb(partial)
            worker_id = report[0] + offset
            if len(report) > 8 and timeline is not None:
                timeline.add_worker_events(worker_id, cast("Any", report)[8], prefix.path)
            totals = phase.workers.get(worker_id)
            if totals is None:
                totals = phase.workers[worker_id] = WorkerTotals()
            totals.add(report, received)
