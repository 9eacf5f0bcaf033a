"""Where timed iterators run: the frame whose ``for`` statement consumes each (to tell a loop still running from
one abandoned, left with ``break`` while kept in a variable) and the loops open on each thread."""

from __future__ import annotations

import dis
import functools
import inspect
import logging
import threading
from types import CodeType, FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._recorder import Stopwatch

logger = logging.getLogger("stepwatch")


class LoopSite:
    """Where a timed iterator is consumed: the frame whose ``for`` statement iterates it, and where that
    statement's body ends, to tell a loop still running from one abandoned (left with ``break`` while kept in a
    variable, so Python does not close it).

    The frame is known by its identity and its code, never held: a frame held here kept the function's locals alive
    after it returned, among them the loop's own iterator, which then never closed (the loop stayed open, and every
    block after it nested inside its step), nor freed what the function's other locals held. Another frame of the
    same code at the same address, after that one ended, is taken for it: the worst that does is a warning given or
    not given (``check_enclosing``)."""

    __slots__ = ("code", "for_iter", "frame_id", "phase", "warned")

    def __init__(self, frame: FrameType | None, phase: str) -> None:
        self.code = frame.f_code if frame is not None else None
        self.frame_id = id(frame)
        self.for_iter = frame.f_lasti if frame is not None else -1
        self.phase = phase
        self.warned = False

    def abandoned(self, caller: FrameType | None) -> bool:
        """Whether the ``for`` statement over this loop has certainly ended, seen from ``caller`` (the frame
        starting another loop). When it cannot be known (no ``for`` statement, a generator's frame), False."""
        code = self.code
        if code is None:
            return False
        walker = caller
        while walker is not None and not (id(walker) == self.frame_id and walker.f_code is code):
            walker = walker.f_back
        if walker is None:  # a plain function's frame off the stack has returned; a generator's may resume
            return not code.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR)
        end = _loop_end(code, self.for_iter)
        return end is not None and not self.for_iter < walker.f_lasti < end


@functools.lru_cache(maxsize=256)
def _loop_end(code: CodeType, offset: int) -> int | None:
    """Where the ``for`` statement whose FOR_ITER is at ``offset`` ends; None if no FOR_ITER is there."""
    for instruction in dis.get_instructions(code):
        if instruction.offset == offset:
            return instruction.argval if instruction.opname == "FOR_ITER" else None
    return None


class OpenLoops:
    """The timed iterators open on each thread, innermost last, owned by one :class:`~stepwatch.Stopwatch`: for
    telling an abandoned loop from one still running, and whether a phase has a loop running."""

    def __init__(self) -> None:
        self.by_thread: dict[int, list[LoopSite]] = {}

    def here(self) -> list[LoopSite]:
        """This thread's open loops (a list the loop appends itself to, and removes itself from)."""
        return self.by_thread.setdefault(threading.get_ident(), [])

    def innermost_here(self) -> LoopSite | None:
        sites = self.by_thread.get(threading.get_ident())
        return sites[-1] if sites else None

    def running(self, phase: str) -> bool:
        """Whether a loop of ``phase`` is open on any thread."""
        return any(site.phase == phase for sites in list(self.by_thread.values()) for site in sites)

    def forget(self) -> None:
        """Starts afresh (in a forked DataLoader worker: the parent's loops are not this process's)."""
        self.by_thread = {}


def check_enclosing(sw: Stopwatch, site: LoopSite, frame: FrameType | None) -> None:
    """A loop starts inside another's open step, consumed in ``frame`` (None: not known): say so once if that
    other loop was in fact abandoned."""
    enclosing = sw.loops.innermost_here()
    if enclosing is None or enclosing.warned or sw.periodic.ticking:  # a log_every callback's loop: between steps
        return
    if enclosing.abandoned(frame):
        enclosing.warned = True
        logger.warning(
            "stepwatch: a timed loop of phase %r was left (break or return) but not closed: it is kept in a"
            " variable, so Python did not close it, and the loop starting now is counted inside its open step."
            " Close it first (loop.close()) or let a for statement own it",
            enclosing.phase,
        )
