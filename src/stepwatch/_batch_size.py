"""How many samples a batch holds, found in the batch itself: auto-instrumentation counts them as ``samples``,
and the Lightning and Hugging Face integrations too."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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
        from torch.utils.data import default_collate

        from ._dataloader.in_workers import unwrapped

        size = loader.batch_size
        if not isinstance(size, int) or size < 1 or unwrapped(loader.collate_fn) is not default_collate:
            return None, 0
        return size, len(loader.sampler) // size
    except Exception:  # a loader of any kind: no shortcut
        return None, 0
