"""``stepwatch.timed_transform``: a transform timed on the default stopwatch, in workers and out."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from .. import _default_instance

T = TypeVar("T")


class TimedTransform(Generic[T]):
    """A transform timed under ``name`` on the default stopwatch, picklable for spawned workers.

    ``stepwatch.timed_transform(fn, "augment")``; inside a dataset's ``__getitem__`` it shows as
    ``loader/dataset/augment``."""

    def __init__(self, fn: Callable[..., T], name: str | None = None) -> None:
        self.fn = fn
        self.name = name or getattr(fn, "__name__", None) or type(fn).__name__

    def __call__(self, *args: Any, **kwargs: Any) -> T:
        with _default_instance.stopwatch.timed(self.name):
            return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"timed_transform({self.fn!r}, {self.name!r})"
