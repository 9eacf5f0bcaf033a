"""The figures of one row of a report: a stage's :class:`StageStats`, the device's :class:`DeviceLoad` over a
phase, a DataLoader worker's :class:`WorkerStats`. Immutable plain data that converts to and from JSON-able
dicts and merges exactly; :mod:`stepwatch._summary` gathers them into phases and runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ._constants import NS_PER_S, OTHER
from ._stats import RunningStats, percentile, pick_optional, variance_ns2


@dataclass(frozen=True)
class StageStats:
    """Statistics of one stage. Exact integer sums in ns; the public figures are in seconds.

    ``spread`` is False for a derived ``<parent>/other`` row: its calls, total and mean are exact (the parent
    minus its children), but no single measurements exist, so std, min, max and percentiles are NaN.
    """

    path: str
    calls: int
    total_ns: int
    sumsq_ns: int
    min_ns: int
    max_ns: int
    recent_ns: tuple[int, ...]
    window: int
    spread: bool = True
    device: StageStats | None = None
    """Device time of the stage (from events), with the same statistics; None without a device."""
    peak_allocated: int | None = None
    """Highest device memory allocated during the stage, in bytes (max over calls); None without a device."""
    peak_reserved: int | None = None
    in_workers: bool = False
    """Measured inside DataLoader worker processes: it ran beside the main process's time, not inside it."""

    def with_device(
        self, device: StageStats | None, peak_allocated: int | None, peak_reserved: int | None
    ) -> StageStats:
        return replace(self, device=device, peak_allocated=peak_allocated, peak_reserved=peak_reserved)

    @classmethod
    def uncovered(cls, parent: StageStats, children: list[StageStats]) -> StageStats:
        """The part of ``parent`` that none of its direct ``children`` covers."""
        total = max(parent.total_ns - sum(child.total_ns for child in children), 0)
        return cls(f"{parent.path}/{OTHER}", parent.calls, total, 0, 0, 0, (), parent.window, spread=False)

    @classmethod
    def from_running(cls, path: str, stats: RunningStats) -> StageStats:
        return cls(
            path=path,
            calls=stats.calls,
            total_ns=stats.total_ns,
            sumsq_ns=stats.sumsq_ns,
            min_ns=stats.min_ns or 0,
            max_ns=stats.max_ns or 0,
            recent_ns=tuple(stats.recent),
            window=stats.window,
        )

    def to_running(self) -> RunningStats:
        if not self.spread:
            raise ValueError(f"{self.path} is derived and has no measurements of its own")
        stats = RunningStats(window=self.window)
        stats.calls, stats.total_ns, stats.sumsq_ns = self.calls, self.total_ns, self.sumsq_ns
        stats.min_ns = self.min_ns if self.calls else None
        stats.max_ns = self.max_ns if self.calls else None
        stats.recent.extend(self.recent_ns)
        return stats

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def depth(self) -> int:
        return self.path.count("/")

    @property
    def total(self) -> float:
        return self.total_ns / NS_PER_S

    @property
    def mean(self) -> float:
        return self.total_ns / self.calls / NS_PER_S if self.calls else 0.0

    @property
    def std(self) -> float:
        if not self.spread:
            return math.nan
        return math.sqrt(variance_ns2(self.calls, self.total_ns, self.sumsq_ns)) / NS_PER_S

    @property
    def min(self) -> float:
        return self.min_ns / NS_PER_S if self.spread else math.nan

    @property
    def max(self) -> float:
        return self.max_ns / NS_PER_S if self.spread else math.nan

    def percentile(self, q: float) -> float:
        """Percentile ``q`` (0-100) in seconds over the recent window; NaN with no measurements."""
        return percentile(sorted(self.recent_ns), q) / NS_PER_S

    @property
    def p50(self) -> float:
        return self.percentile(50)

    @property
    def p90(self) -> float:
        return self.percentile(90)

    @property
    def p99(self) -> float:
        return self.percentile(99)

    def merge(self, other: StageStats) -> StageStats:
        if self.spread and other.spread:
            merged = StageStats.from_running(self.path, self.to_running().merge(other.to_running()))
        else:
            merged = StageStats(
                self.path, self.calls + other.calls, self.total_ns + other.total_ns, 0, 0, 0, (), self.window, False
            )
        device = self.device.merge(other.device) if self.device and other.device else self.device or other.device
        merged = replace(merged, in_workers=self.in_workers)
        return merged.with_device(
            device,
            pick_optional(max, self.peak_allocated, other.peak_allocated),
            pick_optional(max, self.peak_reserved, other.peak_reserved),
        )

    def to_dict(self) -> dict[str, Any]:
        if not self.spread:
            data: dict[str, Any] = {"calls": self.calls, "total_ns": self.total_ns, "window": self.window}
            data["spread"] = False
        else:
            data = self.to_running().to_dict()
        if self.device is not None:
            data["device"] = self.device.to_dict()
        if self.peak_allocated is not None:
            data["peak_allocated"] = self.peak_allocated
        if self.peak_reserved is not None:
            data["peak_reserved"] = self.peak_reserved
        if self.in_workers:
            data["in_workers"] = True
        data["seconds"] = self.seconds()
        return data

    def seconds(self) -> dict[str, float | None]:
        """The figures in seconds, for people and tools reading a saved file (None where not measured); the
        exact integer nanoseconds beside them are what stepwatch reads back."""
        figures = {
            "total": self.total,
            "mean": self.mean,
            "std": self.std,
            "min": self.min,
            "max": self.max,
            "p50": self.p50,
            "p90": self.p90,
            "p99": self.p99,
        }
        return {name: None if math.isnan(value) else value for name, value in figures.items()}

    @classmethod
    def from_dict(cls, path: str, data: Mapping[str, Any]) -> StageStats:
        if data.get("spread", True) is False:
            calls, total, window = data["calls"], data["total_ns"], data["window"]
            for value in (calls, total, window):
                if isinstance(value, bool) or not isinstance(value, int):
                    raise TypeError(f"{path}: calls, total_ns and window must be integers")
            stage = cls(path, calls, total, 0, 0, 0, (), window, spread=False)
        else:
            stage = cls.from_running(path, RunningStats.from_dict(dict(data)))
        if data.get("in_workers") is True:
            stage = replace(stage, in_workers=True)
        device = cls.from_dict(path, data["device"]) if data.get("device") is not None else None
        peaks = [data.get("peak_allocated"), data.get("peak_reserved")]
        for value in peaks:
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"{path}: peak memory must be an integer")
        if device is None and peaks == [None, None]:
            return stage
        return stage.with_device(device, peaks[0], peaks[1])


@dataclass(frozen=True)
class DeviceLoad:
    """How busy the device was over a phase's steps, from events: the device time of each whole step
    (``busy_ns``) and the gaps between one step's device work and the next step's (``idle_ns``)."""

    busy_ns: int = 0
    idle_ns: int = 0
    steps: int = 0
    caught_up: int = 0
    """Steps at whose end the device had already finished all the work issued: it was waiting on the host."""

    @property
    def caught_up_share(self) -> float:
        return self.caught_up / self.steps if self.steps else math.nan

    @property
    def idle_share(self) -> float:
        """Fraction of the device's timeline spent idle between steps; NaN without device measurements."""
        span = self.busy_ns + self.idle_ns
        return self.idle_ns / span if span else math.nan

    def merge(self, other: DeviceLoad) -> DeviceLoad:
        return DeviceLoad(
            self.busy_ns + other.busy_ns,
            self.idle_ns + other.idle_ns,
            self.steps + other.steps,
            self.caught_up + other.caught_up,
        )

    def to_dict(self) -> dict[str, int]:
        return {"busy_ns": self.busy_ns, "idle_ns": self.idle_ns, "steps": self.steps, "caught_up": self.caught_up}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeviceLoad:
        values = [data["busy_ns"], data["idle_ns"], data["steps"], data.get("caught_up", 0)]
        if any(isinstance(v, bool) or not isinstance(v, int) for v in values):
            raise TypeError("device busy_ns, idle_ns and steps must be integers")
        return cls(*values)


@dataclass(frozen=True)
class WorkerStats:
    """One DataLoader worker (by worker id, across restarts): batches it produced, time it spent producing
    them (``busy_ns``: from starting a batch's first sample to the collated batch), its wall time from start
    to its last batch, the total time its batches waited, ready, before the main process took them, and the CPU
    time it spent on them (``cpu_ns``, its process's CPU clock) and the time it spent on them runnable but waiting
    for a core (``queued_ns``, the kernel's scheduler statistics); -1 when not measured."""

    worker_id: int
    batches: int
    busy_ns: int
    wall_ns: int
    wait_ns: int
    cpu_ns: int = -1
    queued_ns: int = -1

    @property
    def cpu_share(self) -> float:
        """CPU time over busy time: near 1 for a worker that computes (decoding, augmenting), low for one that
        mostly waits (I/O, a remote read, ``sleep``) or for a core. NaN if unknown."""
        return min(self.cpu_ns / self.busy_ns, 1.0) if self.cpu_ns >= 0 and self.busy_ns else math.nan

    @property
    def queued_share(self) -> float:
        """Time runnable but waiting for a core, over busy time: high when workers and training outnumber the
        cores. NaN if unknown."""
        return min(self.queued_ns / self.busy_ns, 1.0) if self.queued_ns >= 0 and self.busy_ns else math.nan

    @property
    def needs_core_share(self) -> float:
        """The share of its busy time a worker needed a core (computing, or waiting for one): what more cores,
        not more workers, would speed up. Its CPU share where waiting for a core is not known."""
        cpu, queued = self.cpu_share, self.queued_share
        return cpu if math.isnan(queued) else min(cpu + queued, 1.0)

    @property
    def utilization(self) -> float:
        """Busy over wall time: near 1 means this worker never rests, so more workers would help."""
        return self.busy_ns / self.wall_ns if self.wall_ns else math.nan

    @property
    def busy_per_batch(self) -> float:
        return self.busy_ns / self.batches / NS_PER_S if self.batches else math.nan

    @property
    def wait_per_batch(self) -> float:
        """Seconds a batch sat ready in the prefetch queue (worker time hidden by prefetching)."""
        return self.wait_ns / self.batches / NS_PER_S if self.batches else math.nan

    def merge(self, other: WorkerStats) -> WorkerStats:
        return WorkerStats(
            self.worker_id,
            self.batches + other.batches,
            self.busy_ns + other.busy_ns,
            self.wall_ns + other.wall_ns,
            self.wait_ns + other.wait_ns,
            self.cpu_ns + other.cpu_ns if self.cpu_ns >= 0 and other.cpu_ns >= 0 else -1,
            self.queued_ns + other.queued_ns if self.queued_ns >= 0 and other.queued_ns >= 0 else -1,
        )

    def to_dict(self) -> dict[str, int]:
        figures = {"batches": self.batches, "busy_ns": self.busy_ns, "wall_ns": self.wall_ns, "wait_ns": self.wait_ns}
        if self.cpu_ns >= 0:
            figures["cpu_ns"] = self.cpu_ns
        if self.queued_ns >= 0:
            figures["queued_ns"] = self.queued_ns
        return figures

    @classmethod
    def from_dict(cls, worker_id: int, data: Mapping[str, Any]) -> WorkerStats:
        values = [data["batches"], data["busy_ns"], data["wall_ns"], data["wait_ns"]]
        values += [data.get("cpu_ns", -1), data.get("queued_ns", -1)]
        if any(isinstance(v, bool) or not isinstance(v, int) for v in values):
            raise TypeError("worker figures must be integers")
        return cls(worker_id, *values)
