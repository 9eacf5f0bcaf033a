"""Recording: the :class:`Stopwatch`, its timed blocks and timed iterators.

The hot path is kept to a few attribute reads, two clock reads, a tuple and one list append per block.
Durations go into per-stage buffers that are folded into exact running statistics every ``_FOLD``
measurements (the folding loops run in C), so memory stays bounded however long the run. Open blocks live on
a per-thread stack of ``(owner, node, start_ns)`` frames, so the same stage name can nest and threads never
collide. The part of a parent that no child covers (``<parent>/other``) is derived from the totals when a
summary is made, so it costs nothing while recording.
"""

from __future__ import annotations

import functools
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from ._device import DeviceTimer, _Loop
from ._stats import DEFAULT_WINDOW, Partial, RunningStats, partial_of
from ._summary import OTHER, DeviceLoad, PhaseSummary, StageStats, Summary, WorkerStats
from ._workers import WatchedLoader, WorkerReport

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

_FOLD = 1024
"""Measurements buffered per stage before they are folded into the running statistics."""

Frame = tuple[Any, "_Node", int]
"""An open block on a thread's stack: (owner, stage node, start in ns). The owner is the timed block, ``_LOOP``
for a timed iterator's wait or body, or None for a phase root."""
_LOOP = object()

DEFAULT_PHASE = "train"
FIRST_BATCH = "first_batch"
"""Where the wait for the first item of each epoch goes, apart from the steady-state ``loader`` wait."""
STATE_VERSION = 1


class _Node:
    """One stage in the hierarchy of one phase: its buffers, statistics and children by name."""

    __slots__ = (
        "buf",
        "children",
        "device_buf",
        "device_stats",
        "in_workers",
        "path",
        "peak_allocated",
        "peak_reserved",
        "stats",
    )

    def __init__(self, path: str, window: int) -> None:
        self.path = path
        self.children: dict[str, _Node] = {}
        self.buf: list[int] = []
        self.stats = RunningStats(window=window)
        self.device_buf: list[int] = []
        self.device_stats = RunningStats(window=window)
        self.peak_allocated = -1  # bytes; -1: never measured on a device
        self.peak_reserved = -1
        self.in_workers = False  # measured in DataLoader worker processes, not inside its parent's time

    def child_path(self, name: str) -> str:
        return f"{self.path}/{name}" if self.path else name


class _Phase:
    """Recording state of one phase (``train``, ``val``, ...)."""

    __slots__ = (
        "counters",
        "device_busy_ns",
        "device_caught_up",
        "device_idle_ns",
        "device_steps",
        "loop_ns",
        "name",
        "root",
        "schedule_pos",
        "steps",
        "workers",
    )

    def __init__(self, name: str, window: int) -> None:
        self.name = name
        self.root = _Node("", window)
        self.counters: dict[str, float] = {}
        self.loop_ns = 0
        self.steps = 0
        self.schedule_pos = 0
        self.device_busy_ns = 0
        self.device_idle_ns = 0
        self.device_steps = 0
        self.device_caught_up = 0
        self.workers: dict[int, _WorkerTotals] = {}


class _WorkerTotals:
    """What the batches from one DataLoader worker id told the main process, across its restarts."""

    __slots__ = ("batches", "busy_ns", "spans", "wait_ns", "wall_before_ns")

    def __init__(self) -> None:
        self.batches = 0
        self.busy_ns = 0
        self.wait_ns = 0
        self.spans: dict[int, list[int]] = {}  # pid -> [started_ns, last_ready_ns]
        self.wall_before_ns = 0  # carried over from a resumed run

    def add(self, report: WorkerReport, received_ns: int) -> None:
        _, pid, started, busy, ready, _ = report
        self.batches += 1
        self.busy_ns += busy
        self.wait_ns += max(received_ns - ready, 0)
        span = self.spans.get(pid)
        if span is None:
            self.spans[pid] = [started, ready]
        elif ready > span[1]:
            span[1] = ready

    def stats(self, worker_id: int) -> WorkerStats:
        wall = self.wall_before_ns + sum(last - first for first, last in self.spans.values())
        return WorkerStats(worker_id, self.batches, self.busy_ns, wall, self.wait_ns)


@dataclass(frozen=True)
class Schedule:
    """Which steps are measured: skip ``warmup`` steps of each timed iterator, then measure ``active`` steps
    in every period of ``every`` steps (``active=None``: measure everything; ``every=None``: one window)."""

    warmup: int = 0
    active: int | None = None
    every: int | None = None

    def __post_init__(self) -> None:
        for name in ("warmup", "active", "every"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"{name} must be a non-negative integer or None, got {value!r}")
        if self.every is not None:
            if self.active is None:
                raise ValueError("every needs active: measure `active` steps out of every `every`")
            if self.every < max(self.active, 1):
                raise ValueError(f"every ({self.every}) must be at least active ({self.active}) and positive")

    def measures(self, position: int) -> bool:
        """Whether the step at ``position`` (counted after warm-up) is measured."""
        if self.active is None:
            return True
        if self.every is None:
            return position < self.active
        return position % self.every < self.active


class _Block:
    """A timed block for one stage name; reused for every call, so entering allocates one small list."""

    __slots__ = ("_clock", "_name", "_sw")

    def __init__(self, stopwatch: Stopwatch, name: str) -> None:
        self._sw = stopwatch
        self._name = name
        self._clock = stopwatch._clock

    def __enter__(self) -> None:
        sw = self._sw
        if sw._measuring:
            try:
                stack = sw._local.stack
            except AttributeError:
                stack = sw._thread_stack()
            parent = stack[-1][1]
            node = parent.children.get(self._name)
            if node is None:
                node = sw._add_child(parent, self._name)
            stack.append((self, node, self._clock()))

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        sw = self._sw
        if sw._hot:
            end = self._clock()
            try:
                stack = sw._local.stack
            except AttributeError:
                return
            frame = stack[-1]
            if frame[0] is self:  # else this block was entered outside the measured window
                del stack[-1]
                buf = frame[1].buf
                buf.append(end - frame[2])
                if len(buf) >= 1024:  # _FOLD, inlined
                    sw._fold(frame[1])

    def __call__(self, func: F) -> F:
        """Use as a decorator: every call of ``func`` is timed under this stage."""

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"<stepwatch timed block {self._name!r}>"


class _DeviceBlock(_Block):
    """A timed block that also records device events and peak memory (a stopwatch with a device).

    Its frame lookup mirrors :class:`_Block`'s, inlined on purpose: the CPU block's hot path cannot afford
    the call a shared helper would cost."""

    __slots__ = ()

    def __enter__(self) -> None:
        sw = self._sw
        if sw._measuring:
            try:
                stack = sw._local.stack
            except AttributeError:
                stack = sw._thread_stack()
            parent_frame = stack[-1]
            parent = parent_frame[1]
            node = parent.children.get(self._name)
            if node is None:
                node = sw._add_child(parent, self._name)
            device = sw._device
            if device is None:
                stack.append((self, node, self._clock()))
                return
            start, allocated, reserved = device.begin(self._name, parent_frame)
            stack.append([self, node, self._clock(), start, allocated, reserved])

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        sw = self._sw
        if sw._hot:
            device = sw._device
            if device is not None:
                device.before_clock()
            end = self._clock()
            try:
                stack = sw._local.stack
            except AttributeError:
                return
            frame = stack[-1]
            if frame[0] is self:
                del stack[-1]
                node = frame[1]
                node.buf.append(end - frame[2])
                if len(node.buf) >= _FOLD:
                    sw._fold(node)
                if device is not None and len(frame) > 3:
                    device.end(frame, stack[-1], node)
                    if isinstance(exc, BaseException) and device.backend.is_out_of_memory(exc):
                        phase = sw._local.__dict__.get("phase", DEFAULT_PHASE)
                        device.record_out_of_memory(phase, node.path, exc)


class _Blocks(dict[str, _Block]):
    """The timed blocks of one stopwatch by stage name; a new name is checked once, on first use."""

    def __init__(self, stopwatch: Stopwatch) -> None:
        super().__init__()
        self._stopwatch = stopwatch

    def __missing__(self, stage: str) -> _Block:
        _check_name(stage, "stage")
        kind = _DeviceBlock if self._stopwatch._device_spec is not None else _Block
        return self.setdefault(stage, kind(self._stopwatch, stage))


class Stopwatch:
    """Records where a training loop's time goes.

    Args:
        warmup: steps skipped at the start of each timed iterator (each epoch warms up again).
        active: steps measured after warm-up; ``None`` measures every step.
        every: with ``active``, measure ``active`` steps out of every ``every`` steps.
        window: recent measurements kept per stage for percentiles and the per-measurement export.
        device: also time each stage on this device with events, and track its peak memory: ``"cuda"``,
            ``"cuda:1"``, a ``torch.device``, or any :class:`~stepwatch._device.DeviceBackend`. The device is
            opened when the stopwatch is enabled, never at import or construction.
        sync: exact synchronous mode: synchronize the device at every stage boundary, so that wall times
            include the device work (this changes what is measured; the report says it was on).
        nvtx: push an NVTX range per stage, so Nsight Systems shows the same stages by name.
        clock: a nanosecond clock; tests inject a controllable one.

    Off until :meth:`enable` is called. The module-level functions of ``stepwatch`` use one default instance;
    separate instances are independent.
    """

    def __init__(
        self,
        *,
        warmup: int = 0,
        active: int | None = None,
        every: int | None = None,
        window: int = DEFAULT_WINDOW,
        device: Any = None,
        sync: bool = False,
        nvtx: bool = False,
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self.schedule = Schedule(warmup, active, every)
        if (sync or nvtx) and device is None:
            raise ValueError("sync and nvtx need a device, e.g. Stopwatch(device='cuda', sync=True)")
        self._device_spec = device
        self.sync = sync
        self.nvtx = nvtx
        self._device: DeviceTimer | None = None
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be a positive integer, got {window!r}")
        self.window = window
        self._clock = clock
        self._lock = threading.RLock()
        self._count_lock = threading.Lock()
        self._blocks = _Blocks(self)
        self._enabled = False
        self._in_window = True
        self._measuring = False
        self._hot = False
        self._iter_depth = 0
        self.out: str | None = None
        self._phases: dict[str, _Phase] = {}
        self._stacks: list[list[Frame]] = []
        self._local = threading.local()
        self._started_wall: float | None = None
        self._session_start_ns = 0
        self._elapsed_before_ns = 0
        self._devices_before: list[str] = []
        self._reset_state()

    # -- switching ---------------------------------------------------------------------------------------

    def enable(
        self,
        out: str | os.PathLike[str] | None = None,
        *,
        warmup: int | None = None,
        active: int | None = None,
        every: int | None = None,
    ) -> None:
        """Start recording. With ``out``, the run is also saved there at exit, on an uncaught exception and
        on SIGTERM/SIGINT. ``warmup``, ``active`` and ``every``, when given, set a new schedule (see
        :class:`Stopwatch`): the way to give the module-level default stopwatch one."""
        if warmup is not None or active is not None or every is not None:
            self.schedule = Schedule(warmup or 0, active, every)
        with self._lock:
            if self._device is None and self._device_spec is not None:
                from ._device import make_backend

                backend = make_backend(self._device_spec)
                self._device = DeviceTimer(backend, sync=self.sync, nvtx=self.nvtx, fold=self._fold)
            if self._started_wall is None:
                self._started_wall = time.time()
                self._session_start_ns = self._clock()
            self._enabled = True
            self._update_flags()
        if out is not None:
            from ._autosave import install

            self.out = os.fspath(out)
            install(self)

    def disable(self) -> None:
        """Stop recording. What was recorded is kept; blocks still open are dropped, not half-counted."""
        with self._lock:
            self._enabled = False
            self._update_flags()
            for stack in self._stacks:
                del stack[1:]

    def is_enabled(self) -> bool:
        return self._enabled

    def reset(self) -> None:
        """Forget everything recorded; the switch, the schedule and the autosave path stay."""
        with self._lock:
            for stack in self._stacks:
                del stack[1:]
            self._reset_state()
            if self._enabled:
                self._started_wall = time.time()
                self._session_start_ns = self._clock()

    def _reset_state(self) -> None:
        self._worker_nodes: dict[tuple[_Node, str], _Node] = {}  # (loader node, worker path) -> node
        self._phases = {}
        self._stacks = []
        self._local = threading.local()
        self._started_wall = None
        self._session_start_ns = 0
        self._elapsed_before_ns = 0
        self._devices_before = []
        self._iter_depth = 0
        self._in_window = True
        self._update_flags()

    def _update_flags(self) -> None:
        """``_measuring``: blocks open frames. ``_hot``: blocks look for their frame on the way out, needed
        while a block opened in the window is still open; otherwise leaving a block costs what it costs when
        the stopwatch is off."""
        self._measuring = self._enabled and self._in_window
        self._hot = self._measuring or (self._enabled and self._blocks_open())

    def _blocks_open(self) -> bool:
        """Whether any thread has a timed block open (checked only when the measured window closes)."""
        return any(frame[0] is not None and frame[0] is not _LOOP for stack in self._stacks for frame in stack)

    # -- recording ---------------------------------------------------------------------------------------

    def timed(self, stage: str) -> _Block:
        """Time a block as ``with sw.timed("forward"):`` or decorate a function with ``@sw.timed("x")``.

        Blocks nest: a block opened inside another (or inside a :meth:`timed_iter` body) is its child, and the
        parent's uncovered time shows as ``<parent>/other``.
        """
        return self._blocks[stage]

    def timed_iter(
        self, iterable: Iterable[T], stage: str = "loader", body: str = "step", phase: str | None = None
    ) -> Iterator[T]:
        """Iterate ``iterable``, timing the wait for each item under ``stage`` and the loop body under ``body``.

        The outermost timed iterator defines the steps that the schedule counts and the phase (default
        ``train``); pass ``phase="val"`` for a validation loop. A loop started while the stopwatch is off is
        the plain iterator and costs nothing.
        """
        _check_name(stage, "stage")
        _check_name(body, "body")
        if phase is not None:
            _check_name(phase, "phase")
        if not self._enabled:
            return iter(iterable)
        return self._iterate(iterable, stage, body, phase)

    def watch(
        self, loader: Any, stage: str = "loader", body: str = "step", phase: str | None = None
    ) -> WatchedLoader[Any]:
        """Iterate a ``torch.utils.data.DataLoader`` like :meth:`timed_iter`, with the data pipeline seen from
        inside: each sample's ``dataset`` read, ``collate`` and every ``stepwatch.timed`` block run in the
        workers come back under ``<stage>/...``, with per-worker figures. The loader is instrumented in place
        (its ``collate_fn`` and ``worker_init_fn`` are wrapped); the batches are exactly what it yields."""
        _check_name(stage, "stage")
        _check_name(body, "body")
        return WatchedLoader(loader, self, stage, body, phase)

    def _take(self) -> dict[str, Partial]:
        """In a worker: hands over every measurement recorded since the last call, and forgets it."""
        taken: dict[str, Partial] = {}
        with self._lock:
            for phase in self._phases.values():
                _take_from(phase.root, taken)
        return taken

    def _receive_worker_report(self, report: WorkerReport) -> None:
        """In the main process: files a batch's worker measurements under the loader stage now waiting."""
        if not self._measuring:
            return
        received = time.perf_counter_ns()  # the workers' clock: CLOCK_MONOTONIC, shared by the host
        stack = self._thread_stack()
        prefix = stack[-1][1]
        name = self._local.__dict__.get("phase", DEFAULT_PHASE)
        phase = self._phases.get(name) or self._phase(name)
        resolved = self._worker_nodes
        with self._lock:
            for path, partial in report[5].items():
                node = resolved.get((prefix, path))
                if node is None:
                    node = prefix
                    for part in path.split("/"):
                        node = node.children.get(part) or self._add_child(node, part)
                        node.in_workers = True
                    resolved[(prefix, path)] = node
                node.stats.absorb(partial)
            totals = phase.workers.get(report[0])
            if totals is None:
                totals = phase.workers[report[0]] = _WorkerTotals()
            totals.add(report, received)

    def _iterate(self, iterable: Iterable[T], stage: str, body: str, phase_name: str | None) -> Iterator[T]:
        clock = self._clock
        stack = self._thread_stack()
        local = self._local
        outer = self._iter_depth == 0
        self._iter_depth += 1
        own_phase = outer or phase_name is not None
        previous_phase = local.__dict__.get("phase", DEFAULT_PHASE)
        phase = self._phase(phase_name or (DEFAULT_PHASE if outer else previous_phase))
        root_frame: Frame | None = None
        if own_phase:
            root_frame = (None, phase.root, 0)
            stack.append(root_frame)
            local.phase = phase.name
        parent = stack[-1][1]
        wait_node = parent.children.get(stage) or self._add_child(parent, stage)
        body_node = parent.children.get(body) or self._add_child(parent, body)
        first_node = parent.children.get(FIRST_BATCH) or self._add_child(parent, FIRST_BATCH)
        schedule = self.schedule
        warmup, measure_all = schedule.warmup, schedule.active is None
        loop_phase = phase if own_phase else None
        device = self._device
        device_loop = _Loop(phase) if device is not None and own_phase else None
        iterator = iter(iterable)
        index = 0
        wait_frame: Frame | None = None
        body_frame: Any = None
        try:
            while True:
                if device is not None:
                    device.before_clock()
                now = clock()
                if body_frame is not None:
                    frame, body_frame = body_frame, None
                    self._close_frame(stack, frame, now, loop_phase, device_loop)
                if device is not None:
                    device.poll()
                if outer:
                    in_window = index >= warmup and (measure_all or schedule.measures(phase.schedule_pos))
                    if in_window != self._in_window:
                        self._in_window = in_window
                        self._update_flags()
                    elif self._hot and not self._measuring:  # a block that spanned the window's end is done?
                        self._update_flags()
                if self._measuring:
                    first = index == 0 and own_phase  # a one-off: workers starting, caches filling
                    wait_frame = (_LOOP, first_node if first else wait_node, now)
                    stack.append(wait_frame)
                try:
                    item = next(iterator)
                except StopIteration:
                    if wait_frame is not None:
                        _pop_frame(stack, wait_frame)  # the end of the data is not a wait
                        wait_frame = None
                    return
                ready = clock()
                if outer and index >= warmup:
                    phase.schedule_pos += 1
                index += 1
                if wait_frame is not None:
                    frame, wait_frame = wait_frame, None
                    self._close_frame(stack, frame, ready, loop_phase if frame[1] is wait_node else None)
                    if loop_phase is not None:
                        loop_phase.steps += 1
                    if device is None:
                        body_frame = (_LOOP, body_node, ready)
                    else:
                        start, allocated, reserved = device.begin(body, stack[-1])
                        body_frame = [_LOOP, body_node, ready, start, allocated, reserved]
                    stack.append(body_frame)
                yield item
        finally:
            end = clock()
            if wait_frame is not None:  # an exception in next()
                self._close_frame(stack, wait_frame, end, loop_phase if wait_frame[1] is wait_node else None)
            if body_frame is not None:  # a body left early: break, return or an exception
                self._close_frame(stack, body_frame, end, loop_phase, device_loop)
            if device_loop is not None and device is not None:
                device.loop_finished(device_loop)
            if root_frame is not None:
                _pop_frame(stack, root_frame)
                local.phase = previous_phase
            self._iter_depth = max(self._iter_depth - 1, 0)
            if outer:  # between loops, blocks are measured while the schedule still has steps to measure
                self._in_window = schedule.measures(phase.schedule_pos)
                self._update_flags()
            close = getattr(iterator, "close", None)
            if close is not None:
                close()

    def _close_frame(
        self, stack: list[Any], frame: Any, end: int, phase: _Phase | None, loop: _Loop | None = None
    ) -> None:
        """Records an open frame of a timed iterator; ``phase`` gets the time when the loop owns it."""
        if stack[-1] is frame:
            del stack[-1]
        elif not _pop_frame(stack, frame):
            return  # dropped by disable()
        elapsed = end - frame[2]
        node = frame[1]
        node.buf.append(elapsed)
        if len(node.buf) >= _FOLD:
            self._fold(node)
        if len(frame) > 3 and self._device is not None:
            self._device.end(frame, stack[-1], node, loop)
        if phase is not None:
            phase.loop_ns += elapsed

    def count(self, **units: float) -> None:
        """Add to the counters of the current phase, e.g. ``count(samples=32, tokens=4096)``.

        Throughput is each counter's total over the measured loader+step time; counts made outside the
        measured window are not added, so they never inflate it.
        """
        if not self._measuring:
            return
        for value in units.values():
            if type(value) is not int and not (type(value) is float and math.isfinite(value)):
                _check_counts(units)
        name = self._local.__dict__.get("phase", DEFAULT_PHASE)  # no AttributeError raised
        phase = self._phases.get(name) or self._phase(name)
        counters = phase.counters
        with self._count_lock:
            for unit, value in units.items():
                counters[unit] = counters.get(unit, 0) + value

    # -- internals ---------------------------------------------------------------------------------------

    def _thread_stack(self) -> list[Frame]:
        local = self._local
        stack: list[Frame] | None = local.__dict__.get("stack")
        if stack is None:
            stack = [(None, self._phase(DEFAULT_PHASE).root, 0)]
            local.stack = stack
            with self._lock:
                self._stacks.append(stack)
        return stack

    def _phase(self, name: str) -> _Phase:
        phase = self._phases.get(name)
        if phase is None:
            with self._lock:
                phase = self._phases.setdefault(name, _Phase(name, self.window))
        return phase

    def _add_child(self, parent: _Node, name: str) -> _Node:
        with self._lock:
            node = parent.children.get(name)
            if node is None:
                node = parent.children[name] = _Node(parent.child_path(name), self.window)
            return node

    def _fold(self, node: _Node) -> None:
        with self._lock:
            for buf, stats in ((node.buf, node.stats), (node.device_buf, node.device_stats)):
                count = len(buf)
                chunk = buf[:count]
                del buf[:count]  # appends racing with this land after ``count`` and stay
                stats.add_batch(chunk)

    # -- results -----------------------------------------------------------------------------------------

    def summary(self) -> Summary:
        """An immutable snapshot of everything recorded so far (open blocks are not included)."""
        from ._saved import build_metadata

        with self._lock:
            if self._device is not None:
                self._device.drain()  # the one synchronize: everything pending is resolved now
            phases = {}
            for name, phase in self._phases.items():
                stages: dict[str, StageStats] = {}
                _collect(self, phase.root, stages)
                if stages or phase.counters or phase.workers:
                    phases[name] = PhaseSummary(
                        name,
                        stages,
                        phase.counters,
                        phase.loop_ns,
                        phase.steps,
                        DeviceLoad(
                            phase.device_busy_ns, phase.device_idle_ns, phase.device_steps, phase.device_caught_up
                        ),
                        {worker_id: totals.stats(worker_id) for worker_id, totals in sorted(phase.workers.items())},
                    )
            ooms = tuple(self._device.out_of_memory) if self._device is not None else ()
            return Summary(phases, self._elapsed_ns() * 1e-9, build_metadata(self), ooms)

    def report(self) -> str:
        """The human-readable table of :meth:`summary`."""
        from ._render import render_text

        return render_text(self.summary())

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the run as JSON (atomically: a temporary file renamed over ``path``)."""
        from ._saved import save_summary

        save_summary(self.summary(), path)

    def load(self, path: str | os.PathLike[str]) -> Summary:
        """Read a saved run; the same as ``stepwatch.load``."""
        from ._saved import load_summary

        return load_summary(path)

    def devices(self) -> list[str]:
        """Devices used over the whole run, across resumes, oldest first."""
        from ._saved import detect_devices

        devices = list(self._devices_before)
        current = [self._device.backend.name] if self._device is not None else detect_devices()
        for device in current:
            if not devices or devices[-1] != device:
                devices.append(device)
        return devices

    def _elapsed_ns(self) -> int:
        running = self._clock() - self._session_start_ns if self._started_wall is not None else 0
        return self._elapsed_before_ns + running

    # -- checkpointing -----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Plain Python data (dicts, lists, str, int, float, None): safe for ``torch.load(weights_only=True)``."""
        summary = self.summary()
        with self._lock:
            return {
                "stepwatch_state": STATE_VERSION,
                "summary": summary.to_dict(),
                "schedule_pos": {name: phase.schedule_pos for name, phase in self._phases.items()},
                "elapsed_ns": self._elapsed_ns(),
                "started_at": self._started_wall,
                "devices": self.devices(),
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Carry on from :meth:`state_dict`: totals, counters, schedule position, elapsed time, devices."""
        from ._saved import FormatError

        if not isinstance(state, dict) or state.get("stepwatch_state") != STATE_VERSION:
            raise FormatError("<state_dict>", "not a stepwatch state_dict of version 1")
        try:
            summary = Summary.from_dict(state["summary"])
            positions = {str(k): int(v) for k, v in dict(state["schedule_pos"]).items()}
            elapsed_ns = int(state["elapsed_ns"])
            devices = [str(d) for d in state["devices"]]
            started = state["started_at"]
            for phase_summary in summary.phases.values():
                for path, stage in phase_summary.stages.items():
                    if not stage.spread and path.rsplit("/", 1)[-1] != OTHER:
                        raise ValueError(f"stage {path!r} has no measurements of its own")
        except (KeyError, TypeError, ValueError) as error:
            raise FormatError("<state_dict>", f"corrupt state_dict: {error}") from error
        with self._lock:
            for stack in self._stacks:
                del stack[1:]
            self._phases = {}
            self._worker_nodes = {}
            for name, phase_summary in summary.phases.items():
                phase = self._phase(name)
                phase.counters = dict(phase_summary.counters)
                phase.loop_ns = phase_summary.loop_ns
                phase.steps = phase_summary.steps
                for path, stage in phase_summary.stages.items():
                    *parents, leaf = path.split("/")
                    node = phase.root
                    for part in parents:
                        node = node.children.get(part) or self._add_child(node, part)
                    if leaf != OTHER:  # derived again from the totals
                        child = node.children.get(leaf) or self._add_child(node, leaf)
                        child.stats = stage.to_running()
                        if stage.device is not None:
                            child.device_stats = stage.device.to_running()
                        if stage.peak_allocated is not None:
                            child.peak_allocated = stage.peak_allocated
                        if stage.peak_reserved is not None:
                            child.peak_reserved = stage.peak_reserved
                        child.in_workers = stage.in_workers
                for worker_id, worker in phase_summary.workers.items():
                    totals = phase.workers[worker_id] = _WorkerTotals()
                    totals.batches, totals.busy_ns, totals.wait_ns = worker.batches, worker.busy_ns, worker.wait_ns
                    totals.wall_before_ns = worker.wall_ns
                phase.device_busy_ns = phase_summary.device.busy_ns
                phase.device_idle_ns = phase_summary.device.idle_ns
                phase.device_steps = phase_summary.device.steps
                phase.device_caught_up = phase_summary.device.caught_up
            for name, position in positions.items():
                self._phase(name).schedule_pos = position
            for stack in self._stacks:
                stack[0] = (None, self._phase(DEFAULT_PHASE).root, 0)
            self._elapsed_before_ns = elapsed_ns
            self._session_start_ns = self._clock()
            self._started_wall = float(started) if started is not None else time.time()
            self._devices_before = devices


def _collect(stopwatch: Stopwatch, node: _Node, out: dict[str, StageStats]) -> None:
    """Adds ``node``'s recorded descendants to ``out``, depth first, each parent before its children and
    ``<parent>/other`` (derived from the totals) after them."""
    for child in node.children.values():
        if child.buf or child.device_buf:
            stopwatch._fold(child)
        below: dict[str, StageStats] = {}
        _collect(stopwatch, child, below)
        if child.stats.calls == 0 and not below:
            continue
        parent = StageStats.from_running(child.path, child.stats)
        if child.in_workers:
            parent = replace(parent, in_workers=True)
        if child.device_stats.calls or child.peak_allocated >= 0:
            parent = parent.with_device(
                StageStats.from_running(child.path, child.device_stats) if child.device_stats.calls else None,
                child.peak_allocated if child.peak_allocated >= 0 else None,
                child.peak_reserved if child.peak_reserved >= 0 else None,
            )
        out[child.path] = parent
        out.update(below)
        direct = [
            below[grandchild.path]
            for grandchild in child.children.values()
            # time measured in workers ran beside a main-process parent, not inside it
            if grandchild.path in below and grandchild.in_workers == child.in_workers
        ]
        if direct and parent.calls:
            other = StageStats.uncovered(parent, direct)
            out[other.path] = replace(other, in_workers=True) if child.in_workers else other


def _take_from(node: _Node, taken: dict[str, Partial]) -> None:
    """Folds each stage's measurements here (in the worker, beside the main process) and hands them over."""
    for child in node.children.values():
        stats = child.stats
        if stats.calls:  # more than a fold's worth since the last batch
            stats.add_batch(child.buf)
            child.buf = []
            taken[child.path] = stats.partial()
            stats.clear()
        elif child.buf:
            taken[child.path] = partial_of(child.buf, stats.window)
            child.buf = []
        _take_from(child, taken)


def _pop_frame(stack: list[Frame], frame: Frame) -> bool:
    """Removes ``frame`` (and anything left above it) from ``stack``; False if it is no longer there."""
    for position in range(len(stack) - 1, 0, -1):
        if stack[position] is frame:
            del stack[position:]
            return True
    return False


def _check_counts(units: Mapping[str, object]) -> None:
    for unit, value in units.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise TypeError(f"count({unit}=...) needs a finite number, got {value!r}")


def _check_name(name: object, what: str) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} name must be a non-empty string, got {name!r}")
    if "/" in name:
        raise ValueError(f"{what} name {name!r} must not contain '/': nesting blocks builds the hierarchy")
    if name == OTHER:
        raise ValueError(f"{what} name {OTHER!r} is reserved for the time a parent's blocks do not cover")
