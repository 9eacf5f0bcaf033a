"""The main-process side of watching DataLoaders: ``watch()``'s iterable, the iterators that unwrap batches,
and the loader's configuration recorded for the advice.

``Stopwatch.watch(loader)`` instruments each DataLoader in place (its ``collate_fn`` and ``worker_init_fn``,
the two attributes a DataLoader lets one set after construction, and its ``_get_iterator``) and returns an
iterable that times the loop like ``timed_iter``. What runs inside the workers is in ``in_workers``.
"""

from __future__ import annotations

import functools
import logging
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .._batch_size import uniform_batches
from .._blocks import check_loop_names
from .._loops import timed_loop
from .find import find_loaders, is_loader
from .in_workers import (
    Carrier,
    TimedCollate,
    TimedGetItems,
    WorkerInit,
    WorkerReport,
    dataset_timing,
    in_worker,
    unwrapped,
)
from .single_process import TimedReads, install_collate, install_fetch

if TYPE_CHECKING:
    from .._recorder import Stopwatch

T = TypeVar("T")


class Unwrapping:
    """Set as a watched DataLoader's ``_get_iterator``: every iterator it makes hands out plain batches,
    whoever iterates the loader (a ``watch()`` loop, the loader used directly, a library, after ``disable()``),
    since workers started while watched keep wrapping batches in :class:`Carrier`. The reports go to
    ``receiver`` while a ``watch()`` loop consumes the loader, and are dropped otherwise. With
    ``num_workers=0``, the iterators made while ``reads`` is set time the dataset's reads with it (see
    :class:`TimedReads`), and are left as torch made them otherwise: no batch of theirs is in a carrier."""

    def __init__(self, loader: Any) -> None:
        self._loader = weakref.ref(loader)  # the loader holds this object: a strong reference back is a cycle
        self.receiver: Callable[[WorkerReport], None] | None = None
        self.on_batch: Callable[[Any], None] | None = None  # sees every batch handed out (a framework's count)
        self.reads: TimedGetItems | None = None  # times the reads of single-process iterators made now
        iterator = loader.__dict__.get("_iterator")
        if iterator is not None:  # persistent workers started before watch()
            self.wrap(iterator)
            logging.getLogger("stepwatch").warning(
                "stepwatch: this DataLoader's persistent workers started before watch(), so what they do cannot"
                " be seen (no dataset, collate or per-worker rows) until they restart; call watch() before the"
                " loader is first iterated"
            )

    @property
    def loader(self) -> Any:
        return self._loader()

    def __getstate__(self) -> dict[str, Any]:
        return {"loader": self.loader, "receiver": None, "on_batch": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._loader = weakref.ref(state["loader"])
        self.receiver = self.on_batch = self.reads = None

    def __call__(self) -> Any:
        loader = self.loader
        iterator = type(loader)._get_iterator(loader)
        if loader.num_workers == 0:
            if self.reads is not None:  # a watch() loop's iterator
                reads_timed = TimedReads.install(iterator, self.reads)
                if install_collate(iterator) and reads_timed:
                    install_fetch(iterator)  # both halves in C: one call for the two
            if self.on_batch is None and not in_worker():
                return iterator  # its batches are plain: nothing to unwrap, no call added to each
        return self.wrap(iterator)

    def wrap(self, iterator: Any) -> Any:
        """Makes ``iterator`` unwrap what it hands out. Neither this object nor the iterator's new
        ``_next_data`` holds the iterator strongly: a DataLoader iterator caught in a reference cycle is shut
        down by the garbage collector, in an order that leaves its workers waiting 5 s each before torch kills
        them (a stall of the training process at some later collection)."""
        own = iterator.__dict__.get("_next_data")  # an earlier wrapping's, itself holding no strong reference
        if own is not None:
            next_data = own
        else:
            method = type(iterator)._next_data
            iterator_ref = weakref.ref(iterator)

            def next_data() -> Any:
                return method(iterator_ref())

        def unwrapped_next_data() -> Any:
            item = next_data()
            if type(item) is Carrier:
                receiver = self.receiver
                if receiver is not None:
                    receiver(item.report)
                item = item.batch
            if self.on_batch is not None:
                self.on_batch(item)
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
    """Iterates a DataLoader, or an iterable of DataLoaders, like ``timed_iter``, bringing back the timings
    their workers measured. The batches are exactly what the iterable yields."""

    def __init__(
        self,
        iterable: Any,
        stopwatch: Stopwatch,
        stage: str = "loader",
        body: str = "step",
        phase: str | None = None,
        loaders: Sequence[Any] | None = None,
    ) -> None:
        found = list(loaders) if loaders is not None else find_loaders(iterable)
        if not found or not all(is_loader(loader) for loader in found):
            raise TypeError(
                f"watch() needs a torch.utils.data.DataLoader, or an iterable holding DataLoaders (or given as"
                f" loaders=[...]), got {type(iterable).__name__}; time any other iterable with timed_iter()"
            )
        self.iterable = iterable
        self.loaders = found
        self.stopwatch = stopwatch
        self.stage, self.body, self.phase = stage, body, phase
        self._parts = [_instrument(loader, stopwatch) for loader in found]
        self.for_frame = True
        """Whether the frame calling ``next()`` on the loop is the one whose ``for`` statement consumes it
        (False: auto()'s iterator stands between them; see ``_loop_sites.LoopSite``)."""
        self.counts_samples = True
        """Whether the loop counts each batch's samples (False: auto() counts them itself)."""

    @property
    def loader(self) -> Any:
        """The first (or only) DataLoader watched."""
        return self.loaders[0]

    def __len__(self) -> int:
        return len(self.iterable)

    def __iter__(self) -> Iterator[T]:
        enabled = self.stopwatch.is_enabled()
        for _, collate, init in self._parts:
            collate.enabled = init.enabled = enabled
        if not enabled:
            return iter(self.iterable)  # the loaders' own batches (unwrapped by Unwrapping)

        check_loop_names(self.stage, self.body, self.phase)
        samples = None
        if self.counts_samples:  # (a loader of loaders: no batch size of its own, its batches are looked into)
            samples = uniform_batches(self.loader) if self.iterable is self.loader else (None, 0)
        return timed_loop(
            self.stopwatch,
            self.iterable,
            self.stage,
            self.body,
            self.phase,
            source=self.loader,
            around=self._watching,
            for_frame=self.for_frame,
            samples=samples,
        )

    def _watching(self) -> Callable[[], None]:
        """As the loop starts: the loaders' reports go to the stopwatch, their collate and (without workers) their
        reads are timed; returns what undoes it as the loop ends."""
        receive = self.stopwatch.workers.receive
        several = len(self._parts) > 1
        reads_before = [unwrapping.reads for unwrapping, _, _ in self._parts]
        for index, (unwrapping, collate, _) in enumerate(self._parts):
            # workers of different loaders stay apart: loader k's worker w is worker k * 1000 + w
            unwrapping.receiver = functools.partial(receive, offset=index * LOADER_STRIDE) if several else receive
            collate.watching = True
            loader = self.loaders[index]
            if loader.num_workers == 0:
                unwrapping.reads = dataset_timing(loader.dataset, self.stopwatch)
        consuming = self.stopwatch.workers.consuming_interval()  # the workers' utilization counts only this time

        def ended() -> None:
            consuming[1] = time.perf_counter_ns()
            for (unwrapping, collate, _), reads in zip(self._parts, reads_before, strict=True):
                unwrapping.receiver = None
                unwrapping.reads = reads
                collate.watching = False

        return ended


LOADER_STRIDE = 1000
"""Worker ids of the k-th of several watched loaders start at k * LOADER_STRIDE."""


def instrument_always(loader: Any, stopwatch: Stopwatch) -> None:
    """Instruments a DataLoader for a framework's loop that stepwatch does not iterate itself (Lightning's):
    from now on, its workers' reports go to the stopwatch whenever a batch arrives (filed under the stage open
    at that moment, the framework's fetch), its collate is timed, and so are its samples read in the main
    process. Undone by :func:`uninstrument`."""
    unwrapping, collate, init = _instrument(loader, stopwatch)
    unwrapping.receiver = stopwatch.workers.receive
    collate.watching = collate.enabled = init.enabled = True
    if loader.num_workers == 0:
        unwrapping.reads = dataset_timing(loader.dataset, stopwatch)


def uninstrument(loader: Any) -> None:
    """Undoes :func:`_instrument` on a loader (auto-instrumentation ending). Iterators that unwrap batches
    stay while the loader keeps persistent workers started instrumented: those keep wrapping their batches."""
    for name in ("collate_fn", "worker_init_fn"):
        wrapper = loader.__dict__.get(name)
        if isinstance(wrapper, (TimedCollate, WorkerInit)):
            setattr(loader, name, unwrapped(wrapper))
    unwrapping = loader.__dict__.get("_get_iterator")
    if isinstance(unwrapping, Unwrapping):
        unwrapping.receiver = unwrapping.on_batch = unwrapping.reads = None
        if loader.__dict__.get("_iterator") is None:
            del loader.__dict__["_get_iterator"]


def _instrument(loader: Any, stopwatch: Stopwatch) -> tuple[Unwrapping, TimedCollate, WorkerInit]:
    """Instruments a DataLoader in place (its iterators, ``collate_fn`` and ``worker_init_fn``)."""
    unwrapping = _install_unwrapping(loader)
    if unwrapping is None:
        raise TypeError(f"watch() cannot instrument {type(loader).__name__}: use timed_iter() instead")
    collate = loader.collate_fn
    if not isinstance(collate, TimedCollate):
        collate = TimedCollate(collate, stopwatch)
        loader.collate_fn = collate
    init = loader.worker_init_fn
    if not isinstance(init, WorkerInit):
        init = WorkerInit(init)
        loader.worker_init_fn = init
    init.watcher = stopwatch
    init.trace = stopwatch.timeline is not None
    return unwrapping, collate, init
