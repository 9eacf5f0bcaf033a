"""What runs every N training steps: ``log_every`` callbacks, loggers' writers and ``gather_every``'s save.

The training loop's timed iterator calls :func:`tick` between two steps of the main phase, so that what a
callback does is in neither step nor in the loop's time. The callbacks are read when a loop starts: one
registered during a loop applies from the next one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from ._schedule import check_steps

if TYPE_CHECKING:
    from ._recorder import Stopwatch

logger = logging.getLogger("stepwatch")

Every = tuple[tuple[int, Callable[[int], None]], ...]
"""(n, called with the training step's number every n training steps)."""


class Periodic:
    """``log_every`` and the callbacks behind it, for :class:`~stepwatch.Stopwatch`."""

    _every: Every
    _ticks: int
    _ticking: bool
    _gathers: int
    out: str | None

    def log_every(self, n: int, callback: Callable[[dict[str, float]], Any]) -> Callable[[], None]:
        """Calls ``callback(stepwatch.metrics())`` every ``n`` training steps, from the training loop:
        ``stepwatch.log_every(100, wandb.log)``, ``log_every(100, mlflow.log_metrics)``. Returns a function that
        stops it. A callback that raises is reported once on the ``stepwatch`` logger and not called again:
        a failing logger never stops the training."""
        stopwatch = cast("Stopwatch", self)
        if not callable(callback):  # refused now, not at the n-th step
            raise TypeError(f"callback must be callable, got {callback!r}")

        def call(step: int) -> None:
            callback(stopwatch.metrics())

        return self._add_every(n, call, getattr(callback, "__qualname__", repr(callback)))

    def _add_every(self, n: int, call: Callable[[int], None], name: str, parameter: str = "n") -> Callable[[], None]:
        """Registers ``call`` every ``n`` training steps; ``parameter``: what the caller calls ``n``, for errors."""
        check_steps(n, parameter, optional=False)
        if n < 1:
            raise ValueError(f"{parameter} must be a positive number of steps, got {n!r}")
        if not callable(call):
            raise TypeError(f"callback must be callable, got {call!r}")
        entry: tuple[int, Callable[[int], None]] = (n, _guarded(call, name, lambda: remove()))

        def remove() -> None:
            self._every = tuple(item for item in self._every if item is not entry)

        self._every = (*self._every, entry)
        return remove

    def _save_during_run(self, step: int) -> None:
        """``gather_every``'s save: each rank writes its file, rank 0 gathers the all-ranks file."""
        if self.out is None:
            return
        self._gathers += 1
        try:
            cast("Stopwatch", self)._save_run(self.out, gather=True, tag=f"{self.out}#{self._gathers}", among=self.out)
        except Exception as error:
            logger.error("stepwatch: could not save the run to %s during the run: %s", self.out, error)


def _guarded(call: Callable[[int], None], name: str, remove: Callable[[], None]) -> Callable[[int], None]:
    failed = False

    def guarded(step: int) -> None:
        nonlocal failed
        if failed:  # the loop under way still holds it: removed, it is gone from the next loop on
            return
        try:
            call(step)
        except Exception:
            failed = True
            logger.exception("stepwatch: the callback %s failed at step %d; it is not called again", name, step)
            remove()

    return guarded


def tick(sw: Stopwatch, every: Every) -> None:
    """One more training step: calls what is due. Called by the training loop between two steps."""
    sw._ticks = step = sw._ticks + 1
    sw._ticking = True  # a loop a callback runs (a validation) is between two steps: not inside an abandoned one
    try:
        for n, call in every:
            if step % n == 0:
                call(step)
    finally:
        sw._ticking = False
