"""``count()``: the counters of the current phase (samples, tokens, any unit), added to while measuring.

A counter is a Python number; past :data:`COUNTER_LIMIT` it saturates (said once), so that what was counted can
always be saved and reported. :func:`add_counts` is :meth:`Stopwatch.count <stepwatch.Stopwatch.count>` itself
(bound as a method: no call in between on the training loop's path).
"""

from __future__ import annotations

import functools
import logging
import math
import sys
import types
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from ._block_base import SPEEDUPS
from ._constants import DEFAULT_PHASE
from ._schedule import as_count
from ._tree import DROPPED

if TYPE_CHECKING:
    from ._recorder import Stopwatch
    from ._tree import Phase

logger = logging.getLogger("stepwatch")

COUNTER_LIMIT = sys.float_info.max
"""Counters saturate here, so that what was counted can always be saved and reported."""


def add_counts(self: Stopwatch, **units: float) -> None:
    """Add to the counters of the current phase, e.g. ``count(samples=32, tokens=4096)``.

    Any finite real number is accepted (Python, numpy and 0-d torch scalars), checked the same way whether
    measuring or not. Throughput is each counter's total over the measured loader+step time; counts made
    outside the measured window are not added, so they never inflate it.
    """
    for value in units.values():
        if type(value) is not int and not (type(value) is float and math.isfinite(value)):
            units = {unit: as_count(unit, value) for unit, value in units.items()}
            break
    phase = _measured_phase(self)
    if phase is None:
        return
    with self.tree.count_lock:
        phase.counting += 1  # (see Phase.counting)
        try:
            if "samples" in units:  # the program counts its samples: the batches' count is dropped, and stops
                phase.batch_samples = None
            phase.count_calls += 1
            for unit, value in units.items():
                _add(self, phase.counters, unit, value)
        finally:
            phase.counting -= 1


def count_batch_samples(self: Stopwatch, size: int, call: int = 0) -> None:
    """A batch's ``size`` samples (a positive int) counted from the batch by ``watch()`` (``call`` 0: part of its
    loop's boundary) or ``auto()`` (1: a ``count()`` call, for stepwatch's own cost), in ``Phase.batch_samples``
    (apart from the program's counters, merged into them by ``Phase.counted``): nothing where the program counts
    its samples itself. No keywords and no checks on the training loop's path; the common case is in C
    (``count_batch``, :data:`add_samples`)."""
    phase = _measured_phase(self)
    if phase is not None:
        with self.tree.count_lock:
            phase.counting += 1  # (see Phase.counting)
            try:
                counted = phase.batch_samples
                if counted is not None:
                    phase.count_calls += call
                    phase.batch_samples = counted + size
            finally:
                phase.counting -= 1


def python_add_samples(self: Stopwatch, size: int) -> None:
    """auto()'s count of a batch's samples (:func:`count_batch_samples`, a ``count()`` call for stepwatch's own
    cost). :data:`add_samples` is this, or its common case in C."""
    count_batch_samples(self, size, 1)


def _measured_phase(self: Stopwatch) -> Phase | None:
    """The current phase while measuring (None: not measuring, a dropped step, the first step)."""
    stacks = self.stacks
    if not stacks.measuring:
        return None
    local = stacks.local.__dict__  # no AttributeError raised
    stack = local.get("stack")
    if stack is None:  # a fresh thread-local after a switch: the stack knows the phase
        stack = stacks.thread_stack()
        local = stacks.local.__dict__
    if stack[-1][1] is DROPPED:  # inside a step dropped by a switch: its time is not counted either
        return None
    name = local.get("phase", DEFAULT_PHASE)
    phase = self.tree.phases.get(name) or self.tree.phase(name)
    if phase.in_first_step:  # the one-off first step: its time is apart, so are its counts
        return None
    return phase


def _add(self: Stopwatch, counters: dict[str, float], unit: str, value: float) -> None:
    try:
        total = counters.get(unit, 0) + value
    except OverflowError:  # a saturated float counter plus a huge int
        total = value
    if not -COUNTER_LIMIT <= total <= COUNTER_LIMIT:
        total = COUNTER_LIMIT if total > 0 else -COUNTER_LIMIT
        _warn_counter(self, unit)
    counters[unit] = total


_warned: weakref.WeakSet[Stopwatch] = weakref.WeakSet()
"""The stopwatches that said a counter saturated (once each)."""


def _warn_counter(self: Stopwatch, unit: str) -> None:
    if self not in _warned:
        _warned.add(self)
        logger.warning("stepwatch: counter %r passed %g and stays there", unit, COUNTER_LIMIT)


def _compiled_add_samples() -> Callable[[Stopwatch, int], None] | None:
    """The C implementation of :func:`python_add_samples` (``_counts.c``), where the speedups are built and on;
    it hands every case but the common one to the Python function."""
    from . import _block_base

    if not _block_base.COMPILED:
        return None
    from ._speedups import add_samples as compiled  # type: ignore[import-not-found,unused-ignore]
    from ._speedups import configure_counts  # type: ignore[import-not-found,unused-ignore]

    configure_counts(DROPPED, DEFAULT_PHASE, COUNTER_LIMIT, python_add_samples)
    return compiled  # type: ignore[no-any-return,unused-ignore]


add_samples: Callable[[Stopwatch, int], None] = _compiled_add_samples() or python_add_samples
"""auto()'s count of a batch's samples: :func:`python_add_samples`, or its common case in C."""


def batch_counter(self: Stopwatch, phase: Phase, fallback: Callable[[int], None]) -> Callable[[int], None]:
    """watch()'s count of a batch's samples into its loop's ``phase``, called with the batch's step open:
    ``fallback`` (:func:`count_batch_samples` bound to ``self``), or its common case in C (``count_batch``, which
    does not look for the phase and hands every other case to ``fallback``)."""
    if add_samples is python_add_samples:  # not compiled
        return fallback
    return functools.partial(SPEEDUPS.count_batch, self.stacks, phase, fallback)


def counter(self: Stopwatch) -> Callable[..., None]:
    """What ``self.count`` is: :func:`add_counts` bound to ``self``, or, where the speedups are built and on, a
    C callable that does its common case (every value an int or a finite float, the phase under way) and hands
    every other case to it. A count runs after the model's work has pushed stepwatch out of the CPU's caches:
    there, the Python function took 13 us a call in a 1.8 ms step (the C one: see docs/overhead.md)."""
    bound = types.MethodType(add_counts, self)
    if add_samples is python_add_samples:  # not compiled
        return bound
    from ._speedups import Counter  # type: ignore[import-not-found,unused-ignore]

    return Counter(self, bound)  # type: ignore[no-any-return,unused-ignore]
