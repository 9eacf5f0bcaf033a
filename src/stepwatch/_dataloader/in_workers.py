"""The data pipeline seen from inside: what runs in DataLoader worker processes, brought back with each batch.

Inside each worker process the module-level default stopwatch records every ``timed`` block (each sample's
``dataset`` read, transforms wrapped with :func:`timed_transform`, the ``collate``, and the user's own blocks);
when a batch is collated, the worker's measurements since the previous batch travel with that batch, inside a
small carrier. The main-process side (``watch``) unwraps it wherever the loader is iterated and hands the
report to the stopwatch while a ``watch()`` loop consumes the loader. Nothing depends on a worker exiting
cleanly: each batch carries its own timings.

With ``num_workers=0`` everything runs in the main process and is recorded directly, nested under the loader.
"""

from __future__ import annotations

import importlib
import operator
import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar, cast

from .. import _default_instance
from .._block_base import COMPILED
from .._constants import FOLD
from .._stats import Partial

if TYPE_CHECKING:
    from .._recorder import Stopwatch

T = TypeVar("T")


WorkerReport = (
    tuple[int, int, int, int, int, dict[str, Partial], int, int]
    | tuple[int, int, int, int, int, dict[str, Partial], int, int, list[tuple[str, int, int]]]
)
"""(worker id, pid, started, busy ns, ready ns, the batch's measurements, CPU ns, queued ns[, its events])"""
"""What one batch brings back from its worker, as a plain tuple (it pickles fastest): (worker id, pid, when the
worker started, how long it worked on the batch, when the batch was ready, in ns on CLOCK_MONOTONIC; its
stage statistics since its previous batch, ``{path: Partial}``, folded in the worker; the CPU time the worker
process spent on the batch, by its own CPU clock, and the time it spent runnable but waiting for a core (the
kernel's scheduler statistics; -1 where unknown): against the busy time, they tell a worker that computes, or
waits for a core, from one that waits on I/O)."""


class Carrier:
    """A batch travelling with its worker's report. Survives ``pin_memory`` (torch calls this method)."""

    __slots__ = ("batch", "report")

    def __init__(self, batch: Any, report: WorkerReport) -> None:
        self.batch = batch
        self.report = report

    def __reduce__(self) -> tuple[Any, ...]:
        return (Carrier, (self.batch, self.report))

    def pin_memory(self) -> Carrier:
        from torch.utils.data._utils.pin_memory import pin_memory

        return Carrier(pin_memory(self.batch), self.report)  # type: ignore[no-untyped-call]


class _WorkerState:
    """Per-process state of an instrumented worker (module-level: one per worker process)."""

    def __init__(self) -> None:
        self.active = False
        self.worker_id = -1
        self.pid = 0
        self.started_ns = 0
        self.fetch_started_ns: int | None = None
        self.fetch_cpu_ns = 0  # the worker process's CPU clock when its batch started
        self.fetch_queued_ns = 0  # its time spent runnable, waiting for a core, when its batch started
        self.schedstat: int | None = None  # /proc/self/schedstat, kept open (Linux); None elsewhere

    def fetch_started(self) -> None:
        """The worker started on a batch: its wall and CPU clocks now, and its time waiting for a core."""
        self.fetch_started_ns = time.perf_counter_ns()
        self.fetch_cpu_ns = time.process_time_ns()
        self.fetch_queued_ns = self.queued_ns()

    def queued_ns(self) -> int:
        """Nanoseconds this process has spent runnable but not running (waiting on a run queue for a core),
        from the kernel's scheduler statistics; -1 where the kernel does not say."""
        if self.schedstat is None:
            return -1
        try:
            return int(os.pread(self.schedstat, 128, 0).split()[1])
        except (OSError, ValueError, IndexError):
            return -1

    def start(self, worker_id: int) -> None:
        self.active = True
        self.worker_id = worker_id
        self.pid = os.getpid()
        self.started_ns = time.perf_counter_ns()  # CLOCK_MONOTONIC: comparable across processes of one host
        self.fetch_started_ns = None
        try:
            self.schedstat = os.open("/proc/self/schedstat", os.O_RDONLY)  # this worker's own, opened in it
        except OSError:
            self.schedstat = None


_state = _WorkerState()


def _default_stopwatch() -> Stopwatch:
    return _default_instance.stopwatch


class TimedCollate:
    """Wraps a ``collate_fn``: times it as ``collate`` and, in a worker, sends the worker's timings along.

    In the main process (``num_workers=0``) it times only while a ``watch()`` loop consumes the loader
    (``watching``), so the loader iterated directly records nothing. Its attributes are slots, which the compiled
    collate of a single-process loader reads in place at each batch (``configure_collate``)."""

    __slots__ = ("_stopwatch", "collate_fn", "enabled", "watching")

    def __init__(self, collate_fn: Callable[[Any], Any], stopwatch: Stopwatch | None) -> None:
        self.collate_fn = collate_fn
        self.enabled = False
        self.watching = False
        self._stopwatch = stopwatch  # the main process's; not sent to workers

    def __getstate__(self) -> dict[str, Any]:
        return {"collate_fn": self.collate_fn, "enabled": self.enabled, "watching": False, "_stopwatch": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name in self.__slots__:
            setattr(self, name, state[name])

    def __call__(self, samples: Any) -> Any:
        if not self.enabled:
            return self.collate_fn(samples)
        if not _state.active:  # the main process (num_workers=0): recorded directly under the loader
            if not self.watching:
                return self.collate_fn(samples)
            stopwatch = self._stopwatch or _default_instance.stopwatch
            if stopwatch is _default_instance.stopwatch or not _default_instance.lends_to(stopwatch):
                with stopwatch.timed("collate"):
                    return self.collate_fn(samples)
            with _default_instance.lent_to(stopwatch), stopwatch.timed("collate"):
                return self.collate_fn(samples)
        stopwatch = _default_stopwatch()
        if _state.fetch_started_ns is None:
            _state.fetch_started()
        start, cpu_start = _state.fetch_started_ns, _state.fetch_cpu_ns
        with stopwatch.timed("collate"):
            batch = self.collate_fn(samples)
        ready = time.perf_counter_ns()
        cpu = time.process_time_ns() - cpu_start
        queued_before, queued_now = _state.fetch_queued_ns, _state.queued_ns()
        queued = queued_now - queued_before if queued_before >= 0 and queued_now >= 0 else -1
        busy = ready - cast(int, start)
        _state.fetch_started_ns = None
        taken = stopwatch.workers.take()
        report: WorkerReport = (_state.worker_id, _state.pid, _state.started_ns, busy, ready, taken, cpu, queued)
        if stopwatch.timeline is not None:  # the timeline is kept: the batch's events ride along
            report = (*report, stopwatch.timeline.take_worker_events())
        return Carrier(batch, report)


if COMPILED:  # where its slots are, for the compiled collate (_slots.c)
    from .._speedups import configure_collate  # type: ignore[import-not-found,unused-ignore]

    configure_collate(TimedCollate)


BATCHED = "dataset_batch"
"""The row of a dataset that fetches whole batches itself (its own ``__getitems__``, as Hugging Face
``datasets`` do): one call per batch, named apart so that it is never compared with per-sample ``dataset``."""


class TimedGetItems:
    """Set as a map-style dataset's ``__getitems__`` (an instance attribute the DataLoader's fetcher looks
    up): times each sample as ``dataset`` and marks when the worker started on the batch. A dataset that
    fetches batches itself is timed per batch, as ``dataset_batch``."""

    def __init__(self, dataset: Any, inner: Callable[[Any], Any] | None, stopwatch: Stopwatch | None) -> None:
        self.dataset = dataset
        self.inner = inner
        self._stopwatch = stopwatch

    def __getstate__(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "inner": self.inner, "_stopwatch": None}

    def __call__(self, indices: Any) -> Any:
        if _state.active:
            stopwatch = _default_stopwatch()
            if _state.fetch_started_ns is not None:  # the previous batch failed before its collate: its
                stopwatch.workers.take()  # measurements never reached the loop, so they must not ride on this batch
            _state.fetch_started()
            return self.read(stopwatch, indices)
        stopwatch = self._stopwatch or _default_instance.stopwatch
        if stopwatch is _default_instance.stopwatch or not _default_instance.lends_to(stopwatch):
            return self.read(stopwatch, indices)
        with _default_instance.lent_to(stopwatch):
            return self.read(stopwatch, indices)

    def read(self, stopwatch: Stopwatch, indices: Any) -> Any:
        if self.inner is not None:
            with stopwatch.timed(BATCHED):
                return self.inner(indices)
        block = stopwatch.timed("dataset")
        dataset = self.dataset
        stacks = stopwatch.stacks
        if stacks.measuring is not True:  # off, or dropping: each sample as a block would be
            samples: list[Any] = []
            for index in indices:
                with block:
                    samples.append(dataset[index])
            return samples
        # one clock pair for the whole batch, whatever its size: the row's total and calls (one per sample) stay
        # exact, its mean is the mean per sample, and its spread describes batches (see RunningStats.add_samples)
        local = stacks.local
        try:
            stack = local.stack
        except AttributeError:
            stack = stacks.thread_stack()
        remaining = iter(indices)
        parent = stack[-1][1]
        node = parent.children.get("dataset") or stopwatch.tree.add_child(parent, "dataset")
        clock = stopwatch.clock
        start = clock()
        frame = (block, node, start)
        stack.append(frame)
        read = 1  # calls, should even the first read fail
        try:
            samples = [dataset[index] for index in remaining]  # torch's own loop: nothing added per sample
            read = len(samples)
        except BaseException:  # the samples read, and the one that failed
            left = operator.length_hint(remaining, -1)
            if left >= 0 and hasattr(indices, "__len__"):
                read = len(indices) - left
            raise
        finally:
            end = clock()
            if stack[-1] is frame:
                del stack[-1]
                if stacks.local is local and node is not parent:  # not switched; (DROPPED is its own child)
                    batches = node.batches
                    batches.append((read, end - start))  # folded as a block's buffer is: no lock taken here
                    if len(batches) >= FOLD:
                        stacks.fold(node)
                    timeline = stopwatch.timeline
                    if timeline is not None:
                        timeline.events += (node, start, end, stack)
            elif stacks.local is local and stacks.hot:
                stacks.unwind(stack, block)  # blocks left open inside the read: as Block does
        return samples


_imported: dict[tuple[str, str], Any] = {}


def imported(module: str, name: str) -> Any:
    """``from <module> import <name>`` (torch's, at a loop's start), run once a process: an import statement of a
    module long imported still runs the import machinery, about 15 us of cold code where the model's work left it."""
    try:
        return _imported[module, name]
    except KeyError:
        value = _imported[module, name] = getattr(importlib.import_module(module), name)
        return value


def dataset_timing(dataset: Any, stopwatch: Stopwatch | None) -> TimedGetItems | None:
    """The wrapper that times a map-style dataset's samples (None for iterable datasets)."""
    iterable = imported("torch.utils.data", "IterableDataset")
    if isinstance(dataset, iterable) or not hasattr(type(dataset), "__getitem__"):
        return None
    inner = getattr(dataset, "__getitems__", None) or None
    if inner is not None and _per_sample_subset(dataset):
        inner = None  # Subset's own __getitems__ only indexes its dataset sample by sample: so do we, timed
    return TimedGetItems(dataset, inner, stopwatch)


def install_dataset_timing(dataset: Any, stopwatch: Stopwatch | None) -> TimedGetItems | None:
    """In a worker: times its copy of a map-style dataset's samples, as the copy's ``__getitems__`` (the
    fetcher reads it at each batch); returns the installed wrapper (None for iterable datasets or objects that
    take no attributes). In the main process, :class:`TimedReads` times the reads of one iterator instead."""
    current = dataset.__dict__.get("__getitems__") if hasattr(dataset, "__dict__") else None
    if isinstance(current, TimedGetItems):
        return current
    wrapper = dataset_timing(dataset, stopwatch)
    if wrapper is None:
        return None
    try:
        dataset.__getitems__ = wrapper
    except (AttributeError, TypeError):
        return None
    return wrapper


class _TimedIterable:
    """Iterates a worker's copy of an IterableDataset, timing each item as ``dataset`` and marking when the
    worker started on each batch (its first item), as ``__getitems__`` does for map-style datasets."""

    def __init__(self, iterator: Iterator[Any]) -> None:
        self.iterator = iterator
        self.block = _default_stopwatch().timed("dataset")

    def __iter__(self) -> _TimedIterable:
        return self

    def __next__(self) -> Any:
        if _state.fetch_started_ns is None:
            _state.fetch_started()
        with self.block:
            return next(self.iterator)


def _time_iterable(dataset: Any) -> bool:
    """In a worker: times its copy of an IterableDataset by giving the copy a subclass whose ``__iter__`` wraps
    the original (the copy is the worker's own; the user's object is untouched). False where it cannot."""
    from torch.utils.data import IterableDataset

    if not isinstance(dataset, IterableDataset):
        return False
    original = type(dataset)
    timed = type(original.__name__, (original,), {"__iter__": lambda self: _TimedIterable(original.__iter__(self))})
    try:
        dataset.__class__ = timed
    except TypeError:
        return False
    return True


def _per_sample_subset(dataset: Any) -> bool:
    """A ``Subset`` (from ``random_split``) over a dataset without its own ``__getitems__``: its samples can be
    read one by one, with the same result as its batch method."""
    from torch.utils.data import Subset

    if getattr(type(dataset), "__getitems__", None) is not Subset.__getitems__:
        return False
    inner = getattr(dataset, "dataset", None)
    return not callable(getattr(inner, "__getitems__", None)) or _per_sample_subset(inner)


def in_worker() -> bool:
    """Whether this process is an instrumented DataLoader worker (its batches leave in carriers)."""
    return _state.active


def unwrapped(function: Any) -> Any:
    """A loader's own ``collate_fn`` or ``worker_init_fn``, without the wrapper ``watch()`` puts on it (its
    workers send their batches inside carriers that only a watched loop unwraps); anything else as it is."""
    if isinstance(function, TimedCollate):
        return function.collate_fn
    if isinstance(function, WorkerInit):
        return function.worker_init_fn
    return function


class WorkerInit:
    """Wraps a ``worker_init_fn``: in each worker, starts a clean, enabled default stopwatch that never
    autosaves (the main process owns the run file), and times the worker's copy of the dataset."""

    def __init__(self, worker_init_fn: Callable[[int], Any] | None) -> None:
        self.worker_init_fn = worker_init_fn
        self.enabled = False
        self.trace = False  # the watching stopwatch keeps a timeline: so do the workers
        self.watcher: Stopwatch | None = None
        """The stopwatch that watches the loader. In a forked worker, its copy becomes the worker's default
        stopwatch (they share one state), so blocks on either record together and come back alike."""

    def __getstate__(self) -> dict[str, Any]:  # spawned workers: a stopwatch does not travel
        return {"worker_init_fn": self.worker_init_fn, "enabled": self.enabled, "trace": self.trace, "watcher": None}

    def __call__(self, worker_id: int) -> None:
        if not self.enabled:
            if self.worker_init_fn is not None:
                self.worker_init_fn(worker_id)
            return
        from torch.utils.data import get_worker_info

        stopwatch = _default_stopwatch()
        stopwatch.workers.start(self.trace)
        if self.watcher is not None and self.watcher is not stopwatch:
            _default_instance.share_state(self.watcher)  # the worker's own copy of it, in this process only
        if self.worker_init_fn is not None:  # start-up: its own row (worker_init [w]), never idle time
            with stopwatch.timed("worker_init"):
                self.worker_init_fn(worker_id)
        _state.start(worker_id)  # busy and idle are counted from here
        info = get_worker_info()
        if info is not None and install_dataset_timing(info.dataset, None) is None:
            _time_iterable(info.dataset)
