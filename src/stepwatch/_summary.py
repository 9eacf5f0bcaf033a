"""The immutable result of a recording: every figure the report shows, as plain data.

A :class:`Summary` is what ``Stopwatch.summary()`` and ``stepwatch.load()`` return. Renderers read it and
nothing else; it converts to and from plain JSON-able dicts and merges exactly with another summary (workers,
ranks, resumed runs).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ._constants import DEFAULT_PHASE, NS_PER_S, ONE_OFF, OTHER
from ._device import OutOfMemory

if TYPE_CHECKING:
    from ._analysis import Verdict
from ._stats import RunningStats, percentile, pick_optional, variance_ns2
from ._trace import TraceEvent


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


@dataclass(frozen=True)
class PhaseSummary:
    """One phase (``train``, ``val``, ...): its stages by path, counted units and measured loop time."""

    name: str
    stages: Mapping[str, StageStats]
    counters: Mapping[str, float]
    loop_ns: int
    steps: int
    device: DeviceLoad = field(default_factory=DeviceLoad)
    workers: Mapping[int, WorkerStats] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", MappingProxyType(dict(self.stages)))
        object.__setattr__(self, "counters", MappingProxyType(dict(self.counters)))
        object.__setattr__(self, "workers", MappingProxyType(dict(self.workers)))

    @functools.cached_property
    def measured_ns(self) -> int:
        """Denominator of shares: the loop's loader+step time, else the top-level stages (one-offs apart).
        Kept once computed (the summary is immutable): every row's share reads it."""
        if self.loop_ns:
            return self.loop_ns
        return sum(s.total_ns for s in self.stages.values() if "/" not in s.path and s.path not in ONE_OFF)

    @property
    def measured(self) -> float:
        return self.measured_ns / NS_PER_S

    def share(self, path: str) -> float:
        """Fraction of the measured loader+step time spent in ``path``; KeyError for an unknown stage.

        A stage measured inside DataLoader workers ran beside that time, so its share is of the workers'
        busy time instead."""
        stage = self.stages[path]
        if path.split("/", 1)[0] in ONE_OFF:
            return math.nan  # outside the steady state's 100%
        if stage.in_workers:
            busy = sum(worker.busy_ns for worker in self.workers.values())
            return stage.total_ns / busy if busy else math.nan
        return stage.total_ns / self.measured_ns if self.measured_ns else 0.0

    @property
    def throughput(self) -> Mapping[str, float]:
        """Units per second: each counter's total over the measured loader+step time. Without a timed loop
        the span that the counts cover is unknown (blocks need not cover it), so there is none."""
        seconds = self.loop_ns / NS_PER_S
        if not seconds:
            return MappingProxyType({})
        return MappingProxyType({unit: value / seconds for unit, value in self.counters.items()})

    @property
    def device_throughput(self) -> Mapping[str, float]:
        """Units per second of device-busy time (empty without device measurements)."""
        seconds = self.device.busy_ns / NS_PER_S
        if not seconds:
            return MappingProxyType({})
        return MappingProxyType({unit: value / seconds for unit, value in self.counters.items()})

    def merge(self, other: PhaseSummary) -> PhaseSummary:
        stages = dict(self.stages)
        for path, stage in other.stages.items():
            stages[path] = stages[path].merge(stage) if path in stages else stage
        counters = dict(self.counters)
        for unit, value in other.counters.items():
            counters[unit] = counters.get(unit, 0) + value
        return PhaseSummary(
            self.name,
            _tree_order(stages),
            counters,
            self.loop_ns + other.loop_ns,
            self.steps + other.steps,
            self.device.merge(other.device),
            _merge_workers(self.workers, other.workers),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "stages": {path: stage.to_dict() for path, stage in self.stages.items()},
            "counters": dict(self.counters),
            "loop_ns": self.loop_ns,
            "steps": self.steps,
            "device": self.device.to_dict(),
            "workers": {str(worker_id): worker.to_dict() for worker_id, worker in self.workers.items()},
        }

    @classmethod
    def from_dict(cls, name: str, data: Mapping[str, Any]) -> PhaseSummary:
        stages = {path: StageStats.from_dict(path, raw) for path, raw in dict(data["stages"]).items()}
        counters = dict(data["counters"])
        for unit, value in counters.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"counter {unit!r} must be a number")
        device = DeviceLoad.from_dict(data["device"]) if data.get("device") is not None else DeviceLoad()
        workers = {int(k): WorkerStats.from_dict(int(k), v) for k, v in dict(data.get("workers") or {}).items()}
        return cls(name, _tree_order(stages), counters, int(data["loop_ns"]), int(data["steps"]), device, workers)


@dataclass(frozen=True)
class Summary:
    """Everything one recording measured. ``stages``, ``share`` and ``throughput`` refer to the main phase
    (``train`` when present); ``phases`` holds every phase by name."""

    phases: Mapping[str, PhaseSummary]
    elapsed: float = 0.0
    """Wall-clock seconds of the whole run, across resumes."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    out_of_memory: tuple[OutOfMemory, ...] = ()
    """Out-of-memory errors raised inside stages, with the device memory at that moment."""
    trace: tuple[TraceEvent, ...] = ()
    """The timeline of the last measured steps, when asked for (``Stopwatch(trace_steps=N)``)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "phases", MappingProxyType(dict(self.phases)))
        object.__setattr__(self, "metadata", MappingProxyType(dict(self.metadata)))
        object.__setattr__(self, "out_of_memory", tuple(self.out_of_memory))
        object.__setattr__(self, "trace", tuple(self.trace))

    @property
    def main_phase(self) -> PhaseSummary:
        if self.phases and DEFAULT_PHASE not in self.phases:
            return next(iter(self.phases.values()))
        return self.phase_or_empty(DEFAULT_PHASE)

    @property
    def stages(self) -> Mapping[str, StageStats]:
        return self.main_phase.stages

    @property
    def throughput(self) -> Mapping[str, float]:
        return self.main_phase.throughput

    def share(self, path: str) -> float:
        return self.main_phase.share(path)

    def phase_or_empty(self, name: str) -> PhaseSummary:
        """The phase ``name``, or an empty one of that name when this run has none (to compare like with like)."""
        phase = self.phases.get(name)
        return phase if phase is not None else PhaseSummary(name, {}, {}, 0, 0)

    @property
    def verdict(self) -> Verdict:
        """What bounds the training (input, host, compute or balanced), why, and what to do about it."""
        from ._analysis import analyze

        return analyze(self)

    def merge(self, other: Summary) -> Summary:
        """Exact combination of two recordings (same stages add up; percentiles use both windows)."""
        phases = dict(self.phases)
        for name, phase in other.phases.items():
            phases[name] = phases[name].merge(phase) if name in phases else phase
        return Summary(
            phases,
            max(self.elapsed, other.elapsed),
            dict(self.metadata),
            self.out_of_memory + other.out_of_memory,
            self.trace + other.trace,
        )

    def to_dict(self) -> dict[str, Any]:
        data = {
            "elapsed": self.elapsed,
            "metadata": _plain(self.metadata),
            "phases": {name: phase.to_dict() for name, phase in self.phases.items()},
            "out_of_memory": [asdict(event) for event in self.out_of_memory],
        }
        if self.trace:  # phase, lane, path, start_ns, duration_ns per event
            data["trace"] = [event.to_list() for event in self.trace]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Summary:
        """Rebuilds a summary from :meth:`to_dict`'s data, checked first against the one schema
        (:func:`~stepwatch._schema.check_run`: ``ValueError`` naming the first wrong field)."""
        from ._schema import check_run

        check_run(data)
        phases = {name: PhaseSummary.from_dict(name, raw) for name, raw in dict(data["phases"]).items()}
        elapsed = data["elapsed"]
        if isinstance(elapsed, bool) or not isinstance(elapsed, (int, float)):
            raise TypeError("elapsed must be a number")
        ooms = tuple(OutOfMemory(**dict(event)) for event in data.get("out_of_memory", ()))
        trace = tuple(TraceEvent(*event) for event in data.get("trace", ()))
        return cls(phases, float(elapsed), dict(data["metadata"]), ooms, trace)


def _tree_order(stages: Mapping[str, StageStats]) -> dict[str, StageStats]:
    """Orders paths so that each parent comes before its children and ``other`` comes last among siblings."""
    # Keep first-seen order among siblings: sort by the input position of each ancestor in turn.
    order = {path: index for index, path in enumerate(stages)}

    def position(path: str) -> tuple[tuple[int, int], ...]:
        parts = path.split("/")
        result = []
        for depth in range(1, len(parts) + 1):
            prefix = "/".join(parts[:depth])
            result.append((1 if parts[depth - 1] == OTHER else 0, order.get(prefix, len(order))))
        return tuple(result)

    return {path: stages[path] for path in sorted(stages, key=position)}


def _merge_workers(a: Mapping[int, WorkerStats], b: Mapping[int, WorkerStats]) -> dict[int, WorkerStats]:
    merged = dict(a)
    for worker_id, worker in b.items():
        merged[worker_id] = merged[worker_id].merge(worker) if worker_id in merged else worker
    return merged


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
