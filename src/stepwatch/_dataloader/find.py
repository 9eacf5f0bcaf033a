"""Finding the torch DataLoader that an iterable is, wraps or holds, and reading its configuration (workers,
batch size, prefetching, pinning...) for the advice. Never imports torch: a loader means it already is."""

from __future__ import annotations

import os
import sys
from typing import Any

_WRAPPED_LOADER = ("base_dataloader", "dataloader", "_dataloader", "loader", "_loader")
"""Attributes where wrappers keep the DataLoader they wrap (Accelerate's ``DataLoaderShard`` and
``DataLoaderDispatcher`` keep ``base_dataloader``)."""


def inner_loader(candidate: Any) -> Any | None:
    """The torch DataLoader that ``candidate`` is or wraps: itself, the loader a wrapper keeps (Accelerate's
    adapters, which forward every attribute to it), or the only DataLoader a loader of loaders holds
    (Lightning's ``CombinedLoader`` with one loader); None when there is none, or several."""
    for _ in range(4):
        if candidate is None:
            return None
        torch = sys.modules.get("torch")
        real = getattr(getattr(getattr(torch, "utils", None), "data", None), "DataLoader", None)
        if real is not None and isinstance(real, type) and real in type(candidate).__mro__:
            return candidate
        own = getattr(candidate, "__dict__", {})
        inner = next((own[name] for name in _WRAPPED_LOADER if own.get(name) is not None), None)
        if inner is None:
            found = find_loaders(candidate)
            if len(found) != 1:
                return candidate if real is None and is_loader(candidate) else None
            inner = found[0]
        if inner is candidate:
            return candidate
        candidate = inner
    return None


def loader_config(loader: Any) -> dict[str, Any] | None:
    """What the advice depends on, read off a DataLoader, or the one inside a wrapper or a loader of loaders
    (None when there is none, or several: then the advice states no configured number): workers, batch size,
    prefetching, persistence, pinning, the dataset's kind, the start method, torch's compute threads and the
    machine's cores."""
    loader = inner_loader(loader)
    if loader is None or not all(hasattr(loader, name) for name in ("num_workers", "collate_fn", "dataset")):
        return None
    workers = getattr(loader, "num_workers", 0)
    batch_size = getattr(loader, "batch_size", None)
    torch = sys.modules.get("torch")  # never imported here: a loader means it already is
    threads = torch.get_num_threads() if torch is not None and hasattr(torch, "get_num_threads") else None
    kinds = {cls.__name__ for cls in type(getattr(loader, "dataset", None)).__mro__}
    return {
        "num_workers": workers if isinstance(workers, int) else None,
        "batch_size": batch_size if isinstance(batch_size, int) else None,
        "prefetch_factor": getattr(loader, "prefetch_factor", None) if workers else None,
        "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
        "pin_memory": bool(getattr(loader, "pin_memory", False)),
        "dataset": "iterable" if "IterableDataset" in kinds else "map",
        "start_method": start_method(loader) if workers else None,
        "torch_threads": int(threads) if threads is not None else None,
        "cpu_count": cores(),
    }


def start_method(loader: Any) -> str:
    """How the loader's workers start: its own context's method, else the program's (``default``: not yet set)."""
    import multiprocessing

    context = getattr(loader, "multiprocessing_context", None)
    method = getattr(context, "_name", None) or (context if isinstance(context, str) else None)
    return method or multiprocessing.get_start_method(allow_none=True) or "default"


_cores: int | None = None


def cores() -> int | None:
    """The machine's cores (``os.cpu_count()``), read once a process: it reads a file of ``/sys``, 58 us at a loop's
    start where the training's work has left it cold, and every loop's start asks (an epoch's, a validation's)."""
    global _cores
    if _cores is None:
        _cores = os.cpu_count()
    return _cores


def is_loader(candidate: Any) -> bool:
    return all(hasattr(candidate, name) for name in ("collate_fn", "worker_init_fn", "num_workers", "dataset"))


def find_loaders(iterable: Any) -> list[Any]:
    """The DataLoaders an iterable is or holds: itself, or those among its attributes (also inside a list,
    tuple or dict attribute), as loaders of loaders keep them (Lightning's ``CombinedLoader``, metatrain's
    ``CombinedDataLoader``)."""
    if is_loader(iterable):
        return [iterable]
    found: list[Any] = []
    for value in getattr(iterable, "__dict__", {}).values():
        values = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else [value]
        for candidate in values:
            if is_loader(candidate) and not any(candidate is known for known in found):
                found.append(candidate)
    return found
