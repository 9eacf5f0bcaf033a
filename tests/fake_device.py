"""An honest test double of the device interface: one in-order stream on a shared fake timeline.

Work launched by the test queues behind earlier work; an event completes when the stream reaches it, in order,
at the time the queued work before it finishes; ``query`` answers by the fake CPU clock, ``synchronize``
blocks the CPU (advances the clock) until the stream is empty. Memory is a counter with a peak, like the CUDA
caching allocator's statistics. Every call is counted, so tests can assert what the hot path did.
"""

from __future__ import annotations

from collections import Counter

from .conftest import FakeClock


class FakeEvent:
    __slots__ = ("done_at", "serial")

    def __init__(self, serial: int) -> None:
        self.serial = serial
        self.done_at: int | None = None


class FakeOutOfMemoryError(RuntimeError):
    pass


class FakeDevice:
    name = "fake:0 Test Accelerator"

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.busy_until = 0
        self.calls: Counter[str] = Counter()
        self.events_created = 0
        self.allocated = 0
        self.reserved = 0
        self.peak_allocated = 0
        self.peak_reserved = 0
        self.ranges: list[str] = []
        self.range_log: list[tuple[str, str]] = []

    # -- what "kernels" do --------------------------------------------------------------------------

    def launch(self, ns: int) -> None:
        """Queue ``ns`` of device work; it starts when the stream is free and the CPU has launched it."""
        self.busy_until = max(self.busy_until, self.clock.now) + ns

    def allocate(self, size: int) -> None:
        self.allocated += size
        self.reserved = max(self.reserved, self.allocated)
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def free(self, size: int) -> None:
        self.allocated -= size

    # -- the interface ------------------------------------------------------------------------------

    def new_event(self) -> FakeEvent:
        self.calls["new_event"] += 1
        self.events_created += 1
        return FakeEvent(self.events_created)

    def record(self, event: FakeEvent) -> None:
        self.calls["record"] += 1
        event.done_at = max(self.busy_until, self.clock.now)

    def query(self, event: FakeEvent) -> bool:
        self.calls["query"] += 1
        assert event.done_at is not None, "query of an event never recorded"
        return self.clock.now >= event.done_at

    def elapsed_ns(self, start: FakeEvent, end: FakeEvent) -> int:
        self.calls["elapsed"] += 1
        assert start.done_at is not None and end.done_at is not None
        assert self.clock.now >= end.done_at, "elapsed time read before the end event completed"
        return end.done_at - start.done_at

    def synchronize(self) -> None:
        self.calls["synchronize"] += 1
        if self.busy_until > self.clock.now:
            self.clock.advance(self.busy_until - self.clock.now)

    def memory_allocated(self) -> int:
        return self.allocated

    def memory_reserved(self) -> int:
        return self.reserved

    def max_memory_allocated(self) -> int:
        return self.peak_allocated

    def max_memory_reserved(self) -> int:
        return self.peak_reserved

    def memory_peaks(self) -> tuple[int, int]:
        self.calls["memory_peaks"] += 1
        return self.peak_allocated, self.peak_reserved

    def reset_peak_memory_stats(self) -> None:
        self.calls["reset_peak"] += 1
        self.peak_allocated = self.allocated
        self.peak_reserved = self.reserved

    def is_out_of_memory(self, error: BaseException) -> bool:
        return isinstance(error, FakeOutOfMemoryError)

    def range_push(self, name: str) -> None:
        self.ranges.append(name)
        self.range_log.append(("push", name))

    def range_pop(self) -> None:
        self.range_log.append(("pop", self.ranges.pop()))
