"""The span of one run: when it started, how long it has run (across resumes from a checkpoint), the devices of
its earlier segments, and the blocks dropped because they overlapped out of order."""

from __future__ import annotations

import time
from collections.abc import Callable


class RunSpan:
    """Owned by one :class:`~stepwatch.Stopwatch`. Cleared by ``reset``; carried over by ``load_state_dict``."""

    def __init__(self, clock: Callable[[], int]) -> None:
        self.clock = clock
        self.clear()

    def clear(self) -> None:
        self.started_wall: float | None = None  # wall-clock time of the start, for the saved metadata
        self.start_ns = 0  # the clock at the start of this segment
        self.elapsed_before_ns = 0  # what earlier segments (before a resume) ran
        self.devices_before: list[str] = []  # the devices earlier segments used, oldest first
        self.dropped_blocks = 0

    def start(self) -> None:
        """The run starts now, unless it already has."""
        if self.started_wall is None:
            self.restart()

    def restart(self) -> None:
        """The run starts again now (a reset while on)."""
        self.started_wall = time.time()
        self.start_ns = self.clock()

    def resume(self, elapsed_ns: int, started_at: float | None, devices: list[str], dropped_blocks: int) -> None:
        """Goes on from a checkpoint's run: its elapsed time, start, devices and dropped blocks."""
        self.elapsed_before_ns = elapsed_ns
        self.start_ns = self.clock()
        self.started_wall = started_at if started_at is not None else time.time()
        self.devices_before = list(devices)
        self.dropped_blocks = dropped_blocks

    def elapsed_ns(self) -> int:
        """How long the run has run, earlier segments included (0 before it started)."""
        running = self.clock() - self.start_ns if self.started_wall is not None else 0
        return self.elapsed_before_ns + running
