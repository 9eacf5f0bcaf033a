"""Device timing: GPU time per stage from events, idle gaps between steps, peak memory per stage.

CUDA runs asynchronously, so a CPU clock around ``loss.backward()`` measures the launch, not the work. Here
each stage records a start and an end event on the current stream; events come from a pool, are resolved
without blocking (``query``) at step boundaries, and whatever is still pending is resolved with a single
synchronize when a summary is asked for or when the bounded queue is full. The hot path never synchronizes,
unless exact synchronous mode is asked for.

All device calls go through the small :class:`DeviceBackend` interface, so the logic is tested on CPU with a
test double whose events complete later, in order, as a stream would.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ._constants import FOLD
from ._schema import printable

MAX_PENDING = 4096
"""Stage measurements whose events may wait unresolved before one synchronize drains them."""
MAX_OUT_OF_MEMORY = 32
CAUGHT_UP_SLACK_NS = 100_000
CAUGHT_UP_SHARE = 0.10
"""An event that ran within 100 us, or a tenth of the step's CPU time, of being recorded found the device with
(next to) nothing queued. A step counts as caught up (the device waited on the host) only when that holds at its
end *and at every stage boundary inside it*: a loop that synchronizes at each step's end (``loss.item()``)
empties the queue there by construction, while its device was behind, busy, at the stages before. A device
that is the limit has a backlog of work at its stage boundaries."""


@runtime_checkable
class DeviceBackend(Protocol):
    """What stepwatch needs from an accelerator. Times in integer nanoseconds, memory in bytes."""

    name: str

    def new_event(self) -> Any: ...
    def record(self, event: Any) -> None: ...
    def query(self, event: Any) -> bool: ...
    def elapsed_ns(self, start: Any, end: Any) -> int: ...
    def synchronize(self) -> None: ...
    def memory_allocated(self) -> int: ...
    def memory_reserved(self) -> int: ...
    def max_memory_allocated(self) -> int: ...
    def max_memory_reserved(self) -> int: ...
    def memory_peaks(self) -> tuple[int, int]:
        """(peak allocated, peak reserved) since the last reset, read with one call of the statistics."""
        ...

    def reset_peak_memory_stats(self) -> None: ...
    def is_out_of_memory(self, error: BaseException) -> bool: ...
    def range_push(self, name: str) -> None: ...
    def range_pop(self) -> None: ...


class TorchDevice:
    """:class:`DeviceBackend` over torch: ``torch.cuda`` events and memory statistics for CUDA devices,
    ``torch.Event`` for other accelerators where torch offers timing events (memory then reads as 0)."""

    def __init__(self, device: Any) -> None:
        try:
            import torch
        except ImportError:
            raise ImportError("device timing needs PyTorch: pip install 'stepwatch[torch]'") from None
        self._torch: Any = torch  # typed loosely: the calls differ across torch versions and devices
        self._cuda: Any = None
        self.device = torch.device(device)
        if self.device.type == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError(f"stepwatch: device={str(device)!r} was asked for, but CUDA is not available here")
            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            self.device = torch.device("cuda", index)
            self._cuda = torch.cuda
            self.name = f"cuda:{index} {torch.cuda.get_device_name(index)}"
        else:
            if not hasattr(torch, "Event"):
                raise ValueError(f"this torch has no timing events for {self.device.type!r} devices")
            self.name = str(self.device)
        self._oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)

    def new_event(self) -> Any:
        if self._cuda is not None:
            return self._cuda.Event(enable_timing=True)
        return self._torch.Event(device=self.device, enable_timing=True)

    def record(self, event: Any) -> None:
        event.record()

    def query(self, event: Any) -> bool:
        return bool(event.query())

    def elapsed_ns(self, start: Any, end: Any) -> int:
        return round(float(start.elapsed_time(end)) * 1_000_000)  # torch reports milliseconds

    def synchronize(self) -> None:
        if self._cuda is not None:
            self._cuda.synchronize(self.device)
        else:
            self._torch.accelerator.synchronize(self.device)

    def _memory(self, name: str) -> int:
        if self._cuda is None:
            return 0
        return int(getattr(self._cuda, name)(self.device))

    def memory_allocated(self) -> int:
        return self._memory("memory_allocated")

    def memory_reserved(self) -> int:
        return self._memory("memory_reserved")

    def max_memory_allocated(self) -> int:
        return self._memory("max_memory_allocated")

    def max_memory_reserved(self) -> int:
        return self._memory("max_memory_reserved")

    def memory_peaks(self) -> tuple[int, int]:
        # One call builds the allocator's statistics once; max_memory_allocated() and max_memory_reserved()
        # would each build (and sort) the whole dict again.
        if self._cuda is None:
            return 0, 0
        stats = self._cuda.memory_stats(self.device)
        return int(stats.get("allocated_bytes.all.peak", 0)), int(stats.get("reserved_bytes.all.peak", 0))

    def reset_peak_memory_stats(self) -> None:
        if self._cuda is not None:
            self._cuda.reset_peak_memory_stats(self.device)

    def is_out_of_memory(self, error: BaseException) -> bool:
        return self._oom is not None and isinstance(error, self._oom)

    def range_push(self, name: str) -> None:
        if self._cuda is not None:
            self._cuda.nvtx.range_push(name)

    def range_pop(self) -> None:
        if self._cuda is not None:
            self._cuda.nvtx.range_pop()


def make_backend(device: Any) -> DeviceBackend:
    """A backend for ``device``: an object that already implements the interface, or anything
    ``torch.device`` accepts (``"cuda"``, ``"cuda:1"``, ``torch.device(...)``)."""
    if isinstance(device, DeviceBackend):
        return device
    return TorchDevice(device)


@dataclass(frozen=True)
class OutOfMemory:
    """An out-of-memory error raised inside a stage, with the device memory at that moment."""

    phase: str
    stage: str
    allocated: int
    reserved: int
    message: str


class _Loop:
    """Device bookkeeping of one timed iterator: the end event of its previous step, held for the idle gap."""

    __slots__ = ("phase", "previous_end")

    def __init__(self, phase: Any) -> None:
        self.phase = phase
        self.previous_end: Any = None


class DeviceTimer:
    """Event pool, pending queue and memory tracking for one stopwatch on one device."""

    def __init__(
        self,
        backend: DeviceBackend,
        *,
        sync: bool,
        nvtx: bool,
        fold: Callable[[Any], None],
        max_pending: int = MAX_PENDING,
        stage_memory: bool = False,
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self.backend = backend
        self.clock = clock
        self._anchor: tuple[Any, int] | None = None
        """An event recorded on an idle device, with the CPU time it was recorded at: it maps device times to
        CPU times, so whether the device had caught up at a step's end is read from events, never raced for."""
        self.stage_memory = stage_memory
        """Peak memory of every stage (two statistics reads per block); else of each step only."""
        self.fold = fold
        self.sync = sync
        self.nvtx = nvtx
        self.max_pending = max_pending
        self._pool: list[Any] = []
        self._pending: deque[tuple[Any, ...]] = deque()
        self.out_of_memory: list[OutOfMemory] = []
        self.dropped = 0
        """Pending measurements given up because the device failed to synchronize."""
        self.error: str | None = None
        self.trace: Any = None
        """The stopwatch's timeline of recent steps, when kept: resolved stages go on its device lane."""
        self._stage_lag_ns = 0
        """The longest a stage's end event waited on the device, since the last step resolved: how far behind
        the host the device was at the step's stage boundaries."""

    # -- stage boundaries ----------------------------------------------------------------------------

    def _event(self) -> Any:
        pool = self._pool
        return pool.pop() if pool else self.backend.new_event()

    def begin(self, name: str, parent_frame: Any, memory: bool = True) -> tuple[Any, int, int]:
        """Called on entering a stage: returns (start event, peak allocated so far, peak reserved so far); with
        ``memory`` False (a block, unless per-stage memory was asked for) no memory statistics are read, the
        peaks read -1, and the enclosing step's peak still covers the block."""
        backend = self.backend
        if self.nvtx:
            backend.range_push(name)
        if self.sync:
            backend.synchronize()
        if self._anchor is None:
            self._set_anchor()
        if memory:
            if len(parent_frame) > 3 and parent_frame[4] >= 0:  # keep the parent's peak before it is reset
                allocated, reserved = backend.memory_peaks()
                parent_frame[4] = max(parent_frame[4], allocated)
                parent_frame[5] = max(parent_frame[5], reserved)
            backend.reset_peak_memory_stats()
        start = self._event()
        backend.record(start)
        return (start, 0, 0) if memory else (start, -1, -1)

    def end(self, frame: Any, parent_frame: Any, node: Any, loop: _Loop | None = None) -> None:
        """Called on leaving a stage (after the CPU clock was read): records the end event and memory."""
        backend = self.backend
        stop = self._event()
        backend.record(stop)
        if frame[4] >= 0:  # its memory is tracked
            allocated, reserved = backend.memory_peaks()
            peak = max(frame[4], allocated)
            reserved = max(frame[5], reserved)
            if peak > node.peak_allocated:
                node.peak_allocated = peak
            if reserved > node.peak_reserved:
                node.peak_reserved = reserved
            if len(parent_frame) > 3 and parent_frame[4] >= 0:
                parent_frame[4] = max(parent_frame[4], peak)
                parent_frame[5] = max(parent_frame[5], reserved)
            if self.trace is not None and loop is not None:  # the step's peaks, as the timeline's counters
                now, lane = self.clock(), ("counter", "device memory")
                self.trace.events += ("allocated", now, peak, lane, "reserved", now, reserved, lane)
        if self.nvtx:
            backend.range_pop()
        # when the CPU issued the step's end, and the step's CPU time: compared, once resolved, with when the
        # device ran it
        issued = (self.clock(), frame[2]) if loop is not None else self.clock()
        self._pending.append((node, frame[3], stop, loop, issued))
        if len(self._pending) >= self.max_pending:
            self.drain()

    def before_clock(self) -> None:
        """In synchronous mode, wait for the device before the CPU clock is read at a stage boundary."""
        if self.sync:
            self.backend.synchronize()

    def record_out_of_memory(self, phase: str, stage: str, error: BaseException) -> None:
        if len(self.out_of_memory) < MAX_OUT_OF_MEMORY:
            message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            backend = self.backend
            self.out_of_memory.append(
                OutOfMemory(
                    printable(phase),
                    printable(stage),
                    backend.memory_allocated(),
                    backend.memory_reserved(),
                    printable(message[:300]),
                )
            )

    def loop_finished(self, loop: _Loop) -> None:
        """The iterator ended: its last held event goes back to the pool once everything before it resolved."""
        self._pending.append((None, None, None, loop, None))

    # -- resolution ----------------------------------------------------------------------------------

    def poll(self) -> None:
        """Resolves, without blocking, every pending measurement whose end event has completed."""
        pending, query = self._pending, self.backend.query
        while pending:
            entry = pending[0]
            if entry[2] is not None and not query(entry[2]):
                return
            pending.popleft()
            self._resolve(entry)

    def drain(self) -> None:
        """Resolves everything pending with one synchronize (skipped when nothing is pending)."""
        if not self._pending:
            return
        try:
            self.backend.synchronize()
        except Exception as error:  # a broken device (a device-side assert) must not cost the CPU figures
            self.dropped += len(self._pending)
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            self.error = printable(f"{type(error).__name__}: {first}")
            self._pending.clear()
            return
        pending = self._pending
        while pending:
            self._resolve(pending.popleft())
        self._set_anchor()  # the device is idle now: a fresh anchor keeps the two clocks from drifting apart

    def _set_anchor(self) -> None:
        """Synchronizes (the device is then idle), records an event and notes the CPU time: that event ran when
        it was recorded, so it ties the device's clock to the CPU's."""
        backend = self.backend
        if self._anchor is None:
            backend.synchronize()  # once, when timing starts; later anchors follow a drain's synchronize
        else:
            self._pool.append(self._anchor[0])
        event = self._event()
        backend.record(event)
        self._anchor = (event, self.clock())

    def _resolve(self, entry: tuple[Any, ...]) -> None:
        node, start, stop, loop, issued = entry
        pool = self._pool
        if node is None:  # end-of-loop marker
            if loop.previous_end is not None:
                pool.append(loop.previous_end)
                loop.previous_end = None
            return
        elapsed = self.backend.elapsed_ns(start, stop)
        node.device_buf.append(elapsed)
        if len(node.device_buf) >= FOLD:
            self.fold(node)
        if self.trace is not None and self._anchor is not None:  # when the device ran it, on the CPU's clock
            ran = self._anchor[1] + self.backend.elapsed_ns(self._anchor[0], start)
            self.trace.events += (node, ran, ran + elapsed, ("device", self.backend.name))
        anchor = self._anchor
        if loop is None:
            if issued is not None and anchor is not None:  # how far behind the device was at this boundary
                lag = anchor[1] + self.backend.elapsed_ns(anchor[0], stop) - issued
                if lag > self._stage_lag_ns:
                    self._stage_lag_ns = lag
            pool.append(start)
            pool.append(stop)
            return
        phase = loop.phase
        phase.device_busy_ns += elapsed
        phase.device_steps += 1
        if issued is not None and anchor is not None:
            issued_ns, step_started_ns = issued
            ran_ns = anchor[1] + self.backend.elapsed_ns(anchor[0], stop)  # when the device ran the step's end
            slack = max(CAUGHT_UP_SLACK_NS, int((issued_ns - step_started_ns) * CAUGHT_UP_SHARE))
            if ran_ns - issued_ns <= slack and self._stage_lag_ns <= slack:  # nothing queued, all step long
                phase.device_caught_up += 1
        self._stage_lag_ns = 0
        if loop.previous_end is not None:
            phase.device_idle_ns += max(self.backend.elapsed_ns(loop.previous_end, start), 0)
            pool.append(loop.previous_end)
        pool.append(start)
        loop.previous_end = stop
