"""TensorBoard: ``stepwatch.integrations.tensorboard.log(writer, every=100)`` writes ``stepwatch.metrics()`` as
scalars through a ``torch.utils.tensorboard.SummaryWriter`` (or any object with its ``add_scalar``), every
``every`` training steps, at the training step's number. Importing stepwatch never imports tensorboard."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import Stopwatch
from .._default_instance import stopwatch as _default

__all__ = ["log"]


def log(writer: Any, every: int = 100, *, stopwatch: Stopwatch | None = None) -> Callable[[], None]:
    """Writes the figures of ``stopwatch`` (default: the module-level one) through ``writer`` every ``every``
    training steps, one scalar per key of :func:`stepwatch.metrics`, then flushes. Returns a function that
    stops it. A ``writer`` without ``add_scalar`` is a ``TypeError``."""
    if not callable(getattr(writer, "add_scalar", None)):
        raise TypeError(
            f"writer must be a TensorBoard SummaryWriter (or have its add_scalar), got {type(writer).__name__}:"
            " pip install 'stepwatch[tensorboard]' and pass torch.utils.tensorboard.SummaryWriter(log_dir)"
        )
    sw = _default if stopwatch is None else stopwatch

    def write(step: int) -> None:
        for key, value in sw.metrics().items():
            writer.add_scalar(key, value, step)
        flush = getattr(writer, "flush", None)
        if callable(flush):
            flush()

    return sw.periodic.add(every, write, "tensorboard.log", "every")
