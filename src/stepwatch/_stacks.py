"""Per-thread stacks of open frames, and switching without touching another thread's stack.

``disable()``, ``reset()`` and ``load_state_dict()`` never edit the stack of another thread (which may be
pushing onto it at that moment): they replace the thread-local that holds the stacks, and each thread, the next
time it touches its stack, builds a new one from its old one with dropped stand-ins for the frames still open
(:func:`~stepwatch._tree.dropped_copy`). So blocks open at a switch are never half-counted, blocks opened inside
them are dropped with them, and no thread sees a stack in the middle of being changed.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from ._constants import DEFAULT_PHASE
from ._tree import DROPPED, LOOP, Frame, Phase, StageTree, dropped_copy

if TYPE_CHECKING:
    from ._blocks import Block
    from ._recorder import AutoHooks
    from ._run_span import RunSpan

DROPPING = 0
"""The value of ``Stopwatch._measuring`` when switched off after having been on (see ``_update_flags``)."""


class ThreadStacks:
    """The part of :class:`~stepwatch.Stopwatch` that keeps each thread's stack and the flags blocks read."""

    _lock: threading.RLock
    _local: threading.local
    _stacks: dict[int, list[Frame]]  # thread id -> its stack
    _before_switch: dict[int, list[Frame]]  # thread id -> its stack before the last switch
    _enabled: bool
    _was_enabled: bool
    _in_window: bool
    _measuring: bool | int
    _hot: bool
    span: RunSpan
    tree: StageTree
    auto_hooks: AutoHooks

    def _phase(self, name: str) -> Phase:
        raise NotImplementedError

    def _drop_open_frames(self) -> None:
        """Hands every thread a fresh stack (under the lock); see the module's docstring."""
        # every stack, even one with nothing open: its thread may be pushing onto it right now
        self._before_switch.update(self._stacks)
        self._stacks = {}
        self._local = threading.local()

    def _thread_stack(self) -> list[Frame]:
        """This thread's stack of open frames, made on first use (and after a switch)."""
        local = self._local
        stack: list[Frame] | None = local.__dict__.get("stack")
        if stack is None:
            with self._lock:
                local = self._local
                ident = threading.get_ident()
                before = self._before_switch.pop(ident, None)
                if before is None:
                    stack = [(None, self.tree.phase(DEFAULT_PHASE).root, 0)]
                else:
                    stack = [dropped_copy(frame) for frame in before]
                    roots = [self.tree.phase_of_root.get(frame[1]) for frame in stack[1:] if frame[0] is None]
                    if roots and roots[-1] is not None:
                        local.phase = roots[-1]
                local.stack = stack
                self._stacks[ident] = stack
        return stack

    def _update_flags(self) -> None:
        """``_measuring``: True, blocks open frames; :data:`DROPPING` (switched off after having been on),
        blocks open dropped frames, so that their children never show as top-level rows if it is switched on
        again while they are open; False (never on, or outside the measured window), blocks do nothing.
        DROPPING is falsy but not False: a block that reads ``_measuring`` twice while another thread switches
        it on sees True or DROPPING the second time, never False, so it always leaves a frame. ``_hot``: blocks
        look for their frame on the way out, needed while a block opened in the window (or dropped) is still
        open; otherwise leaving a block costs what it costs when the stopwatch has never been on."""
        if self._enabled:
            self._measuring = self._in_window
        else:
            self._measuring = DROPPING if self._was_enabled else False
        self._hot = self._measuring is not False or self._blocks_open()

    def _blocks_open(self) -> bool:
        """Whether any thread has a timed block open (checked only when the measured window closes)."""
        if self._before_switch:
            alive = {thread.ident for thread in threading.enumerate()}
            for ident in [ident for ident in self._before_switch if ident not in alive]:
                del self._before_switch[ident]
        stacks = [*self._stacks.values(), *self._before_switch.values()]
        return any(frame[0] is not None and frame[0] is not LOOP for stack in stacks for frame in stack)

    def _track(self, block: Block) -> None:
        """Switched off after having been on: the block opens a dropped frame (see :meth:`_update_flags`)."""
        try:
            stack = self._local.stack
        except AttributeError:
            stack = self._thread_stack()
        stack.append((block, DROPPED, 0))

    def _unwind(self, stack: list[Any], owner: Block) -> None:
        """A block's frame is not on top of its stack on the way out: if it is further down, the frames above
        it were opened while it was open but outlive it (asyncio tasks interleaving on one thread). Their
        nesting is wrong, so the block's measurement and theirs are dropped and counted in the summary; the
        hierarchy of what follows stays intact. An evaluation loop that auto-instrumentation opened inside the
        block is ended first, and the block then closes as usual."""
        end_segment = self.auto_hooks.end_evaluation
        if end_segment is not None and end_segment() and stack[-1][0] is owner:
            owner.__exit__(None, None, None)
            return
        with self._lock:
            for position in range(len(stack) - 1, 0, -1):
                if stack[position][0] is owner:
                    break
            else:
                return  # opened outside the measured window
            above = stack[position + 1 :]
            self.span.dropped_blocks += sum(1 for frame in [stack[position], *above] if frame[1] is not DROPPED)
            stack[position:] = [dropped_copy(frame) for frame in above]
            if not self._measuring:
                self._update_flags()
