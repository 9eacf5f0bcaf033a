"""A timed block's state and its ``__enter__``/``__exit__``: the one hot path every timed block runs.

Two implementations of :class:`BlockBase` behave the same: this module's, in Python, and ``stepwatch._speedups``
(``_speedups.c``), the same reads and writes in C, built by ``pip install`` where a C compiler and Python's
headers are found. The C one is used when it was built, unless ``STEPWATCH_PURE_PYTHON=1``; the Python one
everywhere else. A block leaves a frame on its thread's stack while open; on the way out it expects its own
frame on top. When it is not there (asyncio tasks whose blocks overlap on one thread, a block closed out of
order), the cold path in :meth:`~stepwatch._stacks.ThreadStacks.unwind` drops the overlapping measurements
instead of letting a stale frame corrupt the hierarchy of everything after it.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from threading import get_ident
from typing import TYPE_CHECKING, Any

from ._constants import FOLD

if TYPE_CHECKING:
    from ._recorder import Stopwatch
    from ._stacks import ThreadStacks


class PythonBlockBase:
    """The Python implementation: a few attribute reads, two clock reads, a tuple and one list append."""

    __slots__ = ("_clock", "_name", "_stacks", "_sw", "inside")

    _sw: Stopwatch
    _stacks: ThreadStacks  # the stopwatch's, kept (see Blocks.follow_state)
    _name: str
    _clock: Callable[[], int]
    inside: list[int]

    def __enter__(self) -> None:
        stacks = self._stacks
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
        stacks = self._stacks
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

    def _dropped_enter(self) -> None:
        """A dropped block's entry (``_blocks.DroppedBlock``): notes that this thread is inside it."""
        self.inside.append(get_ident())

    def _dropped_exit(self, exc_type: object, exc: object, tb: object) -> None:
        """A dropped block's exit: takes back this thread's note, or, finding none, closes as its live class
        would (``_closed_live``, defined by ``_blocks.Block``)."""
        try:
            self.inside.remove(get_ident())
        except ValueError:
            self._closed_live(exc_type, exc, tb)  # type: ignore[attr-defined]


def _compiled() -> type[PythonBlockBase] | None:
    """The C implementation, if it was built and is not turned off."""
    if os.environ.get("STEPWATCH_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        from ._speedups import BlockBase as compiled  # type: ignore[import-not-found]
        from ._speedups import configure
    except ImportError:
        return None
    configure(FOLD)
    return compiled  # type: ignore[no-any-return]


if TYPE_CHECKING:
    BlockBase = PythonBlockBase
else:
    BlockBase = _compiled() or PythonBlockBase
COMPILED = BlockBase is not PythonBlockBase
"""Whether timed blocks run the C implementation."""
SPEEDUPS: Any = importlib.import_module("._speedups", __package__) if COMPILED else None
"""The compiled module where built and on, else None: what a loop's start takes from it is read as its attributes,
not by an import statement, which runs about 15 us of cold code there (the model's work has left it cold)."""


def python_swap_frame(
    stacks: Any,
    local: Any,
    stack: list[Any],
    frame: Any,
    node: Any,
    next_node: Any,
    phase: Any,
    clock: Callable[[], int],
    ends_step: bool,
    counted: bool,
) -> tuple[Any, Any, int] | None:
    """One half of a timed loop's steady step boundary (``_loops.iterate``): if ``frame``, a loop frame of
    ``node``, is on top of this thread's ``stack``, unswitched (and, at the end of a step, measuring), reads
    ``clock``, closes the frame then into ``node``'s buffer and the phase's loop time (its steps too, at the end
    of a step; its schedule's position where ``counted``) and opens and returns ``(LOOP, next_node, now)``; None,
    having changed nothing and read no clock, otherwise. ``_boundary.c`` is the same in C."""
    if not stack or stack[-1] is not frame or frame[1] is not node or stacks.local is not local:
        return None
    if ends_step and not stacks.measuring:
        return None
    now = clock()
    elapsed = now - frame[2]
    del stack[-1]
    buf = node.buf
    buf.append(elapsed)
    if len(buf) >= FOLD:
        stacks.fold(node)
    phase.loop_ns += elapsed
    if ends_step:
        phase.steps += 1
    if counted:
        phase.schedule_pos += 1
    opened = (frame[0], next_node, now)  # (the owner of a loop's frames is LOOP)
    stack.append(opened)
    return opened


fold_durations: Callable[[list[int]], tuple[int, int, int, int] | None] | None = None
"""A stage's buffer folded in one pass in C (``_fold.c``), where the blocks are compiled: ``(total, sum of
squares, min, max)``, or None where it cannot be exact; None elsewhere (``RunningStats.add_batch`` then runs its
Python loops)."""
if COMPILED:
    from ._speedups import fold_durations as fold_durations  # type: ignore[import-not-found,no-redef,unused-ignore]

AutoCall: Any = None
"""auto()'s wrappers' common case in C (``_auto_calls.c``), where the blocks are compiled; None elsewhere."""
AutoState: type = object
"""The base of ``AutoSession``: its state read by those wrappers, as C fields where they are compiled."""
AutoSteps: Any = None
"""auto()'s loop over a DataLoader's watched batches in C (``_auto_steps.c``), where the blocks are compiled; None
elsewhere (``_auto_steps.python_steps`` then)."""
share_session: Callable[[Any], Any] | None = None
"""Hands ``_patches.session`` to ``AutoCall`` at each assignment (returning the one before), where the blocks are
compiled; None elsewhere."""
if COMPILED:
    from ._speedups import AutoCall as AutoCall  # type: ignore[import-not-found,no-redef,unused-ignore]
    from ._speedups import AutoState as AutoState  # type: ignore[import-not-found,no-redef,unused-ignore]
    from ._speedups import AutoSteps as AutoSteps  # type: ignore[import-not-found,no-redef,unused-ignore]
    from ._speedups import share_session as share_session  # type: ignore[import-not-found,no-redef,unused-ignore]

swap_frame: Callable[..., tuple[Any, Any, int] | None] = python_swap_frame
"""A timed loop's steady step boundary, one half: :func:`python_swap_frame`, or the same in C."""
SteadyLoop: Any = None
"""A timed loop's steady steps as an iterator in C (``_steady.c``), where the blocks are compiled; None elsewhere
(``_loops.iterate`` then keeps its own loop)."""
DirectLoop: Any = None
"""A timed loop's iterator in C that runs its ``SteadyLoop`` without resuming the loop's generator
(``_direct_loop.c``), where the blocks are compiled; None elsewhere (the generator is the iterator then)."""
if COMPILED:
    from ._speedups import DirectLoop as DirectLoop  # type: ignore[import-not-found,no-redef,unused-ignore]
    from ._speedups import SteadyLoop as SteadyLoop  # type: ignore[import-not-found,no-redef,unused-ignore]
    from ._speedups import swap_frame as swap_frame  # type: ignore[import-not-found,no-redef,unused-ignore]

swap_class_function: Callable[[type, str, Any], bool] | None = None
"""A Python function on a class swapped for another in C without ``setattr``'s slot updates over its subclasses
(``_class_attrs.c``), where the blocks are compiled; None elsewhere (``_patches.set_on_class`` then sets it)."""
if COMPILED:
    from ._speedups import swap_class_function as swap_class_function  # type: ignore[import-not-found,no-redef,unused-ignore]
