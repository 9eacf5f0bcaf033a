"""How many samples a batch holds, found in the batch itself: ``watch()`` and auto-instrumentation count them as
``samples``, and the Lightning and Hugging Face integrations too."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ._counters import batch_counter, count_batch_samples
from ._dataloader.in_workers import imported, unwrapped

if TYPE_CHECKING:
    from ._recorder import Stopwatch
    from ._tree import Phase


def batch_size(batch: Any, depth: int = 0) -> int | None:
    """The samples in a batch: the first dimension of its first tensor or array (in a tuple, list or dict)."""
    kind = type(batch)
    if kind is list or kind is tuple:  # first: a failed getattr on a list costs an exception
        return batch_size(batch[0], depth + 1) if batch and depth < 3 else None
    shape = getattr(batch, "shape", None)
    if shape is not None:
        try:
            return int(shape[0]) if len(shape) else None
        except (TypeError, ValueError):
            return None
    if depth < 3:
        if isinstance(batch, (list, tuple)) and batch:
            return batch_size(batch[0], depth + 1)
        if isinstance(batch, Mapping):
            for value in batch.values():
                return batch_size(value, depth + 1)
    return None


def uniform_batches(loader: Any) -> tuple[int | None, int]:
    """For a DataLoader that batches with torch's own batch sampler and collate function: its batch size and how
    many full batches an epoch has (every batch but a short last one holds ``batch_size`` samples, so the loop
    need not look into them); ``(None, 0)`` otherwise. A collate function wrapped by ``watch()`` is the loader's
    own underneath."""
    try:
        size = loader.batch_size
        default_collate = imported("torch.utils.data", "default_collate")
        if not isinstance(size, int) or size < 1 or unwrapped(loader.collate_fn) is not default_collate:
            return None, 0
        return size, len(loader.sampler) // size
    except Exception:  # a loader of any kind: no shortcut
        return None, 0


class CountSamples:
    """``watch()``'s count of each measured step's samples, as ``auto()`` counts them: the loader's batch size from
    the second batch to the ``full``-th where torch's own batch sampler and collate make them (the first batch
    checked: else every batch is looked into), the batch's first tensor's first dimension otherwise; nothing for a
    batch without one. Where the program counts samples itself its count replaces this one
    (``Phase.batch_samples``)."""

    __slots__ = ("counter", "fallback", "full", "uniform")

    def __init__(self, sw: Stopwatch, phase: Phase, samples: tuple[int | None, int]) -> None:
        self.uniform, self.full = samples
        self.fallback = functools.partial(count_batch_samples, sw)
        self.counter = batch_counter(sw, phase, self.fallback)

    def check_first(self, item: Any) -> None:
        """The first batch holds what the loader's batch size says, or every batch is looked into."""
        if self.uniform is not None and batch_size(item) != self.uniform:
            self.full = 0

    def count(self, item: Any, index: int) -> None:
        """The ``index``-th batch's samples (its step just opened)."""
        size = self.uniform if 1 < index <= self.full else batch_size(item)
        if size:
            self.counter(size)

    def steady(self) -> tuple[int | None, int, Callable[[Any], int | None], Callable[[int], None]]:
        """What the steady steps in C count with (``SteadyLoop``'s last argument)."""
        return self.uniform if self.full else None, self.full, batch_size, self.fallback
