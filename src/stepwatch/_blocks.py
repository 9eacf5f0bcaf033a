"""Timed blocks: ``with sw.timed("forward"):`` and ``@sw.timed("augment")``.

The hot path is kept to a few attribute reads, two clock reads, a tuple and one list append per block. A block
leaves a frame on its thread's stack while open; on the way out it expects its own frame on top. When it is
not there (asyncio tasks whose blocks overlap on one thread, a block closed out of order), the cold path in
:meth:`~stepwatch._stacks.ThreadStacks.unwind` drops the overlapping measurements instead of letting a stale
frame corrupt the hierarchy of everything after it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ._constants import FIRST_BATCH, FIRST_STEP, FOLD, MAX_STAGES, OTHER, OVERFLOW
from ._stacks import DROPPING
from ._tree import DROPPED

if TYPE_CHECKING:
    from ._recorder import Stopwatch

F = TypeVar("F", bound=Callable[..., Any])

_RESERVED = {OTHER: "the time a parent's blocks do not cover", OVERFLOW: "stages past the limit"}


class Block:
    """A timed block for one stage name; reused for every call, so entering allocates one small tuple."""

    __slots__ = ("_clock", "_name", "_sw")

    def __init__(self, stopwatch: Stopwatch, name: str) -> None:
        self._sw = stopwatch
        self._name = name
        self._clock = stopwatch.clock

    def __enter__(self) -> None:
        stacks = self._sw.stacks
        if stacks.measuring:
            try:
                stack = stacks.local.stack
            except AttributeError:
                stack = stacks.thread_stack()
            parent = stack[-1][1]
            node = parent.children.get(self._name)
            if node is None:
                node = self._sw.tree.add_child(parent, self._name)
            stack.append((self, node, self._clock()))
        elif stacks.measuring is not False:  # DROPPING (read again: it may have changed since)
            stacks.track(self)

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        stacks = self._sw.stacks
        if stacks.hot:
            end = self._clock()
            try:
                stack = stacks.local.stack
            except AttributeError:
                stack = stacks.thread_stack()
            frame = stack[-1]
            if frame[0] is self:
                del stack[-1]
                buf = frame[1].buf
                buf.append(end - frame[2])
                if len(buf) >= FOLD:  # (DROPPED's buffer always reads as full)
                    stacks.fold(frame[1])
            else:
                stacks.unwind(stack, self)

    def __call__(self, func: F) -> F:
        """Use as a decorator: every call of ``func`` is timed under this stage; an ``async def`` is timed
        until its coroutine finishes. Generator functions are refused: their body runs between the caller's
        steps, so a block around them would time the caller too."""
        if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
            raise TypeError(
                f"@timed({self._name!r}) cannot time the generator function {func.__qualname__}: its body runs"
                " piecewise between the caller's steps; time the loop over it with timed_iter(), or put"
                " `with timed(...)` inside it"
            )
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def awaited(*args: Any, **kwargs: Any) -> Any:
                with self:
                    return await func(*args, **kwargs)

            return awaited  # type: ignore[return-value]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"<stepwatch timed block {self._name!r}>"


class TracedBlock(Block):
    """A timed block that also puts its start and end on the timeline of recent steps (``trace_steps``).

    :class:`Block`'s exit, inlined with one more append, so that a stopwatch without a timeline pays nothing."""

    __slots__ = ()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        stacks = self._sw.stacks
        if stacks.hot:
            end = self._clock()
            try:
                stack = stacks.local.stack
            except AttributeError:
                stack = stacks.thread_stack()
            frame = stack[-1]
            if frame[0] is self:
                del stack[-1]
                node = frame[1]
                buf = node.buf
                buf.append(end - frame[2])
                trace = stacks.timeline
                if trace is not None and node is not DROPPED:
                    trace.events += (node, frame[2], end, stack)
                if len(buf) >= FOLD:
                    stacks.fold(node)
            else:
                stacks.unwind(stack, self)


class DeviceBlock(Block):
    """A timed block that also records device events and peak memory (a stopwatch with a device).

    Its frame lookup mirrors :class:`Block`'s, inlined on purpose: the CPU block's hot path cannot afford
    the call a shared helper would cost."""

    __slots__ = ()

    def __enter__(self) -> None:
        sw = self._sw
        stacks = sw.stacks
        if stacks.measuring:
            try:
                stack = stacks.local.stack
            except AttributeError:
                stack = stacks.thread_stack()
            parent_frame = stack[-1]
            parent = parent_frame[1]
            node = parent.children.get(self._name)
            if node is None:
                node = sw.tree.add_child(parent, self._name)
            device = sw.device_timer
            if device is None or node is DROPPED:
                stack.append((self, node, self._clock()))
                return
            start, allocated, reserved = device.begin(self._name, parent_frame, device.stage_memory)
            stack.append([self, node, self._clock(), start, allocated, reserved])
        elif stacks.measuring is not False:  # DROPPING (read again: it may have changed since)
            stacks.track(self)

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        sw = self._sw
        stacks = sw.stacks
        if stacks.hot:
            device = sw.device_timer
            if device is not None:
                device.before_clock()
            end = self._clock()
            try:
                stack = stacks.local.stack
            except AttributeError:
                stack = stacks.thread_stack()
            frame = stack[-1]
            if frame[0] is not self:
                stacks.unwind(stack, self)
                return
            del stack[-1]
            node = frame[1]
            node.buf.append(end - frame[2])
            trace = sw.timeline
            if trace is not None and node is not DROPPED:
                trace.events += (node, frame[2], end, stack)
            if len(node.buf) >= FOLD:
                stacks.fold(node)
            if device is not None and len(frame) > 3:
                device.end(frame, stack[-1], node)
                if isinstance(exc, BaseException) and device.backend.is_out_of_memory(exc):
                    device.record_out_of_memory(stacks.phase_name(), node.path, exc)


class DroppedBlock(Block):
    """What every block of a stopwatch switched off after having been on is, until it is switched on again
    (:meth:`Blocks.follow_switch` changes the blocks' class): it only pushes and pops a dropped frame, so that
    blocks opened inside it never show at top level if stepwatch is switched on while it is open, and reads
    no clock. A dropped block that finds the stopwatch measuring again (it was switched on while this block's
    class was being changed) becomes its live class and does what that does."""

    __slots__ = ()

    def __enter__(self) -> None:
        stacks = self._sw.stacks
        if stacks.measuring is not DROPPING:
            self.__class__ = live_class(self._sw)  # type: ignore[assignment]
            return self.__enter__()
        try:
            stack = stacks.local.stack
        except AttributeError:
            stack = stacks.thread_stack()
        stack.append((self, DROPPED, 0))

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        stacks = self._sw.stacks
        try:
            stack = stacks.local.stack
        except AttributeError:
            stack = stacks.thread_stack()
        frame = stack[-1]
        if frame[0] is self and frame[1] is DROPPED:
            del stack[-1]
        else:  # a frame opened by its live class, or one out of order: what the live class does
            live_class(self._sw).__exit__(self, exc_type, exc, tb)


def live_class(sw: Stopwatch) -> type[Block]:
    """The class of a stopwatch's blocks while it records: with its device, its timeline, or neither."""
    return DeviceBlock if sw.device is not None else TracedBlock if sw.timeline is not None else Block


class Blocks(dict[str, Block]):
    """The timed blocks of one stopwatch by stage name; a new name is checked once, on first use. Past
    :data:`MAX_STAGES` names, new ones share one uncached block named :data:`OVERFLOW`."""

    def __init__(self, stopwatch: Stopwatch) -> None:
        super().__init__()
        self._stopwatch = stopwatch

    def __missing__(self, stage: str) -> Block:
        check_name(stage, "stage")
        sw = self._stopwatch
        kind = DroppedBlock if sw.stacks.measuring is DROPPING else live_class(sw)
        if len(self) >= MAX_STAGES:
            self._stopwatch.tree.warn_overflow(stage)
            overflow = dict.get(self, OVERFLOW)
            if overflow is None:
                overflow = dict.setdefault(self, OVERFLOW, kind(self._stopwatch, OVERFLOW))
            return overflow
        return self.setdefault(stage, kind(self._stopwatch, stage))

    def follow_switch(self) -> None:
        """After the stopwatch was switched on or off: its blocks are dropped blocks while it is off after
        having been on, their live class otherwise."""
        sw = self._stopwatch
        kind = DroppedBlock if sw.stacks.measuring is DROPPING else live_class(sw)
        for block in self.values():
            block.__class__ = kind


def check_name(name: object, what: str) -> None:
    """A stage, body or phase name: a non-empty string without '/', control characters or a reserved name."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} name must be a non-empty string, got {name!r}")
    if "/" in name:
        raise ValueError(f"{what} name {name!r} must not contain '/': nesting blocks builds the hierarchy")
    if not name.isprintable():
        raise ValueError(f"{what} name {name!r} must not contain control characters (newlines, tabs)")
    if name in _RESERVED:
        raise ValueError(f"{what} name {name!r} is reserved for {_RESERVED[name]}")
    if name in (FIRST_BATCH, FIRST_STEP) and what != "phase":
        raise ValueError(f"{what} name {name!r} is reserved for the first step of each epoch")


def check_loop_names(stage: object, body: object, phase: object) -> None:
    check_name(stage, "stage")
    check_name(body, "body")
    if stage == body:
        raise ValueError(f"stage and body must differ: both are {stage!r}")
    if phase is not None:
        check_name(phase, "phase")
