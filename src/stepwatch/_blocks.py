"""Timed blocks: ``with sw.timed("forward"):`` and ``@sw.timed("augment")``.

A stage's block is made once and reused for every call. Its entry and exit, the hot path, are
:class:`~stepwatch._block_base.BlockBase`'s (in C where it was built); the classes here add what the rarer
cases need: a timeline, a device, a stopwatch switched off after having been on.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ._block_base import COMPILED, BlockBase
from ._constants import FIRST_BATCH, FIRST_STEP, FOLD, MAX_STAGES, OTHER, OVERFLOW
from ._periodic import PeriodicCalls
from ._stacks import DROPPING, ThreadStacks
from ._tree import DROPPED, LOOP, Node, Phase

if COMPILED:  # the C side reads these classes' hot-path slots at their offsets (_slots.c)
    from ._speedups import configure_slots  # type: ignore[import-not-found,unused-ignore]

    configure_slots(ThreadStacks, Node, Phase, LOOP, PeriodicCalls)

if TYPE_CHECKING:
    from ._recorder import Stopwatch

F = TypeVar("F", bound=Callable[..., Any])

_RESERVED = {OTHER: "the time a parent's blocks do not cover", OVERFLOW: "stages past the limit"}


class Block(BlockBase):
    """A timed block for one stage name; reused for every call, so entering allocates one small tuple.

    ``inside`` lists the threads inside this block opened while the stopwatch was off after having been on
    (see :class:`DroppedBlock`): a thread's identity once per open call, taken into the thread's stack when
    stepwatch is switched on again."""

    __slots__ = ()

    def __init__(self, stopwatch: Stopwatch, name: str) -> None:
        self._sw = stopwatch
        self._stacks = stopwatch.stacks  # kept: read at every entry and exit (see Blocks.follow_state)
        self._name = name
        self._clock = stopwatch.clock
        self.inside = []

    def _closed_live(self, exc_type: object, exc: object, tb: object) -> None:
        """The exit of a dropped block (see :class:`DroppedBlock`) that has no note of its thread: one opened while
        on, or whose note was taken into its thread's stack (its class may have changed since its entry)."""
        live_class(self._sw).__exit__(self, exc_type, exc, tb)

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
    (:meth:`Blocks.follow_switch` changes the blocks' class). It reads no clock, no flag and no stack: it only
    notes that this thread is inside it (``inside``, a thread identity per open call): its entry and exit are
    ``BlockBase``'s ``_dropped_enter``/``_dropped_exit``, in C where the blocks are compiled (a ``with`` of it
    then costs about 0.6x ``contextlib.nullcontext()``, against 0.9x in Python). When stepwatch is switched on
    again, each thread's stack is rebuilt with a dropped frame for each block it is still inside
    (:meth:`Blocks.take_inside`), so that the blocks opened inside them never show at top level. A dropped
    block that finds no note of its thread on the way out (opened while on, or its note already taken into the
    thread's stack) closes as its live class would. Entered in the instant between the switch and its class
    following it, it is dropped with what opens inside it."""

    __slots__ = ()

    __enter__ = BlockBase._dropped_enter
    __exit__ = BlockBase._dropped_exit


def live_class(sw: Stopwatch) -> type[Block]:
    """The class of a stopwatch's blocks while it records: with its device, its timeline, or neither."""
    return DeviceBlock if sw.device is not None else TracedBlock if sw.timeline is not None else Block


class Blocks:
    """The timed blocks of one stopwatch. ``by_name`` maps a stage name to its block: a plain dict, read
    directly by :meth:`Stopwatch.timed <stepwatch.Stopwatch.timed>` (never rebound, cleared in place); a new
    name is checked once, by :meth:`make`. Past :data:`MAX_STAGES` names, new ones share one uncached block
    named :data:`OVERFLOW`. ``made`` keeps every block made, those dropped by :meth:`clear` too, since their
    callers (decorated functions, a block kept in a variable) keep using them."""

    def __init__(self, stopwatch: Stopwatch) -> None:
        self._stopwatch = stopwatch
        self.by_name: dict[str, Block] = {}
        self.made: list[Block] = []
        self.dropping = False  # the blocks are dropped blocks (off after having been on)
        self.count: Any = None  # the stopwatch's count() and timed(), kept here to follow its state with the blocks
        self.lookup: Any = None

    def __len__(self) -> int:
        return len(self.by_name)

    def make(self, stage: str) -> Block:
        """The block of a stage name not used before (or the overflow block)."""
        check_name(stage, "stage")
        sw = self._stopwatch
        kind = DroppedBlock if sw.stacks.measuring is DROPPING else live_class(sw)
        by_name = self.by_name
        if len(by_name) >= MAX_STAGES:
            sw.tree.warn_overflow(stage)
            overflow = by_name.get(OVERFLOW)
            if overflow is None:
                overflow = by_name.setdefault(OVERFLOW, self._make(kind, OVERFLOW))
            return overflow
        return by_name.setdefault(stage, self._make(kind, stage))

    def clear(self) -> None:
        """Blocks are made again on next use, of the class a new timeline or device needs."""
        self.by_name.clear()

    def _make(self, kind: type[Block], stage: str) -> Block:
        block = kind(self._stopwatch, stage)
        self.made.append(block)
        return block

    def take_inside(self, thread: int) -> list[Block]:
        """The blocks this thread opened while switched off and is still inside, each once per open call;
        their notes are taken (the thread's stack holds them from now on)."""
        found = []
        for block in list(self.made):
            inside = block.inside
            while inside and thread in inside:
                inside.remove(thread)
                found.append(block)
        return found

    def threads_inside(self) -> set[int]:
        """The threads inside a block opened while switched off."""
        return {thread for block in list(self.made) for thread in list(block.inside)}

    def forget_threads(self, threads: set[int]) -> None:
        """Threads that ended inside blocks opened while switched off (a generator never finished)."""
        for block in list(self.made):
            for thread in [thread for thread in block.inside if thread in threads]:
                block.inside.remove(thread)

    def forget_inside(self) -> None:
        """In a forked DataLoader worker: no thread of the parent is inside anything here."""
        for block in self.made:
            block.inside.clear()

    def follow_switch(self) -> None:
        """After the stopwatch was switched on or off: its blocks are dropped blocks while it is off after
        having been on, their live class otherwise; those dropped by ``clear()`` too, since callers keep them."""
        sw = self._stopwatch
        self.dropping = sw.stacks.measuring is DROPPING
        self._become(DroppedBlock if self.dropping else live_class(sw))

    def lent(self) -> None:
        """The default stopwatch's blocks while its state is lent to another stopwatch (see
        ``_default_instance.lent_to``): dropped blocks become their live class, so they record into it. They
        stay so until the next switch: a live block keeps what the switch guarantees while off, at more cost."""
        if self.dropping:
            self.dropping = False
            self._become(live_class(self._stopwatch))
        self.follow_state()

    def follow_state(self) -> None:
        """The stopwatch's state was swapped whole (lent, given back, or shared in a worker: see
        ``_default_instance``): every block made, and the compiled ``count`` and ``timed`` made with these
        blocks, keep the stacks (tree, blocks by name) they use, so each is pointed at the state's now."""
        sw = self._stopwatch
        stacks = sw.stacks
        for block in self.made:
            block._stacks = stacks
        if hasattr(self.count, "_stacks"):
            self.count._stacks = stacks
            self.count._tree = sw.tree
        if hasattr(self.lookup, "_by_name"):
            self.lookup._by_name = sw._by_name

    def _become(self, kind: type[Block]) -> None:
        for block in self.made:
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


def block_lookup(stopwatch: Stopwatch) -> Callable[[str], Block]:
    """What ``stopwatch.timed`` is: the method bound to it, or, where the speedups are built and on, a C callable
    that reads a name used before from ``by_name`` (no Python frame: about half a microsecond a block in a real
    step) and hands every other call to the method."""
    bound: Callable[[str], Block] = types.MethodType(type(stopwatch).timed, stopwatch)
    if not COMPILED:
        return bound
    from ._speedups import Lookup  # type: ignore[import-not-found,unused-ignore]

    return Lookup(stopwatch._by_name, bound)  # type: ignore[no-any-return,unused-ignore]
