"""The Chrome / Perfetto trace of a run's recent steps (``stepwatch export run.json -o trace.json``).

The trace event format: one complete event (``"ph": "X"``, microseconds) per block of the timeline that
``Stopwatch(trace_steps=N)`` kept, ``process_name`` and ``thread_name`` metadata, counters (``"ph": "C"``) of
the device memory at each step's end where measured, one process per rank (its pid is the rank in an all-ranks
file) and one thread per recording thread, device and DataLoader worker. It opens in ui.perfetto.dev and
chrome://tracing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._summary import Summary

if TYPE_CHECKING:
    from .._all_ranks import AllRanks


def trace_events(runs: Sequence[Summary]) -> list[dict[str, Any]]:
    """The events of each run's timeline, as one process per run (by rank), times from the earliest event."""
    starts = [event.start_ns for run in runs for event in run.trace]
    origin = min(starts) if starts else 0
    events: list[dict[str, Any]] = []
    for index, run in enumerate(runs):
        rank = run.metadata.get("rank")
        pid = rank if isinstance(rank, int) and not isinstance(rank, bool) else index
        host = run.metadata.get("host") or "?"
        label = f"rank {pid} ({host}, pid {run.metadata.get('pid')})" if len(runs) > 1 else f"stepwatch ({host})"
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label}})
        order = ("thread", "device", "worker")  # the threads first, then the device, then the workers
        names = sorted(
            {event.lane for event in run.trace if event.value is None},
            key=lambda name: (_rank_of_lane(name, order), name),
        )
        lanes = {name: tid for tid, name in enumerate(names, 1)}
        for name, tid in lanes.items():
            lane = {"pid": pid, "tid": tid}
            events.append({"ph": "M", "name": "thread_name", **lane, "args": {"name": name}})
            events.append({"ph": "M", "name": "thread_sort_index", **lane, "args": {"sort_index": tid}})
        counters: dict[tuple[str, int], dict[str, float]] = {}
        for event in run.trace:
            if event.value is not None:  # a counter: its series at one time become one event
                counters.setdefault((event.lane, event.start_ns), {})[f"{event.path} MiB"] = event.value / 2**20
                continue
            events.append(
                {
                    "ph": "X",
                    "name": event.path.rsplit("/", 1)[-1],
                    "cat": event.phase,
                    "pid": pid,
                    "tid": lanes[event.lane],
                    "ts": (event.start_ns - origin) / 1e3,
                    "dur": event.duration_ns / 1e3,
                    "args": {"path": event.path, "phase": event.phase},
                }
            )
        for (counter, start), series in counters.items():
            name = counter.removeprefix("counter ")
            events.append({"ph": "C", "name": name, "pid": pid, "ts": (start - origin) / 1e3, "args": series})
    return events


def _rank_of_lane(name: str, order: Sequence[str]) -> int:
    kind = name.split(" ", 1)[0]
    return order.index(kind) if kind in order else len(order)


def render_trace(summary: Summary) -> str:
    return _document([summary])


def render_trace_ranks(job: AllRanks) -> str:
    return _document(job.runs)


def _document(runs: Sequence[Summary]) -> str:
    kept = sum(len(run.trace) for run in runs)
    note = (
        "the timeline of the last measured steps"
        if kept
        else "no timeline was kept: record with Stopwatch(trace_steps=200) or stepwatch run --trace-steps 200"
    )
    document = {"traceEvents": trace_events(runs), "displayTimeUnit": "ms", "otherData": {"stepwatch": note}}
    return json.dumps(document, separators=(",", ":")) + "\n"
