"""What the Lightning profiler builds on: Lightning's ``Profiler`` and ``Callback`` (from ``lightning`` 2.x, or the
older ``pytorch_lightning``), and :class:`FailureGuard`, the callback that hears of a trainer run failing."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.profilers import Profiler
except ImportError:  # the older package name
    try:
        from pytorch_lightning.callbacks import Callback  # type: ignore[assignment]
        from pytorch_lightning.profilers import Profiler  # type: ignore[assignment]
    except ImportError as error:
        raise ImportError(
            "stepwatch.integrations.lightning needs Lightning 2.0 or newer: pip install 'stepwatch[lightning]'"
        ) from error

__all__ = ["GUARD_MARK", "FailureGuard", "Profiler"]


class _OnException(Callback):
    """Calls back when a trainer run fails or is interrupted. Its own hooks are not stages (the profiler skips
    the actions named after it: :data:`GUARD_MARK`)."""

    def __init__(self, on_failure: Callable[[], None]) -> None:
        super().__init__()
        self.on_failure = on_failure

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.on_failure()


GUARD_MARK = f"]{_OnException.__qualname__}."
"""How the actions of that callback's hooks are named (``[Callback]_OnException.on_train_batch_start``)."""


class FailureGuard:
    """Adds to the trainer that runs now a callback whose ``on_exception`` calls ``on_failure``: a fit that raises
    (or is interrupted) gets no ``describe`` or ``teardown`` from Lightning. Also finds that trainer."""

    def __init__(self, on_failure: Callable[[], None]) -> None:
        self._callback = _OnException(on_failure)
        self._guarded: list[Any] | None = None  # the callbacks of the trainer it was added to

    def attach(self, setup_frame: FrameType | None = None) -> Any:
        """From the profiler's ``setup`` (its frame): the trainer calling it (``Trainer._run``, with perhaps a
        subclass's ``setup`` in between), with the callback added to it; None when not found (the exit hooks
        still save)."""
        frame = setup_frame if setup_frame is not None else sys._getframe(1)
        trainer = None
        for _ in range(6):
            frame = frame.f_back  # type: ignore[assignment]
            if frame is None:
                return None
            candidate = frame.f_locals.get("self")
            if type(candidate).__name__ == "Trainer" or any(c.__name__ == "Trainer" for c in type(candidate).__mro__):
                trainer = candidate
                break
        callbacks = getattr(trainer, "callbacks", None)
        if isinstance(callbacks, list):
            if not any(callback is self._callback for callback in callbacks):
                callbacks.append(self._callback)
            self._guarded = callbacks
        return trainer

    def detach(self) -> None:
        """The run ended well: the callback comes off the trainer (a failing run is still walking them)."""
        if self._guarded is not None:
            self._guarded[:] = [callback for callback in self._guarded if callback is not self._callback]
            self._guarded = None
