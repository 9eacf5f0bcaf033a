"""A single-process DataLoader iterator (``num_workers=0``) in a ``watch()`` loop: its fetcher's reads and collate
timed in the main process, through the fetcher, without touching the dataset or the loader; their common case in
C (``_reads.c``) for the default stopwatch where compiled, the two in one call as the fetcher's ``fetch``
(``_fetch.c``)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

from .. import _default_instance
from .._block_base import COMPILED, SPEEDUPS
from .in_workers import TimedCollate, TimedGetItems, imported, in_worker


class TimedReads:
    """What a single-process iterator's fetcher reads instead of the dataset (``num_workers=0``): its
    ``__getitems__`` times the batch's reads, and the dataset itself is left untouched. An attribute set on
    the dataset would cost each sample's own attribute reads: Python stops sharing the keys of an instance's
    dictionary once an attribute is added to it (about 50 instructions a sample more in
    ``TensorDataset.__getitem__``, measured with Valgrind)."""

    __slots__ = ("__getitems__", "dataset")

    def __init__(self, dataset: Any, wrapper: TimedGetItems) -> None:
        self.dataset = dataset
        # the default stopwatch's reads: the reading itself, without the checks of where it runs and for whom
        # that TimedGetItems.__call__ makes at each batch (a call less); its common case in C where compiled
        default = wrapper._stopwatch is None or wrapper._stopwatch is _default_instance.stopwatch
        self.__getitems__ = default_reads(wrapper) if default else wrapper

    def __getitem__(self, index: Any) -> Any:
        return self.dataset[index]

    def __len__(self) -> int:
        return len(self.dataset)

    @staticmethod
    def install(iterator: Any, wrapper: TimedGetItems) -> bool:
        """Times the reads of a single-process DataLoader iterator whose fetcher batches a map-style dataset
        (torch's own fetcher, read by attribute); False where it is another kind."""
        fetcher: Any = getattr(iterator, "_dataset_fetcher", None)
        map_fetcher = imported("torch.utils.data._utils.fetch", "_MapDatasetFetcher")
        if type(fetcher) is not map_fetcher or not fetcher.auto_collation:
            return False
        fetcher.dataset = TimedReads(fetcher.dataset, wrapper)
        return True


def default_reads(wrapper: TimedGetItems) -> Callable[[Any], Any]:
    """The default stopwatch's reads of a batch in the main process: ``read_samples`` (``_reads.c``) where
    compiled and the dataset has no ``__getitems__`` of its own, ``TimedGetItems.read`` otherwise."""
    stopwatch = _default_instance.stopwatch
    if not COMPILED or wrapper.inner is not None:
        return functools.partial(wrapper.read, stopwatch)
    return functools.partial(SPEEDUPS.read_samples, wrapper.read, stopwatch.timed("dataset"), wrapper.dataset, read_all)


def read_all(dataset: Any, indices: Iterator[Any]) -> list[Any]:
    """A batch's samples, read by the interpreter's own loop (which calls ``__getitem__`` without re-entering
    itself: read from C, each sample cost about 100 ns more)."""
    return [dataset[index] for index in indices]


def install_collate(iterator: Any) -> bool:
    """Times the collate of a single-process iterator of the default stopwatch in C (``collate_samples``): what
    ``TimedCollate`` does in the main process, whose flags it reads at each batch and which it calls for every
    case but the common one. False where not compiled, in a worker, or for another stopwatch's loader."""
    fetcher = getattr(iterator, "_dataset_fetcher", None)
    collate = getattr(fetcher, "collate_fn", None)
    default = _default_instance.stopwatch
    if fetcher is None or not COMPILED or type(collate) is not TimedCollate or in_worker():
        return False
    if collate._stopwatch is not None and collate._stopwatch is not default:
        return False
    fetcher.collate_fn = functools.partial(SPEEDUPS.collate_samples, collate, default.timed("collate"))
    return True


def install_fetch(iterator: Any) -> bool:
    """Makes the fetcher of a single-process iterator whose reads and collate are both timed in C (``TimedReads``
    with ``read_samples``, and ``collate_samples``) fetch each batch in one C call, ``fetch_batch``: the same reads,
    collate and records, without torch's ``fetch`` frame, its lookups of ``__getitems__`` and the two partial
    calls (about 4 us of a real step's boundary, measured with a bracketed ``next()``). False where either half
    is another kind; the halves then run as installed."""
    fetcher: Any = getattr(iterator, "_dataset_fetcher", None)
    timed_reads = getattr(fetcher, "dataset", None)
    collate: Any = getattr(fetcher, "collate_fn", None)
    if type(timed_reads) is not TimedReads or not COMPILED:
        return False
    reads: Any = timed_reads.__getitems__
    if not _bound(reads, SPEEDUPS.read_samples, 4) or not _bound(collate, SPEEDUPS.collate_samples, 2):
        return False
    _, dataset_block, dataset, read_all = reads.args
    timed_collate, collate_block = collate.args
    spec = (reads, dataset_block, dataset, read_all, timed_collate, collate_block)
    fetcher.fetch = functools.partial(SPEEDUPS.fetch_batch, spec)
    return True


def _bound(candidate: Any, function: Any, arguments: int) -> bool:
    """Whether ``candidate`` is ``functools.partial(function, <arguments positional arguments>)``."""
    return (
        type(candidate) is functools.partial
        and candidate.func is function
        and len(candidate.args) == arguments
        and not candidate.keywords
    )
