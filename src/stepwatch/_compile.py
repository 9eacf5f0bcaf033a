"""torch.compile seen: each compilation (and recompilation) timed through torch's own compile callbacks
(``torch._dynamo.callback``), recorded as the phase's ``compile`` row and taken out of every block it ran in, so
that no steady-state step carries it; the step at which each happened is kept for the report.

The callbacks are installed when the program has imported ``torch._dynamo`` (``torch.compile`` does) by the time
stepwatch is enabled or a training loop starts; a torch without them is left alone. Compilation runs on the
thread that called the compiled function, so its time is taken out of that thread's open blocks. A compile id
``f/n`` with ``n > 0`` is the ``n``-th recompilation of frame ``f``.
"""

from __future__ import annotations

import logging
import sys
import weakref
from typing import TYPE_CHECKING, Any

from ._constants import COMPILE, FOLD
from ._loop_frames import delay_frames

if TYPE_CHECKING:
    from ._recorder import Stopwatch

logger = logging.getLogger("stepwatch")

MAX_EVENTS = 1000
"""Compilations kept for the report (the first ones); the row counts them all."""


class CompileWatch:
    """The compilations one stopwatch saw: ``events`` as ``[step, compile id, seconds, recompilation]``."""

    def __init__(self, sw: Stopwatch) -> None:
        self.sw = sw
        self.events: list[list[Any]] = []
        self.installed = False
        self._started: dict[int, int] = {}

    def install(self) -> None:
        """Registers the callbacks once, if torch's compiler is loaded and offers them."""
        if self.installed:
            return
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is None:
            return
        handler = getattr(getattr(dynamo, "callback", None), "callback_handler", None)
        if handler is None:
            return
        for callbacks, remove in (
            (handler.start_callbacks, handler.remove_start_callback),
            (handler.end_callbacks, handler.remove_end_callback),
        ):
            for callback in [one for one in callbacks if isinstance(one, WeakCallback) and one.dead]:
                remove(callback)  # those of stopwatches gone since
        handler.register_start_callback(WeakCallback(self, "started"))
        handler.register_end_callback(WeakCallback(self, "ended"))
        self.installed = True

    def started(self, args: Any) -> None:
        from threading import get_ident

        self._started[get_ident()] = self.sw.clock()

    def ended(self, args: Any) -> None:
        from threading import get_ident

        start = self._started.pop(get_ident(), None)
        sw = self.sw
        if start is None or not sw.stacks.enabled:  # a warm-up step's compilation counts too
            return
        duration = sw.clock() - start
        try:
            self._record(str(getattr(args, "compile_id", "?")), start, duration)
        except Exception as error:  # never fail the compilation
            logger.warning("stepwatch: could not record a compilation: %s", error)

    def _record(self, compile_id: str, start: int, duration: int) -> None:
        sw = self.sw
        stacks = sw.stacks
        stack: list[Any] = stacks.thread_stack()  # device frames are lists, changed in place
        name = stacks.phase_name()
        phase = sw.tree.phases.get(name) or sw.tree.phase(name)
        with sw.tree.lock:
            node = phase.root.children.get(COMPILE) or sw.tree.add_child(phase.root, COMPILE)
        node.buf.append(duration)
        if len(node.buf) >= FOLD:
            stacks.fold(node)
        delay_frames(stack, len(stack), duration)  # out of every block it ran in
        if sw.timeline is not None:
            sw.timeline.events += (node, start, start + duration, stack)
        if len(self.events) < MAX_EVENTS:
            # the step after warm-up as the window counts it, plus the warm-up; 0 within warm-up (which step
            # of it is not known there)
            step = phase.schedule_pos + (sw.schedule.warmup if phase.schedule_pos else 0)
            self.events.append([step, compile_id, duration / 1e9, _is_recompilation(compile_id)])


class WeakCallback:
    """A compiler callback that reaches its ``CompileWatch`` through a weak reference: torch keeps its callbacks
    for the life of the process, and a bound method kept each stopwatch that ever ran a loop, and all it recorded.
    Once the watch is gone, it does nothing, and the next ``install`` removes it (not this call: torch is
    iterating over its callbacks then)."""

    __slots__ = ("method", "watch")

    def __init__(self, watch: CompileWatch, method: str) -> None:
        self.watch = weakref.ref(watch)
        self.method = method

    @property
    def dead(self) -> bool:
        return self.watch() is None

    def __call__(self, args: Any) -> None:
        watch = self.watch()
        if watch is not None:
            getattr(watch, self.method)(args)


def _is_recompilation(compile_id: str) -> bool:
    """``0/1`` (frame 0's second compilation) is one; ``0/0`` and a lazily compiled backward are not."""
    _, _, attempt = compile_id.strip("[]").partition("/")
    digits = attempt.split("_", 1)[0]
    return digits.isdigit() and int(digits) > 0
