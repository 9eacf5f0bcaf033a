"""A device test double that runs in real time: a thread plays the stream, running queued work in order and
completing each event when it reaches it, as a GPU does. Unlike ``fake_device``'s shared fake clock, nothing
here is exact: an event recorded on an idle stream completes a moment later, so code that queries an event
right after recording it loses the race, as it would on real CUDA."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any


class RealtimeEvent:
    __slots__ = ("done_at",)

    def __init__(self) -> None:
        self.done_at: int | None = None


class RealtimeDevice:
    name = "realtime:0 Simulated Stream"

    def __init__(self) -> None:
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                if isinstance(item, RealtimeEvent):
                    item.done_at = time.perf_counter_ns()
                else:
                    time.sleep(item)  # a kernel: the stream is busy, the GIL is free
            finally:
                self._queue.task_done()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def launch(self, seconds: float) -> None:
        self._queue.put(seconds)

    # -- the interface ------------------------------------------------------------------------------

    def new_event(self) -> RealtimeEvent:
        return RealtimeEvent()

    def record(self, event: RealtimeEvent) -> None:
        event.done_at = None
        self._queue.put(event)

    def query(self, event: RealtimeEvent) -> bool:
        return event.done_at is not None

    def elapsed_ns(self, start: RealtimeEvent, end: RealtimeEvent) -> int:
        assert start.done_at is not None and end.done_at is not None, "elapsed time of an event not completed"
        return end.done_at - start.done_at

    def synchronize(self) -> None:
        self._queue.join()

    def memory_allocated(self) -> int:
        return 0

    def memory_reserved(self) -> int:
        return 0

    def max_memory_allocated(self) -> int:
        return 0

    def max_memory_reserved(self) -> int:
        return 0

    def memory_peaks(self) -> tuple[int, int]:
        return 0, 0

    def reset_peak_memory_stats(self) -> None:
        pass

    def is_out_of_memory(self, error: BaseException) -> bool:
        return False

    def range_push(self, name: str) -> None:
        pass

    def range_pop(self) -> None:
        pass
