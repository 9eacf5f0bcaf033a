"""What runs every N training steps: ``log_every`` callbacks, loggers' writers and ``gather_every``'s save.

The training loop's timed iterator calls :meth:`PeriodicCalls.tick` between two steps of the main phase, so that what a
callback does is in neither step nor in the loop's time. The callbacks are read when a loop starts: one
registered during a loop applies from the next one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ._schedule import check_steps

logger = logging.getLogger("stepwatch")

Every = tuple[tuple[int, Callable[[int], None]], ...]
"""(n, called with the training step's number every n training steps)."""


class PeriodicCalls:
    """What runs every N training steps, owned for one :class:`~stepwatch.Stopwatch`: the calls registered
    (``log_every``, loggers' writers, ``gather_every``), the training steps seen, and whether the calls due
    are running now (a loop they run, a validation, is between two steps, not inside an abandoned one)."""

    def __init__(self) -> None:
        self.every: Every = ()
        self.ticks = 0
        self.ticking = False
        self.resumed_ns = 0  # when the loop resumed after the step that ended (perf_counter_ns), for the calls due

    def add(self, n: int, call: Callable[[int], None], name: str, parameter: str = "n") -> Callable[[], None]:
        """Registers ``call`` every ``n`` training steps and returns what removes it; ``parameter``: what the
        caller calls ``n``, for errors. A call that raises is reported once and removed."""
        check_steps(n, parameter, optional=False)
        if n < 1:
            raise ValueError(f"{parameter} must be a positive number of steps, got {n!r}")
        if not callable(call):
            raise TypeError(f"callback must be callable, got {call!r}")
        entry: tuple[int, Callable[[int], None]] = (n, _guarded(call, name, lambda: remove()))

        def remove() -> None:
            self.every = tuple(item for item in self.every if item is not entry)

        self.every = (*self.every, entry)
        return remove

    def tick(self, every: Every, resumed_ns: int) -> None:
        """One more training step: calls what is due of ``every`` (what the loop read as it started). Called
        by the training loop between two steps; ``resumed_ns``: when the loop resumed, its clock read as the
        step ended (stepwatch's own cost measures the step's boundary from it)."""
        self.resumed_ns = resumed_ns
        self.ticks = step = self.ticks + 1
        self.ticking = True
        try:
            for n, call in every:
                if step % n == 0:
                    call(step)
        finally:
            self.ticking = False


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
