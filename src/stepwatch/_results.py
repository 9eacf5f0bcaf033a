"""Results of a recording: the :class:`~stepwatch.Summary` snapshot and saving a run.

Reads what a :class:`~stepwatch.Stopwatch` recorded (the tree of each phase) through its parts and hands it on
as plain data; nothing here records. :class:`Results` is the part of the Stopwatch's public face that reads
results: each of its methods hands the stopwatch to a function here.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Literal, cast, overload

from ._figures import DeviceLoad, StageStats
from ._job import all_ranks_path
from ._summary import PhaseSummary, Summary
from ._tree import LoopTimes, collect

if TYPE_CHECKING:
    from ._all_ranks import AllRanks
    from ._recorder import Stopwatch


def snapshot(stopwatch: Stopwatch) -> Summary:
    """An immutable snapshot of everything ``stopwatch`` recorded so far (open blocks are not included)."""
    from ._run_file import build_metadata

    device_timer = stopwatch.device_timer
    with stopwatch.tree.lock:
        if device_timer is not None:
            device_timer.drain()  # the one synchronize: everything pending is resolved now
        phases = {}
        for name, phase in stopwatch.tree.phases.items():
            stages: dict[str, StageStats] = {}
            collect(phase.root, stages)
            if stages or phase.counters or phase.batch_samples or phase.workers:
                loops = LoopTimes(phase.consuming, time.perf_counter_ns())  # ordered once for all its workers
                phases[name] = PhaseSummary(
                    name,
                    stages,
                    phase.counted(),
                    phase.loop_ns,
                    phase.steps,
                    DeviceLoad(phase.device_busy_ns, phase.device_idle_ns, phase.device_steps, phase.device_caught_up),
                    {worker_id: totals.stats(worker_id, loops) for worker_id, totals in sorted(phase.workers.items())},
                    phase.count_calls,
                )
        ooms = tuple(device_timer.out_of_memory) if device_timer is not None else ()
        timeline = stopwatch.timeline
        trace = timeline.snapshot(stopwatch.stacks.by_thread) if timeline is not None else ()
        return Summary(phases, stopwatch.span.elapsed_ns() * 1e-9, build_metadata(stopwatch), ooms, trace)


def save_run(
    stopwatch: Stopwatch,
    path: str | os.PathLike[str],
    *,
    gather: bool,
    timeout: float | None = None,
    tag: str | None = None,
    among: str | None = None,
) -> tuple[str, AllRanks | None]:
    """Writes this rank's file; with ``gather``, also gathers the ranks onto rank 0, which writes the all-ranks
    file. Returns this rank's file and, on rank 0, what was gathered."""
    from ._gather import gather as gather_ranks
    from ._job import rank_path
    from ._run_file import save_summary

    written = rank_path(path)
    summary = snapshot(stopwatch)
    save_summary(summary, written)  # first: whatever happens to the gather, this rank's figures are kept
    if not gather:
        return written, None
    gathered = gather_ranks(summary, timeout=timeout, tag=tag, among=among)
    if gathered is not None and gathered.world_size > 1:
        gathered.save(all_ranks_path(path))
    return written, gathered


def devices_used(stopwatch: Stopwatch) -> list[str]:
    """Devices used over the whole run, across resumes, oldest first."""
    from ._run_file import detect_devices

    used = list(stopwatch.span.devices_before)
    device_timer = stopwatch.device_timer
    current = [device_timer.backend.name] if device_timer is not None else detect_devices()
    for device in current:
        if not used or used[-1] != device:
            used.append(device)
    return used


class Results:
    """The Stopwatch's methods that read what was recorded. It holds no state and declares none: each method
    hands the whole stopwatch to a function of this module (or of ``_checkpoint``), which reads its parts."""

    def _stopwatch(self) -> Stopwatch:
        return cast("Stopwatch", self)

    @overload
    def summary(self, ranks: None = None, *, timeout: float | None = None) -> Summary: ...

    @overload
    def summary(self, ranks: Literal["all"], *, timeout: float | None = None) -> AllRanks | None: ...

    def summary(
        self, ranks: Literal["all"] | None = None, *, timeout: float | None = None
    ) -> Summary | AllRanks | None:
        """An immutable snapshot of everything recorded so far (open blocks are not included).

        With ``ranks="all"``, called on every rank of a ``torch.distributed`` job: rank 0 gets every rank's
        summary as :class:`~stepwatch.distributed.AllRanks`, the other ranks None. Rank 0 waits at most
        ``timeout`` seconds (default ``STEPWATCH_GATHER_TIMEOUT`` or 30) for the others."""
        if ranks is None:
            return snapshot(self._stopwatch())
        if ranks != "all":
            raise ValueError(f"ranks must be 'all' or None, got {ranks!r}")
        from ._gather import gather

        return gather(snapshot(self._stopwatch()), timeout=timeout)

    def metrics(self, prefix: str = "stepwatch") -> dict[str, float]:
        """The current figures as a flat dict for any logger: ``{"stepwatch/train/time_per_step_ms": ...,
        "stepwatch/train/input_share": ..., "stepwatch/train/samples_per_s": ..., ...}`` (see
        ``_metrics.flat_metrics`` for every key). It takes a summary: about 0.1 ms, and on a device one
        synchronize, so call it every N steps (``log_every``), not every step."""
        from ._metrics import flat_metrics

        return flat_metrics(snapshot(self._stopwatch()), prefix)

    def report(self) -> str:
        """The human-readable table of :meth:`summary`."""
        from ._render import render_text

        return render_text(snapshot(self._stopwatch()))

    def save(
        self, path: str | os.PathLike[str], ranks: Literal["all"] | None = None, *, timeout: float | None = None
    ) -> str:
        """Write the run as JSON (atomically: a temporary file renamed over ``path``). In a job of several
        ranks, each rank writes its own file (see ``stepwatch.distributed.rank_path``); with ``ranks="all"``,
        called on every rank, rank 0 also gathers the ranks' summaries and writes the all-ranks file at
        ``path``. Returns the path written (rank 0's all-ranks file, when it wrote one)."""
        if ranks not in (None, "all"):
            raise ValueError(f"ranks must be 'all' or None, got {ranks!r}")
        written, gathered = save_run(self._stopwatch(), path, gather=ranks == "all", timeout=timeout)
        return written if gathered is None or gathered.world_size <= 1 else all_ranks_path(path)

    def load(self, path: str | os.PathLike[str]) -> Summary:
        """Read a saved run; the same as ``stepwatch.load``."""
        from ._run_file import load_summary

        return load_summary(path)

    def devices(self) -> list[str]:
        """Devices used over the whole run, across resumes, oldest first."""
        return devices_used(self._stopwatch())

    def state_dict(self) -> dict[str, Any]:
        """Plain Python data (dicts, lists, str, int, float, None): safe for ``torch.load(weights_only=True)``."""
        from ._checkpoint import state_dict

        return state_dict(self._stopwatch())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Carry on from :meth:`state_dict`: totals, counters, schedule position, elapsed time, devices. A
        corrupt state raises :class:`~stepwatch.FormatError` before anything recorded is replaced."""
        from ._checkpoint import load_state_dict

        load_state_dict(self._stopwatch(), state)
