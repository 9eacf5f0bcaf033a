"""The recording's side of DataLoader workers: a worker's own recording started, its measurements taken for
each batch's report, and the reports filed in the main process under the loader stage waiting for them.

The part of :class:`~stepwatch.Stopwatch` that the worker transport (``in_workers``, ``watch``) calls.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, cast

from .._constants import DEFAULT_PHASE
from .._stats import Partial
from .._trace import Trace
from .._tree import DROPPED, Node, StageTree, WorkerTotals, take_from
from .in_workers import WorkerReport

if TYPE_CHECKING:
    from .._blocks import Blocks
    from .._loops import OpenLoops
    from .._recorder import Stopwatch


class WorkerSide:
    """Starting a worker's recording, taking its measurements, receiving them: for ``Stopwatch``."""

    timeline: Trace | None
    _blocks: Blocks
    _lock: threading.RLock
    _count_lock: threading.Lock
    out: str | None
    _stacks: dict[int, Any]
    _before_switch: dict[int, Any]
    loops: OpenLoops
    _local: threading.local
    tree: StageTree
    _enabled: bool
    _measuring: bool | int
    _worker_nodes: dict[tuple[Node, str], Node]

    def _start_in_worker(self, trace: bool = False) -> None:
        """In a DataLoader worker: a clean, enabled recording that never autosaves. A forked worker inherits
        the parent's recording, stacks and locks (possibly held by a parent thread at the fork): all new. With
        ``trace``, its blocks' events ride on each batch's report to the main process's timeline."""
        self.timeline = Trace(1) if trace else None
        self._blocks.clear()  # made again, traced or not
        self._lock = threading.RLock()
        self.tree.lock = self._lock
        self._count_lock = threading.Lock()
        self.out = None
        self._stacks = {}
        self._before_switch = {}
        self.loops.forget()
        self._local = threading.local()
        for phase in self.tree.phases.values():
            phase.clear()
        cast("Stopwatch", self)._clear_run()
        self._enabled = False
        cast("Stopwatch", self).enable()

    def _take(self) -> dict[str, Partial]:
        """In a worker: hands over every measurement recorded since the last call, and forgets it."""
        taken: dict[str, Partial] = {}
        with self._lock:
            for phase in self.tree.phases.values():
                take_from(phase.root, taken)
        return taken

    def _receive_worker_report(self, report: WorkerReport, offset: int = 0) -> None:
        """In the main process: files a batch's worker measurements under the loader stage now waiting;
        ``offset`` keeps the workers of several watched loaders apart."""
        if not self._measuring:
            return
        received = time.perf_counter_ns()  # the workers' clock: CLOCK_MONOTONIC, shared by the host
        prefix = cast("Stopwatch", self)._thread_stack()[-1][1]
        if prefix is DROPPED:
            return
        name = self._local.__dict__.get("phase", DEFAULT_PHASE)
        phase = self.tree.phase(name)
        resolved = self._worker_nodes
        with self._lock:
            for path, partial in report[5].items():
                node = resolved.get((prefix, path))
                if node is None:
                    node = prefix
                    for part in path.split("/"):
                        node = node.children.get(part) or self.tree.add_child(node, part)
                        node.in_workers = True
                    resolved[(prefix, path)] = node
                node.stats.absorb(partial)
            worker_id = report[0] + offset
            if len(report) > 8 and self.timeline is not None:
                self.timeline.add_worker_events(worker_id, cast("Any", report)[8], prefix.path)
            totals = phase.workers.get(worker_id)
            if totals is None:
                totals = phase.workers[worker_id] = WorkerTotals()
            totals.add(report, received)
