"""The data pipeline seen from inside: timing in DataLoader workers, brought back with each batch.

``Stopwatch.watch(loader)`` instruments a DataLoader in place (its ``collate_fn`` and ``worker_init_fn``, the
two attributes a DataLoader lets one set after construction) and returns an iterable that times the loop like
``timed_iter``. Inside each worker process the module-level default stopwatch records every ``timed`` block
(each sample's ``dataset`` read, transforms wrapped with :func:`timed_transform`, the ``collate``, and the
user's own blocks); when a batch is collated, the worker's measurements since the previous batch travel with
that batch, inside a small carrier. The loader's own iterators unwrap it (``Unwrapping`` replaces the loader's
``_get_iterator``), so whoever iterates the loader gets exactly its batches; the report reaches the stopwatch
only while a ``watch()`` loop consumes the loader. Nothing depends on a worker exiting cleanly: each batch
carries its own timings.

With ``num_workers=0`` everything runs in the main process and is recorded directly, nested under the loader.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ._stats import Partial

if TYPE_CHECKING:
    from ._recorder import Stopwatch

T = TypeVar("T")


WorkerReport = tuple[int, int, int, int, int, dict[str, Partial]]
"""What one batch brings back from its worker, as a plain tuple (it pickles fastest): (worker id, pid, when the
worker started, how long it worked on the batch, when the batch was ready, in ns on CLOCK_MONOTONIC; and its
stage statistics since its previous batch, ``{path: Partial}``, folded in the worker)."""


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

    def start(self, worker_id: int) -> None:
        self.active = True
        self.worker_id = worker_id
        self.pid = os.getpid()
        self.started_ns = time.perf_counter_ns()  # CLOCK_MONOTONIC: comparable across processes of one host
        self.fetch_started_ns = None


_state = _WorkerState()


def _default_stopwatch() -> Stopwatch:
    import stepwatch

    return stepwatch._default


class TimedCollate:
    """Wraps a ``collate_fn``: times it as ``collate`` and, in a worker, sends the worker's timings along.

    In the main process (``num_workers=0``) it times only while a ``watch()`` loop consumes the loader
    (``watching``), so the loader iterated directly records nothing."""

    def __init__(self, collate_fn: Callable[[Any], Any], stopwatch: Stopwatch | None) -> None:
        self.collate_fn = collate_fn
        self.enabled = False
        self.watching = False
        self._stopwatch = stopwatch  # the main process's; not sent to workers

    def __getstate__(self) -> dict[str, Any]:
        return {"collate_fn": self.collate_fn, "enabled": self.enabled, "watching": False, "_stopwatch": None}

    def __call__(self, samples: Any) -> Any:
        if not self.enabled:
            return self.collate_fn(samples)
        if not _state.active:  # the main process (num_workers=0): recorded directly under the loader
            if not self.watching:
                return self.collate_fn(samples)
            stopwatch = self._stopwatch or _default_stopwatch()
            with stopwatch.timed("collate"):
                return self.collate_fn(samples)
        stopwatch = _default_stopwatch()
        collate_started = time.perf_counter_ns()
        start = _state.fetch_started_ns if _state.fetch_started_ns is not None else collate_started
        with stopwatch.timed("collate"):
            batch = self.collate_fn(samples)
        ready = time.perf_counter_ns()
        busy = ready - start
        _state.fetch_started_ns = None
        report = (_state.worker_id, _state.pid, _state.started_ns, busy, ready, stopwatch._take())
        return Carrier(batch, report)


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
            _state.fetch_started_ns = time.perf_counter_ns()
            stopwatch = _default_stopwatch()
        else:
            stopwatch = self._stopwatch or _default_stopwatch()
        if self.inner is not None:
            with stopwatch.timed(BATCHED):
                return self.inner(indices)
        block = stopwatch.timed("dataset")
        dataset = self.dataset
        samples = []
        for index in indices:
            with block:
                samples.append(dataset[index])
        return samples


def install_dataset_timing(dataset: Any, stopwatch: Stopwatch | None) -> TimedGetItems | None:
    """Times a map-style dataset's samples; returns the installed wrapper (None for iterable datasets or
    objects that take no attributes)."""
    from torch.utils.data import IterableDataset

    if isinstance(dataset, IterableDataset) or not hasattr(type(dataset), "__getitem__"):
        return None
    current = dataset.__dict__.get("__getitems__") if hasattr(dataset, "__dict__") else None
    if isinstance(current, TimedGetItems):
        return current
    inner = getattr(dataset, "__getitems__", None) or None
    if inner is not None and _per_sample_subset(dataset):
        inner = None  # Subset's own __getitems__ only indexes its dataset sample by sample: so do we, timed
    wrapper = TimedGetItems(dataset, inner, stopwatch)
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
            _state.fetch_started_ns = time.perf_counter_ns()
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


def remove_dataset_timing(dataset: Any, wrapper: TimedGetItems) -> None:
    if getattr(dataset, "__dict__", {}).get("__getitems__") is wrapper:
        del dataset.__getitems__


class WorkerInit:
    """Wraps a ``worker_init_fn``: in each worker, starts a clean, enabled default stopwatch that never
    autosaves (the main process owns the run file), and times the worker's copy of the dataset."""

    def __init__(self, worker_init_fn: Callable[[int], Any] | None) -> None:
        self.worker_init_fn = worker_init_fn
        self.enabled = False

    def __call__(self, worker_id: int) -> None:
        if not self.enabled:
            if self.worker_init_fn is not None:
                self.worker_init_fn(worker_id)
            return
        from torch.utils.data import get_worker_info

        stopwatch = _default_stopwatch()
        stopwatch._start_in_worker()
        if self.worker_init_fn is not None:  # start-up: its own row (worker_init [w]), never idle time
            with stopwatch.timed("worker_init"):
                self.worker_init_fn(worker_id)
        _state.start(worker_id)  # busy and idle are counted from here
        info = get_worker_info()
        if info is not None and install_dataset_timing(info.dataset, None) is None:
            _time_iterable(info.dataset)


class TimedTransform(Generic[T]):
    """A transform timed under ``name`` on the default stopwatch, picklable for spawned workers.

    ``stepwatch.timed_transform(fn, "augment")``; inside a dataset's ``__getitem__`` it shows as
    ``loader/dataset/augment``."""

    def __init__(self, fn: Callable[..., T], name: str | None = None) -> None:
        self.fn = fn
        self.name = name or getattr(fn, "__name__", None) or type(fn).__name__

    def __call__(self, *args: Any, **kwargs: Any) -> T:
        with _default_stopwatch().timed(self.name):
            return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"timed_transform({self.fn!r}, {self.name!r})"


def loader_config(loader: Any) -> dict[str, Any] | None:
    """What the advice depends on, read off a DataLoader (None for anything else): workers, batch size,
    prefetching, persistence, pinning, the dataset's kind, the start method, torch's compute threads and the
    machine's cores."""
    if not all(hasattr(loader, name) for name in ("num_workers", "collate_fn", "dataset")):
        return None
    import multiprocessing

    workers = getattr(loader, "num_workers", 0)
    context = getattr(loader, "multiprocessing_context", None)
    method = getattr(context, "_name", None) or (context if isinstance(context, str) else None)
    torch = sys.modules.get("torch")
    iterable = type(getattr(loader, "dataset", None)).__mro__
    return {
        "num_workers": workers if isinstance(workers, int) else None,
        "batch_size": getattr(loader, "batch_size", None)
        if isinstance(getattr(loader, "batch_size", None), int)
        else None,
        "prefetch_factor": getattr(loader, "prefetch_factor", None) if workers else None,
        "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
        "pin_memory": bool(getattr(loader, "pin_memory", False)),
        "dataset": "iterable" if any(cls.__name__ == "IterableDataset" for cls in iterable) else "map",
        "start_method": (method or multiprocessing.get_start_method(allow_none=True) or "default") if workers else None,
        "torch_threads": int(torch.get_num_threads())
        if torch is not None and hasattr(torch, "get_num_threads")
        else None,
        "cpu_count": os.cpu_count(),
    }


class Unwrapping:
    """Set as a watched DataLoader's ``_get_iterator``: every iterator it makes hands out plain batches,
    whoever iterates the loader (a ``watch()`` loop, the loader used directly, a library, after ``disable()``),
    since workers started while watched keep wrapping batches in :class:`Carrier`. The reports go to
    ``receiver`` while a ``watch()`` loop consumes the loader, and are dropped otherwise."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.receiver: Callable[[WorkerReport], None] | None = None
        iterator = loader.__dict__.get("_iterator")
        if iterator is not None:  # persistent workers started before watch()
            self.wrap(iterator)
            logging.getLogger("stepwatch").warning(
                "stepwatch: this DataLoader's persistent workers started before watch(), so what they do cannot"
                " be seen (no dataset, collate or per-worker rows) until they restart; call watch() before the"
                " loader is first iterated"
            )

    def __getstate__(self) -> dict[str, Any]:
        return {"loader": self.loader, "receiver": None}

    def __call__(self) -> Any:
        return self.wrap(type(self.loader)._get_iterator(self.loader))

    def wrap(self, iterator: Any) -> Any:
        next_data = iterator._next_data

        def unwrapped_next_data() -> Any:
            item = next_data()
            if type(item) is Carrier:
                receiver = self.receiver
                if receiver is not None:
                    receiver(item.report)
                return item.batch
            return item

        iterator._next_data = unwrapped_next_data
        return iterator


def _install_unwrapping(loader: Any) -> Unwrapping | None:
    current = loader.__dict__.get("_get_iterator")
    if isinstance(current, Unwrapping):
        return current
    if not callable(getattr(type(loader), "_get_iterator", None)):
        return None
    unwrapping = Unwrapping(loader)
    loader._get_iterator = unwrapping
    return unwrapping


class WatchedLoader(Generic[T]):
    """Iterates a DataLoader like ``timed_iter``, bringing back the timings its workers measured. The batches
    are exactly what the DataLoader yields."""

    def __init__(
        self, loader: Any, stopwatch: Stopwatch, stage: str = "loader", body: str = "step", phase: str | None = None
    ) -> None:
        if not all(hasattr(loader, name) for name in ("collate_fn", "worker_init_fn", "num_workers", "dataset")):
            raise TypeError(
                f"watch() needs a torch.utils.data.DataLoader, got {type(loader).__name__}; time any other"
                " iterable with timed_iter()"
            )
        self.loader = loader
        self.stopwatch = stopwatch
        self.stage, self.body, self.phase = stage, body, phase
        unwrapping = _install_unwrapping(loader)
        if unwrapping is None:
            raise TypeError(f"watch() cannot instrument {type(loader).__name__}: use timed_iter() instead")
        self._unwrapping = unwrapping
        collate = loader.collate_fn
        if not isinstance(collate, TimedCollate):
            collate = TimedCollate(collate, stopwatch)
            loader.collate_fn = collate
        self._collate = collate
        init = loader.worker_init_fn
        if not isinstance(init, WorkerInit):
            init = WorkerInit(init)
            loader.worker_init_fn = init
        self._init = init

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[T]:
        enabled = self.stopwatch.is_enabled()
        self._collate.enabled = self._init.enabled = enabled
        if not enabled:
            return self._plain()
        from ._blocks import check_loop_names
        from ._loops import iterate

        check_loop_names(self.stage, self.body, self.phase)
        return iterate(self.stopwatch, self._unwrapped(), self.stage, self.body, self.phase, source=self.loader)

    def _plain(self) -> Iterator[T]:
        """Stopwatch off: the loader's own batches (unwrapped by :class:`Unwrapping`)."""
        return iter(self.loader)

    def _unwrapped(self) -> Iterator[T]:
        in_main = self.loader.num_workers == 0
        wrapper = install_dataset_timing(self.loader.dataset, self.stopwatch) if in_main else None
        self._unwrapping.receiver = self.stopwatch._receive_worker_report
        self._collate.watching = True
        consuming = self.stopwatch._consuming_interval()  # the workers' utilization counts only this time
        try:
            yield from self.loader
        finally:
            consuming[1] = time.perf_counter_ns()
            self._unwrapping.receiver = None
            self._collate.watching = False
            if wrapper is not None:
                remove_dataset_timing(self.loader.dataset, wrapper)
