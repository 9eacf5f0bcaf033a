"""Recording: the :class:`Stopwatch`, its switch, its counters, and the growth of its stage tree.

The Stopwatch is the public face and the composition of parts, each owned by its module (see the class's
docstring): timed blocks live in ``_blocks``, timed iterators in ``_loops``, the data they record in ``_tree``,
the per-thread stacks and the switch's flags in ``_stacks``, summaries and saving in ``_results``,
checkpointing in ``_checkpoint``, the DataLoader workers' side in ``_dataloader.reports``. Switching
(``disable``, ``reset``, ``load_state_dict``) never edits another thread's stack; see ``_stacks``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ._blocks import Block, Blocks, block_lookup, check_loop_names, check_name
from ._compile import CompileWatch
from ._counters import add_counts, counter
from ._dataloader.reports import WorkerSide
from ._dataloader.watch import WatchedLoader
from ._device import DeviceTimer
from ._flops import FlopCount
from ._live import LiveView
from ._loop_sites import OpenLoops
from ._loops import timed_loop
from ._peaks import check_peak
from ._periodic import PeriodicCalls
from ._results import Results, save_run
from ._run_span import RunSpan
from ._schedule import Schedule, check_flag, check_steps, check_window, out_path
from ._self_cost import InSitu, calibrate, calibrating
from ._stacks import DROPPING, ThreadStacks
from ._stats import DEFAULT_WINDOW
from ._trace import MAX_TRACE_STEPS, Trace
from ._tree import StageTree
from ._window_end import WindowEnd, check_stop
from ._windows import Windows

T = TypeVar("T")
logger = logging.getLogger("stepwatch")


@dataclass
class AutoHooks:
    """What auto-instrumentation plugs into a recording: ``describe`` gives the report's first line (what it
    found), ``end_evaluation`` ends its evaluation loop open on this thread, if any (a block closing around
    it)."""

    describe: Callable[[], str] | None = None
    end_evaluation: Callable[[], bool] | None = None


class Stopwatch(Results):
    """Records where a training loop's time goes.

    Args:
        warmup: steps skipped at the start of each timed iterator (each epoch warms up again).
        active: steps measured after warm-up; ``None`` measures every step.
        every: with ``active``, measure ``active`` steps out of every ``every`` steps.
        window: recent measurements kept per stage for percentiles and the per-measurement export (at most
            :data:`~stepwatch._schedule.MAX_WINDOW`).
        device: also time each stage on this device with events, and track its peak memory: ``"cuda"``,
            ``"cuda:1"``, a ``torch.device``, or any :class:`~stepwatch._device.DeviceBackend`. The device is
            opened when the stopwatch is enabled, never at import or construction.
        sync: exact synchronous mode: synchronize the device at every stage boundary, so that wall times
            include the device work (this changes what is measured; the report says it was on).
        nvtx: push an NVTX range per stage, so Nsight Systems shows the same stages by name.
        memory: ``"step"`` (default) tracks the device's peak memory per step, with one read of the allocator's
            statistics per step; ``"stage"`` per timed block too, at two reads per block.
        live: show the live view on stderr while it trains (a panel on a terminal; see ``_live``).
        flops: count the FLOPs of one training step (kept out of the timing; see ``_flops``): the report gives
            FLOP/s, and MFU on a known accelerator.
        peak_flops: the device's peak FLOP/s for MFU, where the built-in table (``_peaks``) does not know it;
            implies ``flops``.
        stop: end the program when the measured window closes (``active`` steps, no ``every``), after its report,
            as ``sys.exit(0)`` would (see ``_window_end``).
        trace_steps: keep the timeline (start and duration of every block, DataLoader workers' included) of
            the last this many measured steps, for ``stepwatch export run.json -o trace.json``. Off by default.
        clock: a nanosecond clock; tests inject a controllable one.

    Off until :meth:`enable` is called. The module-level functions of ``stepwatch`` use one default instance;
    separate instances are independent.

    Parts of the recording, each owned by its module, not API: ``stacks``
    (:class:`~stepwatch._stacks.ThreadStacks`), each thread's stack of open frames and the switch's flags;
    ``tree`` (:class:`~stepwatch._tree.StageTree`), the recorded stages of every phase, and the lock;
    ``schedule`` (:class:`~stepwatch._schedule.Schedule`), warm-up and the measured window; ``periodic``
    (:class:`~stepwatch._periodic.PeriodicCalls`), what runs every N training steps; ``span``
    (:class:`~stepwatch._run_span.RunSpan`), when the run started and how long it ran, across resumes;
    ``device_timer`` (:class:`~stepwatch._device.DeviceTimer`, with a device), the device's events and peak
    memory; ``timeline`` (:class:`~stepwatch._trace.Trace`, with ``trace_steps``), the recent steps' block
    events; ``loops`` (:class:`~stepwatch._loop_sites.OpenLoops`), the timed iterators open on each thread;
    ``workers`` (:class:`~stepwatch._dataloader.reports.WorkerSide`), the DataLoader workers' side;
    ``auto_hooks`` (:class:`AutoHooks`), what auto-instrumentation plugs in. The settings given are kept as
    ``device``, ``sync``, ``nvtx``, ``memory``, ``window`` and ``clock``.
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
        memory: str = "step",
        trace_steps: int | None = None,
        stop: bool = False,
        live: bool = False,
        flops: bool = False,
        peak_flops: float | None = None,
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self.schedule = Schedule(warmup, active, every)
        self.window_end = WindowEnd()
        self.window_end.stop = check_stop(stop, self.schedule)
        check_flag(live, "live")
        check_flag(flops, "flops")
        self.peak_flops = check_peak(peak_flops)
        if (sync or nvtx) and device is None:
            raise ValueError("sync and nvtx need a device, e.g. Stopwatch(device='cuda', sync=True)")
        if not callable(clock):
            raise ValueError(f"clock must be a callable returning nanoseconds, got {clock!r}")
        if memory not in ("step", "stage"):
            raise ValueError(f"memory must be 'step' (peak per step) or 'stage' (per stage too), got {memory!r}")
        self.device = device  # as given (None: no device timing); opened as device_timer when enabled
        self.memory = memory
        self.sync = bool(sync)
        self.nvtx = bool(nvtx)
        self.window = check_window(window)
        self.clock = clock
        self.live: LiveView | None = LiveView(self) if live else None
        self.out: str | None = None
        self.tree = StageTree(self.window)
        self.span = RunSpan(clock)
        self.auto_hooks = AutoHooks()
        self._blocks = Blocks(self)
        self._by_name = self._blocks.by_name  # a handle for timed()'s hot path (never rebound)
        self.stacks = ThreadStacks(self.tree, self.span, self.auto_hooks, self._blocks)
        # count() and timed(), bound: their common case in C where compiled (a subclass's own methods are kept)
        if type(self).count is Stopwatch.count:
            self.count = self._blocks.count = counter(self)  # type: ignore[method-assign]
        if type(self).timed is Stopwatch.timed:
            self.timed = self._blocks.lookup = block_lookup(self)  # type: ignore[method-assign,assignment]
        self.periodic = PeriodicCalls()
        self.loops = OpenLoops()
        self.workers = WorkerSide(self, self._set_timeline)
        self.device_timer: DeviceTimer | None = None
        self.timeline: Trace | None = None
        self._gathers = 0  # gather_every's saves so far, naming each gather
        self.windows = Windows()  # each gather's window: the pre-synchronization time per step
        self.compiles = CompileWatch(self)  # torch.compile's compilations, once the program loads it
        self.in_situ: InSitu | None = None  # the cost of an operation where the training's operations run
        self._stop_gathering: Callable[[], None] | None = None
        if trace_steps is not None:
            self._keep_trace(trace_steps)
        self.flop_count: FlopCount | None = FlopCount(self) if flops or self.peak_flops is not None else None
        self._clear_run()

    # -- switching ---------------------------------------------------------------------------------------

    def enable(
        self,
        out: str | os.PathLike[str] | None = None,
        *,
        warmup: int | None = None,
        active: int | None = None,
        every: int | None = None,
        gather_every: int | None = None,
        trace_steps: int | None = None,
        stop: bool | None = None,
        live: bool | None = None,
        flops: bool | None = None,
        peak_flops: float | None = None,
    ) -> None:
        """Start recording. With ``out``, the run is also saved there at exit, on an uncaught exception and
        on SIGTERM/SIGINT (a relative path is resolved now, not at exit); in a job of several ranks, at exit
        each rank writes its own file and rank 0 also gathers every rank's summary into the all-ranks file
        at ``out``. ``gather_every``: also save so, ranks gathered, every that many steps of the training loop
        (a job killed later keeps them). ``warmup``, ``active`` and ``every``, when given, replace those parts
        of the schedule, and ``trace_steps`` the timeline kept (see :class:`Stopwatch`); the parts not given
        stay. ``stop``: end the program when the measured window closes (see :class:`Stopwatch`); when the window
        closes with ``out``, the run is saved and the report printed on stderr right then. ``live``: show the
        live view (True) or stop showing it (False). ``flops`` and ``peak_flops``: count a step's FLOPs (see
        :class:`Stopwatch`)."""
        schedule = self.schedule
        if warmup is not None or active is not None or every is not None:
            check_steps(warmup, "warmup", optional=True)
            schedule = Schedule(
                schedule.warmup if warmup is None else warmup,
                schedule.active if active is None else active,
                schedule.every if every is None else every,
            )
        stopping = self.window_end.stop if stop is None else check_stop(stop, schedule)
        if live is not None:
            check_flag(live, "live")
        if flops is not None:
            check_flag(flops, "flops")
        peak = check_peak(peak_flops)
        path = None if out is None else out_path(out)
        if gather_every is not None:
            check_steps(gather_every, "gather_every", optional=False)
            if gather_every < 1 or path is None:
                raise ValueError(f"gather_every needs out= and a positive number of steps, got {gather_every!r}")
        if trace_steps is not None:
            self._keep_trace(trace_steps)
        stacks = self.stacks
        with self.tree.lock:
            if self._stop_gathering is not None:
                self._stop_gathering()
                self._stop_gathering = None
            if gather_every is not None:
                self._stop_gathering = self.periodic.add(gather_every, self._save_during_run, "gather_every")
            self.schedule = schedule
            self.window_end.stop = stopping
            if live and self.live is None:
                self.live = LiveView(self)
            elif live is False and self.live is not None:
                self.live.close()
                self.live = None
            if peak is not None:
                self.peak_flops = peak
            if (flops or peak is not None) and self.flop_count is None:
                self.flop_count = FlopCount(self)
            self._open_device()
            if not calibrating():
                calibrate(Stopwatch)  # stepwatch's own cost per block, measured once in this process (a few ms)
                if self.in_situ is None:
                    self.in_situ = InSitu(self, Stopwatch)  # and where the training's blocks run
            self.compiles.install()
            self.span.start()
            if stacks.measuring is DROPPING:  # each thread's stack is rebuilt with the blocks opened while off
                stacks.drop_open_frames()
            stacks.enabled = True
            stacks.was_enabled = True
            stacks.update_flags()
            self._blocks.follow_switch()
        if path is not None:
            from ._save_at_exit import install

            self.out = path
            install(self)

    def log_every(self, n: int, callback: Callable[[dict[str, float]], Any]) -> Callable[[], None]:
        """Calls ``callback(stepwatch.metrics())`` every ``n`` training steps, from the training loop:
        ``stepwatch.log_every(100, wandb.log)``, ``log_every(100, mlflow.log_metrics)``. Returns a function that
        stops it. A callback that raises is reported once on the ``stepwatch`` logger and not called again:
        a failing logger never stops the training."""
        if not callable(callback):  # refused now, not at the n-th step
            raise TypeError(f"callback must be callable, got {callback!r}")

        def call(step: int) -> None:
            callback(self.metrics())

        return self.periodic.add(n, call, getattr(callback, "__qualname__", repr(callback)))

    def _save_during_run(self, step: int) -> None:
        """``gather_every``'s save: each rank writes its file, rank 0 gathers the all-ranks file."""
        if self.out is None:
            return
        self._gathers += 1
        try:
            self.windows.note(self.summary())
            save_run(self, self.out, gather=True, tag=f"{self.out}#{self._gathers}", among=self.out)
        except Exception as error:
            logger.error("stepwatch: could not save the run to %s during the run: %s", self.out, error)

    def _keep_trace(self, steps: int) -> None:
        """Keep the timeline of the last ``steps`` measured steps from now on (``trace_steps``)."""
        check_steps(steps, "trace_steps", optional=False)
        if not 1 <= steps <= MAX_TRACE_STEPS:
            raise ValueError(f"trace_steps must be from 1 to {MAX_TRACE_STEPS:,}, got {steps}")
        self._set_timeline(Trace(steps))

    def _set_timeline(self, timeline: Trace | None) -> None:
        """The one place the timeline is replaced: the parts that add to it see the new one, and the blocks are
        made again, traced or not."""
        self.timeline = self.stacks.timeline = timeline
        if self.device_timer is not None:
            self.device_timer.trace = timeline
        self._blocks.clear()

    def _open_device(self) -> None:
        if self.device_timer is None and self.device is not None:
            from ._device import make_backend

            self.device_timer = DeviceTimer(
                make_backend(self.device),
                sync=self.sync,
                nvtx=self.nvtx,
                fold=self.stacks.fold,
                stage_memory=self.memory == "stage",
                clock=self.clock,
            )
            self.device_timer.trace = self.timeline

    def use_device(self, device: Any) -> None:
        """Time on ``device`` from now on, as ``Stopwatch(device=...)`` does, when this stopwatch was made
        without one (auto-instrumentation calls it once it finds the model's device): blocks made from now are
        device blocks; loops started from now time the device. A device cannot be changed once given."""
        with self.tree.lock:
            if self.device is not None:
                return
            self.device = device
            try:
                if self.stacks.enabled:
                    self._open_device()
            except BaseException:
                self.device = None  # the device cannot be opened: nothing changes
                raise
            self._blocks.clear()

    def disable(self) -> None:
        """Stop recording. What was recorded is kept; blocks still open are dropped, not half-counted."""
        if self.flop_count is not None:
            self.flop_count.finish()  # a FLOP count under way (its loop left in the counted step) ends here
        with self.tree.lock:
            self.stacks.enabled = False
            self.stacks.drop_open_frames()
            self.stacks.update_flags()
            self._blocks.follow_switch()

    def is_enabled(self) -> bool:
        return self.stacks.enabled

    def reset(self) -> None:
        """Forget everything recorded; the switch, the schedule and the autosave path stay. Inside a running
        loop, the step under way is dropped and the following ones are recorded as usual."""
        with self.tree.lock:
            self.stacks.drop_open_frames()
            for phase in self.tree.phases.values():
                phase.clear()
            self._clear_run()
            found = getattr(self.auto_hooks.describe, "__self__", None)
            if found is not None and not getattr(found, "active", True):  # auto-instrumentation has ended
                self.auto_hooks.describe = None
            if self.stacks.enabled:
                self.span.restart()

    def _clear_run(self) -> None:
        self.span.clear()
        self.window_end.clear()
        self.workers.nodes.clear()  # the nodes' "ran in workers" marks are cleared: found again from reports
        self.compiles.events.clear()  # the compilations of the run forgotten (a compilation under way is kept)
        if self.timeline is not None:
            self.timeline.clear()
        self.stacks.set_window(True)

    # -- recording ---------------------------------------------------------------------------------------

    def timed(self, stage: str) -> Block:
        """Time a block as ``with sw.timed("forward"):`` or decorate a function with ``@sw.timed("x")``.

        Blocks nest: a block opened inside another (or inside a :meth:`timed_iter` body) is its child, and the
        parent's uncovered time shows as ``<parent>/other``.
        """
        try:
            return self._by_name[stage]
        except KeyError:
            return self._blocks.make(stage)
        except TypeError:  # unhashable
            check_name(stage, "stage")
            raise

    def timed_iter(
        self, iterable: Iterable[T], stage: str = "loader", body: str = "step", phase: str | None = None
    ) -> Iterator[T]:
        """Iterate ``iterable``, timing the wait for each item under ``stage`` and the loop body under ``body``.

        The outermost timed iterator defines the steps that the schedule counts and the phase (default
        ``train``); pass ``phase="val"`` for a validation loop. A loop started while the stopwatch is off is
        the plain iterator and costs nothing.
        """
        check_loop_names(stage, body, phase)
        if not self.stacks.enabled:
            return iter(iterable)
        return timed_loop(self, iterable, stage, body, phase)

    def watch(
        self,
        loader: Any,
        stage: str = "loader",
        body: str = "step",
        phase: str | None = None,
        *,
        loaders: Sequence[Any] | None = None,
    ) -> WatchedLoader[Any]:
        """Iterate a ``torch.utils.data.DataLoader`` like :meth:`timed_iter`, with the data pipeline seen from
        inside: each sample's ``dataset`` read, ``collate`` and every ``stepwatch.timed`` block run in the
        workers come back under ``<stage>/...``, with per-worker figures. The loader is instrumented in place;
        iterated directly, with or without stepwatch, it yields exactly its own batches.

        ``loader`` may also be an iterable of DataLoaders (a loader of loaders): the DataLoaders among its
        attributes are found, or given as ``loaders``; the outer wait is timed once, each inner loader's
        workers are brought back and kept apart."""
        check_loop_names(stage, body, phase)
        return WatchedLoader(loader, self, stage, body, phase, loaders)

    count = add_counts
