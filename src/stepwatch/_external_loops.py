"""Loops driven from outside a ``for`` statement, and phases renamed after the fact.

:class:`Beats` is a loop that a framework advances with its own calls (Lightning's and Hugging Face's fetches);
:class:`DrivenLoop` is auto-instrumentation's loop of steps ended by optimizer steps (no DataLoader);
:func:`rename_phase` moves what a phase recorded when auto-instrumentation guessed a loop's kind wrong.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Generator
from threading import get_ident
from typing import TYPE_CHECKING, Any

from ._constants import DEFAULT_PHASE
from ._loops import iterate
from ._tree import Phase, collect

if TYPE_CHECKING:
    from ._auto import AutoSession
    from ._recorder import Stopwatch


def rename_phase(sw: Stopwatch, old: str, new: str) -> bool:
    """Files what a phase recorded under another name (auto-instrumentation guessed a loop's kind before it
    ran); only when no loop of it is running and ``new`` holds nothing. The phase under the old name stays,
    empty: threads' stacks stand on its root. Returns whether it was moved."""
    with sw.tree.lock:
        phase = sw.tree.phases.get(old)
        taken = sw.tree.phases.get(new)
        running = sw.loops.running(old)
        if phase is None or running or (taken is not None and not is_empty(taken)):
            return False
        sw.tree.rename(old, new)
        return True


def set_base_phase(sw: Stopwatch, name: str) -> str:
    """Files what this thread times outside any loop under phase ``name`` (a framework running only an
    evaluation: its hooks before and after the loop belong to that phase, not to ``train``); returns the
    previous base phase, to set it back. Loops started on the thread stay outermost."""
    stack = sw.stacks.thread_stack()
    with sw.tree.lock:
        previous = sw.tree.phase_of_root.get(stack[0][1], DEFAULT_PHASE)
        stack[0] = (None, sw.tree.phase(name).root, 0)
        sw.stacks.local.phase = name
    return previous


def is_empty(phase: Phase) -> bool:
    """Whether nothing is recorded in ``phase`` (it may be left from before a reset)."""
    stages: dict[str, Any] = {}
    collect(phase.root, stages)
    return not (stages or phase.counters or phase.batch_samples or phase.workers or phase.steps)


class Beats:
    """A loop advanced by a framework's own calls (``iterate(beats=True)``): ``wait()`` ends the step under way
    and starts the wait for the next batch, ``go()`` ends the wait and starts the step. Its DataLoaders'
    workers count as busy for the advice while it runs."""

    def __init__(self, sw: Stopwatch, phase: str, source: Any = None) -> None:
        self._sw = sw
        self._steps: Generator[Any, None, None] = iterate(sw, (), "loader", "step", phase, source, beats=True)
        self._consuming: list[int] | None = None

    def wait(self) -> None:
        next(self._steps)
        if self._consuming is None:  # the loop's phase is the thread's from its first beat
            self._consuming = self._sw.workers.consuming_interval()

    def go(self) -> None:
        next(self._steps)

    def close(self) -> None:
        self._steps.close()
        if self._consuming is not None:
            self._consuming[1] = time.perf_counter_ns()


class DrivenLoop:
    """The steps of a program without a DataLoader loop: a timed loop advanced at each optimizer step."""

    def __init__(self, session: AutoSession) -> None:
        self.thread = get_ident()
        self._session = session
        self._steps = iterate(session.sw, itertools.repeat(None), "loader", "step", DEFAULT_PHASE, driven=True)
        next(self._steps)
        self._trained_at_step = session.training_blocks
        self._zero_grads_at_step = session.zero_grads

    def tick(self) -> None:
        next(self._steps)
        self._trained_at_step = self._session.training_blocks
        self._zero_grads_at_step = self._session.zero_grads

    def close(self) -> None:
        """Ends the steps. The time since the last optimizer step is a step of its own if it did training work
        (a forward, loss or backward: its blocks are already counted under ``step``, so the step must be too);
        else it is not a step (the trailing ``zero_grad`` after the last optimizer step, an evaluation, which
        is the val phase) and is dropped, with the ``zero_grad`` calls it timed."""
        session = self._session
        if session.training_blocks != self._trained_at_step:
            self.tick()
        else:
            untimed = session.zero_grads - self._zero_grads_at_step
            if untimed:
                forget_last(session.sw, ("step", "zero_grad"), untimed)
        self._steps.close()


def forget_last(sw: Stopwatch, path: tuple[str, ...], count: int) -> None:
    """Takes back the last ``count`` measurements of the train phase's stage at ``path`` (still buffered: a
    step that turned out not to be one)."""
    phase = sw.tree.phases.get(DEFAULT_PHASE)
    node = phase.root if phase is not None else None
    for name in path:
        node = node.children.get(name) if node is not None else None
    if node is not None:
        del node.buf[max(len(node.buf) - count, 0) :]
