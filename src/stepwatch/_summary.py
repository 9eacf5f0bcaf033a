"""The immutable result of a recording: every figure the report shows, as plain data.

A :class:`Summary` is what ``Stopwatch.summary()`` and ``stepwatch.load()`` return: its phases
(:class:`PhaseSummary`), each made of rows of figures (``_figures``). Renderers read it and nothing else; it
converts to and from plain JSON-able dicts and merges exactly with another summary (workers, ranks, resumed
runs).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from . import _display
from ._constants import DEFAULT_PHASE, NS_PER_S, ONE_OFF, OTHER
from ._device import OutOfMemory

if TYPE_CHECKING:
    from ._analysis import Verdict
from ._figures import DeviceLoad, StageStats, WorkerStats
from ._trace import TraceEvent


@dataclass(frozen=True)
class PhaseSummary:
    """One phase (``train``, ``val``, ...): its stages by path, counted units and measured loop time.
    ``count_calls``: the ``count()`` calls that added to the counters (for stepwatch's own cost)."""

    name: str
    stages: Mapping[str, StageStats]
    counters: Mapping[str, float]
    loop_ns: int
    steps: int
    device: DeviceLoad = field(default_factory=DeviceLoad)
    workers: Mapping[int, WorkerStats] = field(default_factory=dict)
    count_calls: int = 0

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
            self.count_calls + other.count_calls,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "stages": {path: stage.to_dict() for path, stage in self.stages.items()},
            "counters": dict(self.counters),
            "loop_ns": self.loop_ns,
            "steps": self.steps,
            "device": self.device.to_dict(),
            "workers": {str(worker_id): worker.to_dict() for worker_id, worker in self.workers.items()},
            "count_calls": self.count_calls,
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
        loop_ns, steps, count_calls = int(data["loop_ns"]), int(data["steps"]), int(data.get("count_calls", 0))
        return cls(name, _tree_order(stages), counters, loop_ns, steps, device, workers, count_calls)


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

    def render(self) -> str:
        """The text report, as ``stepwatch report`` prints it."""
        return _display.text_of(self)

    def _repr_html_(self) -> str:
        """A notebook shows the report's tables and verdict (:mod:`stepwatch._display`)."""
        return _display.html_of(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        _display.pretty(self, printer, cycle)

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
