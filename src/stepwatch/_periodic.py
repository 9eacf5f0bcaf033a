"""What runs every N training steps: ``log_every`` callbacks, loggers' writers and ``gather_every``'s save.

The training loop's timed iterator calls :meth:`PeriodicCalls.tick` between two steps of the main phase, so that what a
callback does is in neither step nor in the loop's time. The callbacks are read when a loop starts: one
registered during a loop applies from the next one; one removed (stepwatch's own cost, measured on its first
steps, a callback stopped or failed) is not called again, and once a loop has none left it stops ticking. Between
two calls the loop's steps stay on its steady path (:func:`steps_before_due`): only the step at whose end a call
is due ticks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ._schedule import check_steps

logger = logging.getLogger("stepwatch")

Every = tuple[tuple[int, Callable[[int], None]], ...]
"""(n, called with the training step's number every n training steps)."""


def steps_before_due(every: Every, ticks: int) -> int:
    """How many training steps may end, ``ticks`` counted so far, before the one at whose end a call of ``every``
    is due: the loop's steady steps (in C or on its fast path) run that many, then leave the due one to the
    general path, whose tick calls it (-1: none is due, ever). A ``log_every(100, ...)`` costs the steps between
    its calls nothing."""
    if not every:
        return -1
    step = ticks + 1  # the number the next step's end is counted as
    return min(-step % n for n, _ in every)


class PeriodicCalls:
    """What runs every N training steps, owned for one :class:`~stepwatch.Stopwatch`: the calls registered
    (``log_every``, loggers' writers, ``gather_every``), the training steps seen, and whether the calls due
    are running now (a loop they run, a validation, is between two steps, not inside an abandoned one)."""

    __slots__ = ("_filtered_at", "every", "removals", "resumed_ns", "ticking", "ticks")  # ticks: read in C too

    def __init__(self) -> None:
        self.every: Every = ()
        self.removals = 0  # how many calls were removed: a loop under way drops them at its next tick
        self._filtered_at = 0  # ... the count when a tick last dropped them
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
        guarded = _Guarded(call, name, lambda: remove())
        entry: tuple[int, Callable[[int], None]] = (n, guarded)

        def remove() -> None:
            guarded.removed = True  # not called again, even by a loop that still holds it
            self.every = tuple(item for item in self.every if item is not entry)
            self.removals += 1

        self.every = (*self.every, entry)
        return remove

    def tick(self, every: Every, resumed_ns: int) -> Every:
        """One more training step: calls what is due of ``every`` (what the loop read as it started, or its
        last tick returned) and returns what the loop calls from now on: ``every`` less the calls removed
        since (once none is left, the loop stops ticking and counts its steps itself). Called by the training
        loop between two steps; ``resumed_ns``: when the loop resumed, its clock read as the step ended
        (stepwatch's own cost measures the step's boundary from it)."""
        self.resumed_ns = resumed_ns
        self.ticks = step = self.ticks + 1
        self.ticking = True
        try:
            for n, call in every:
                if step % n == 0:
                    call(step)
        finally:
            self.ticking = False
        if self.removals == self._filtered_at:
            return every
        self._filtered_at = self.removals
        return tuple(entry for entry in every if entry in self.every)


class _Guarded:
    """A registered call: not called once removed; one that raises is reported once and removed."""

    __slots__ = ("call", "name", "remove", "removed")

    def __init__(self, call: Callable[[int], None], name: str, remove: Callable[[], None]) -> None:
        self.call = call
        self.name = name
        self.remove = remove
        self.removed = False

    def __call__(self, step: int) -> None:
        if self.removed:
            return
        try:
            self.call(step)
        except Exception:
            logger.exception("stepwatch: the callback %s failed at step %d; it is not called again", self.name, step)
            self.remove()
