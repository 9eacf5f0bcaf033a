"""Checkpointing: a stopwatch's state as plain data, and carrying on from it.

The state is checked completely (the run against the one schema, then the fields of the state itself)
before anything recorded is replaced, so a corrupt state raises :class:`~stepwatch.FormatError` and loses
nothing. Loading rebuilds the recording in place: loops that are running keep recording into it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._constants import OTHER
from ._run_file import FormatError
from ._schema import ELAPSED_MAX, NS_MAX
from ._summary import Summary
from ._tree import WorkerTotals

if TYPE_CHECKING:
    from ._recorder import Stopwatch

STATE_VERSION = 1
_WHERE = "<state_dict>"


def state_dict(sw: Stopwatch) -> dict[str, Any]:
    summary = sw.summary()
    with sw.tree.lock:
        return {
            "stepwatch_state": STATE_VERSION,
            "summary": summary.to_dict(),
            "schedule_pos": {name: phase.schedule_pos for name, phase in sw.tree.phases.items()},
            "elapsed_ns": sw.span.elapsed_ns(),
            "started_at": sw.span.started_wall,
            "devices": sw.devices(),
            "batch_samples": {name: phase.batch_samples for name, phase in sw.tree.phases.items()},
        }


@dataclass(frozen=True)
class _State:
    summary: Summary
    positions: dict[str, int]
    elapsed_ns: int
    started_at: float | None
    devices: list[str]
    batch_samples: dict[str, int | None]


def _parse(state: Any) -> _State:
    """The state, checked whole; raises FormatError naming what is wrong."""
    if not isinstance(state, dict) or state.get("stepwatch_state") != STATE_VERSION:
        raise FormatError(_WHERE, "not a stepwatch state_dict of version 1")
    missing = {"summary", "schedule_pos", "elapsed_ns", "started_at", "devices"} - set(state)
    if missing:
        raise FormatError(_WHERE, f"corrupt state_dict: missing {', '.join(sorted(missing))}")
    try:
        summary = Summary.from_dict(state["summary"])
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise FormatError(_WHERE, f"corrupt state_dict: {error}") from None
    positions = state["schedule_pos"]
    if not isinstance(positions, dict) or not all(
        isinstance(name, str) and not isinstance(pos, bool) and isinstance(pos, int) and 0 <= pos <= NS_MAX
        for name, pos in positions.items()
    ):
        raise FormatError(_WHERE, "corrupt state_dict: schedule_pos must map phase names to step counts")
    elapsed = state["elapsed_ns"]
    if isinstance(elapsed, bool) or not isinstance(elapsed, int) or not 0 <= elapsed <= ELAPSED_MAX * 1e9:
        raise FormatError(_WHERE, f"corrupt state_dict: elapsed_ns must be a non-negative integer, got {elapsed!r}")
    started = state["started_at"]
    if started is not None and (
        isinstance(started, bool) or not isinstance(started, (int, float)) or not 0 <= started <= 1e11
    ):
        raise FormatError(_WHERE, f"corrupt state_dict: started_at must be a Unix time or None, got {started!r}")
    devices = state["devices"]
    if not isinstance(devices, list) or not all(isinstance(device, str) for device in devices):
        raise FormatError(_WHERE, "corrupt state_dict: devices must be a list of strings")
    batches = state.get("batch_samples", {})  # (absent from the states of stepwatch before 2026-12-07)
    if not isinstance(batches, dict) or not all(
        isinstance(name, str) and (count is None or (type(count) is int and 0 <= count <= NS_MAX))
        for name, count in batches.items()
    ):
        raise FormatError(_WHERE, "corrupt state_dict: batch_samples must map phase names to counts or None")
    started_at = None if started is None else float(started)
    return _State(summary, dict(positions), elapsed, started_at, list(devices), dict(batches))


def load_state_dict(sw: Stopwatch, state: Any) -> None:
    parsed = _parse(state)
    with sw.tree.lock:
        sw.stacks.drop_open_frames()
        for phase in sw.tree.phases.values():
            phase.clear()
        for name, phase_summary in parsed.summary.phases.items():
            phase = sw.tree.phase(name)
            phase.counters = dict(phase_summary.counters)
            phase.count_calls = phase_summary.count_calls
            phase.loop_ns = phase_summary.loop_ns
            phase.steps = phase_summary.steps
            for path, stage in phase_summary.stages.items():
                *parents, leaf = path.split("/")
                node = phase.root
                for part in parents:
                    node = node.children.get(part) or sw.tree.add_child(node, part)
                if leaf == OTHER:  # derived again from the totals
                    continue
                child = node.children.get(leaf) or sw.tree.add_child(node, leaf)
                child.stats = stage.to_running()
                if stage.device is not None:
                    child.device_stats = stage.device.to_running()
                child.peak_allocated = -1 if stage.peak_allocated is None else stage.peak_allocated
                child.peak_reserved = -1 if stage.peak_reserved is None else stage.peak_reserved
                child.in_workers = stage.in_workers
            for worker_id, worker in phase_summary.workers.items():
                totals = phase.workers[worker_id] = WorkerTotals()
                totals.batches, totals.busy_ns, totals.wait_ns = worker.batches, worker.busy_ns, worker.wait_ns
                totals.cpu_ns, totals.queued_ns = worker.cpu_ns, worker.queued_ns
                totals.wall_before_ns = worker.wall_ns
            phase.device_busy_ns = phase_summary.device.busy_ns
            phase.device_idle_ns = phase_summary.device.idle_ns
            phase.device_steps = phase_summary.device.steps
            phase.device_caught_up = phase_summary.device.caught_up
        for name, position in parsed.positions.items():
            sw.tree.phase(name).schedule_pos = position
        for name, count in parsed.batch_samples.items():  # the batches' count apart from the program's, as saved
            phase = sw.tree.phase(name)
            if count is not None and count > 0:  # (in the summary's samples, which the program did not count)
                phase.counters.pop("samples", None)
            phase.batch_samples = count
        dropped = int(parsed.summary.metadata.get("dropped_blocks") or 0)
        sw.span.resume(parsed.elapsed_ns, parsed.started_at, parsed.devices, dropped)
