"""The timeline of recent steps: the start and end of every block of the last N measured steps, kept in a
bounded ring (``Stopwatch(trace_steps=200)``), for the Chrome / Perfetto trace export.

Off by default, and then nothing here runs. On, a block appends one tuple when it closes; each completed step
of an outermost loop closes its list of events into the ring, which keeps the last N. Blocks recorded inside
DataLoader workers come back with their batch's report, as events of their worker's lane. The lists are read
only when a summary is taken.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

from ._constants import DEFAULT_PHASE

MAX_TRACE_STEPS = 100_000
LOOSE_EVENTS = 100_000
"""At most this many events wait for their step to end (blocks with no loop, or a step of more blocks): past
it, the older half is dropped, so memory stays bounded by the ring and this whatever the program does."""


@dataclass(frozen=True)
class TraceEvent:
    """One block of the timeline: its phase, its lane (``thread <name>``, ``worker <id>`` or ``device <name>``
    for the device's time of a stage), its stage path, and its start and duration in nanoseconds of the host's
    monotonic clock."""

    phase: str
    lane: str
    path: str
    start_ns: int
    duration_ns: int
    value: int | None = None
    """For a counter (lane ``counter <name>``, duration 0): its value at ``start_ns``, e.g. the device memory
    (``path`` ``allocated`` or ``reserved``, in bytes) at the end of a step."""

    def to_list(self) -> list[Any]:
        event = [self.phase, self.lane, self.path, self.start_ns, self.duration_ns]
        return event if self.value is None else [*event, self.value]


class Trace:
    """The ring of the last ``steps`` steps' events. ``events`` is the step under way, flat: ``node or path,
    start, end, lane`` for each event, the lane being the recording thread's stack or ``("worker", id)``. Flat,
    because a tuple per event would be a container the garbage collector keeps visiting: three times the cost."""

    __slots__ = ("events", "kept", "steps")

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.kept: deque[tuple[str, list[Any]]] = deque(maxlen=steps)
        self.events: list[Any] = []

    def step_done(self, phase: str) -> None:
        """A step of ``phase`` ended: its events go into the ring (the oldest step leaves it when full)."""
        events, self.events = self.events, []
        if events:
            self.kept.append((phase, events))

    def take_worker_events(self) -> list[tuple[str, int, int]]:
        """In a DataLoader worker: the events since the last call, as (path, start, end), for the batch's
        report."""
        events, self.events = self.events, []
        return [(_path(events[i]), events[i + 1], events[i + 2]) for i in range(0, len(events) - 3, 4)]

    def add_worker_events(self, worker: int, events: list[tuple[str, int, int]], under: str) -> None:
        """A batch's events from worker ``worker``, filed under the stage ``under`` (the loader's)."""
        lane = ("worker", worker)
        for path, start, end in events:
            self.events += (f"{under}/{path}", start, end, lane)

    def bound_loose(self) -> None:
        """Events that wait for a step past ``4 * LOOSE_EVENTS`` (blocks with no loop): the older half goes."""
        if len(self.events) > 4 * LOOSE_EVENTS:
            del self.events[: 2 * LOOSE_EVENTS]  # 4 items an event

    def clear(self) -> None:
        self.kept.clear()
        self.events = []

    def snapshot(self, stacks: dict[int, list[Any]]) -> tuple[TraceEvent, ...]:
        """The kept steps' events, oldest first, with their threads named (``stacks``: thread id -> stack)."""
        names = {thread.ident: thread.name for thread in threading.enumerate()}
        lanes: dict[int, str] = {}
        for ident, stack in stacks.items():
            lanes[id(stack)] = f"thread {names.get(ident, ident)}"
        result = []
        last = self.kept[-1][0] if self.kept else DEFAULT_PHASE
        current = list(self.events)  # the device's stages resolved since the last step (the summary's drain)
        late = [current[i : i + 4] for i in range(0, len(current) - 3, 4) if _late(current[i + 3])]
        for phase, events in [*list(self.kept), (last, [item for event in late for item in event])]:
            events = list(events)
            for i in range(0, len(events) - 3, 4):
                node, start, end, lane = events[i : i + 4]
                name = f"{lane[0]} {lane[1]}" if isinstance(lane, tuple) else lanes.get(id(lane), "thread ?")
                if name.startswith("counter "):  # its value where a block has its end
                    result.append(TraceEvent(phase, name, _path(node), start, 0, end))
                else:
                    result.append(TraceEvent(phase, name, _path(node), start, end - start))
        return tuple(result)


def _late(lane: Any) -> bool:
    """The device's lanes, whose events may arrive after their step ended."""
    return isinstance(lane, tuple) and lane[0] == "device"


def _path(node: Any) -> str:
    return node if isinstance(node, str) else str(node.path)
