"""A timed loop's frames: the wait and the step closed into their stage's buffer (or dropped), a step's end
counted, the open blocks' starts delayed by time reported elsewhere (another phase's loop, a compilation), a step
into the timeline. The loops themselves are in ``_loops``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._constants import FOLD
from ._tree import DROPPED, LOOP, Phase

if TYPE_CHECKING:
    from ._device import _Loop
    from ._recorder import Stopwatch
    from ._trace import Trace


def end_of_data(sw: Stopwatch, local: Any, stack: list[Any], wait_frame: Any) -> None:
    """The data ran out: the wait still open for the next item (if any) is no wait, and is dropped."""
    if wait_frame is not None:
        stacks = sw.stacks
        close_frame(sw, stack if stacks.local is local else stacks.thread_stack(), wait_frame, None, None)


def trace_step(trace: Trace, frame: Any, end: int, stack: list[Any], phase: str | None) -> None:
    """The timeline: a step's body, then, for an outermost loop, the step's events into the ring."""
    if frame[1] is not DROPPED:
        trace.events += (frame[1], frame[2], end, stack)
    if phase is not None:
        trace.step_done(phase)


def end_step(
    sw: Stopwatch,
    stack: list[Any],
    frame: Any,
    end: int,
    phase: Phase | None,
    loop: _Loop | None,
    first_body_node: Any,
) -> None:
    """Closes a step's body; a step recorded in the steady state is counted (the first step of an epoch, a
    one-off, is recorded apart and counts neither in the loop's time nor in its steps)."""
    if frame[1] is first_body_node:
        if phase is not None:
            phase.in_first_step = False
        close_frame(sw, stack, frame, end, None, None)
    elif close_frame(sw, stack, frame, end, phase, loop) and phase is not None:
        phase.steps += 1


def exclude_from_enclosing(stack: list[Any], root_frame: Any, excluded_ns: int) -> None:
    """A loop of another phase (validation every N training steps) ran inside the blocks below its root on
    this stack: it is reported in its own phase, so its time is taken out of each of them, by moving their
    start later. Nothing happens if the root is no longer on the stack (the loop was abandoned and closed
    later)."""
    position = next((i for i in range(len(stack) - 1, 0, -1) if stack[i] is root_frame), 0)
    delay_frames(stack, position, excluded_ns)


def delay_frames(stack: list[Any], end: int, excluded_ns: int) -> None:
    """Moves the start of the open blocks ``stack[1:end]`` later by ``excluded_ns``: time spent in them that is
    reported elsewhere (another phase's loop, a compilation) is taken out of each."""
    for index in range(1, end):
        frame = stack[index]
        if frame[0] is None or frame[1] is DROPPED:
            continue
        if type(frame) is list:  # a device frame, changed in place
            frame[2] += excluded_ns
        else:
            stack[index] = (frame[0], frame[1], frame[2] + excluded_ns)


def close_frame(
    sw: Stopwatch, stack: list[Any], frame: Any, end: int | None, phase: Phase | None, loop: _Loop | None = None
) -> bool:
    """Records an open frame of a timed iterator (``end=None``: removes it unrecorded); ``phase`` gets the time
    when the loop owns it. A frame dropped meanwhile (``disable()``, ``reset()``) is removed unrecorded.
    Returns whether it was recorded."""
    if stack[-1] is frame:
        del stack[-1]
        start = frame[2]
    else:
        for position in range(len(stack) - 1, 0, -1):
            candidate = stack[position]
            # itself, or itself with a later start (see exclude_from_enclosing): the same loop node
            if candidate is frame or (candidate[0] is LOOP and candidate[1] is frame[1]):
                start = candidate[2]
                del stack[position:]
                break
        else:
            for position in range(len(stack) - 1, 0, -1):  # its stand-in after a switch
                if stack[position][0] is LOOP and stack[position][1] is DROPPED:
                    del stack[position:]
                    break
            return False
    if end is None:
        return False
    elapsed = end - start
    node = frame[1]
    node.buf.append(elapsed)
    if len(node.buf) >= FOLD:
        sw.stacks.fold(node)
    if len(frame) > 3 and sw.device_timer is not None:
        sw.device_timer.end(frame, stack[-1], node, loop)
    if phase is not None:
        phase.loop_ns += elapsed
    return True
