"""Per-thread stacks of open frames, the switch's flags that blocks read, and switching without touching
another thread's stack.

``disable()``, ``reset()`` and ``load_state_dict()`` never edit the stack of another thread (which may be
pushing onto it at that moment): they replace the thread-local that holds the stacks, and each thread, the next
time it touches its stack, builds a new one from its old one with dropped stand-ins for the frames still open
(:func:`~stepwatch._tree.dropped_copy`). So blocks open at a switch are never half-counted, blocks opened inside
them are dropped with them, and no thread sees a stack in the middle of being changed.
"""

from __future__ import annotations

import threading
from threading import get_ident
from typing import TYPE_CHECKING, Any

from ._constants import DEFAULT_PHASE
from ._tree import DROPPED, LOOP, Frame, Node, StageTree, dropped_copy, fold

if TYPE_CHECKING:
    from ._block_base import BlockBase
    from ._blocks import Blocks
    from ._recorder import AutoHooks
    from ._run_span import RunSpan
    from ._trace import Trace

DROPPING = 0
"""The value of :attr:`ThreadStacks.measuring` when switched off after having been on (see ``update_flags``)."""


class HotFlags:
    """The four slots of :class:`ThreadStacks` that blocks read on their way in and out, in a base class of their own.

    A class's slots lie in the object in the order of their names, after its bases' slots. Sorted among
    ThreadStacks' own, those a block reads lay 56 to 88 bytes from the object's header (its class, which it reads
    first): two cache lines at every block, some objects three, each cold in a real step. First, they share the
    header's line in most objects (``benchmarks/footprint.py``)."""

    __slots__ = ("hot", "local", "measuring", "timeline")


class ThreadStacks(HotFlags):
    """Each thread's stack of open frames and the switch's flags, for one :class:`~stepwatch.Stopwatch`.

    Hot-path handles, read directly by blocks, timed iterators and the workers' side (never written outside
    this class, except the thread-local's contents): ``local``, the thread-local holding this thread's
    ``stack`` and ``phase`` (replaced by a switch, so readers read it again, never keep it); ``measuring`` and
    ``hot`` (see :meth:`update_flags`). The switch itself: ``enabled``, ``was_enabled`` (ever on), and
    ``in_window`` (the schedule's measured window is open, set by the outermost loop through
    :meth:`set_window`). The lock is the stage tree's (``tree.lock``): the two change together.
    """

    __slots__ = (  # (with HotFlags'): a slot is found faster than a dictionary's key
        "auto_hooks",
        "before_switch",
        "blocks",
        "by_thread",
        "enabled",
        "in_window",
        "own_stacks",
        "span",
        "tree",
        "was_enabled",
    )

    def __init__(self, tree: StageTree, span: RunSpan, auto_hooks: AutoHooks, blocks: Blocks) -> None:
        self.tree = tree
        self.blocks = blocks  # the threads inside blocks opened while switched off, taken into their stacks
        self.span = span  # counts the blocks dropped by unwinding
        self.auto_hooks = auto_hooks  # ends auto-instrumentation's evaluation loop when unwinding
        self.timeline: Trace | None = None  # the recorder's, bounded when a stage folds
        self.local = threading.local()
        self.by_thread: dict[int, list[Frame]] = {}  # thread id -> its stack
        self.before_switch: dict[int, list[Frame]] = {}  # thread id -> its stack before the last switch
        self.own_stacks = threading.local()  # each thread's last stack, never replaced (see thread_stack)
        self.enabled = False
        self.was_enabled = False
        self.in_window = True
        self.measuring: bool | int = False
        self.hot = False

    def start_afresh(self) -> None:
        """In a forked DataLoader worker: no thread's stack survives the fork, and the switch is off."""
        self.by_thread = {}
        self.before_switch = {}
        self.local = threading.local()
        self.own_stacks = threading.local()
        self.blocks.forget_inside()
        self.enabled = False
        self.in_window = True

    def phase_name(self) -> str:
        """The phase this thread records into."""
        name: str = self.local.__dict__.get("phase", DEFAULT_PHASE)
        return name

    def drop_open_frames(self) -> None:
        """Hands every thread a fresh stack (under the lock); see the module's docstring."""
        # every stack, even one with nothing open: its thread may be pushing onto it right now
        self.before_switch.update(self.by_thread)
        self.by_thread = {}
        self.local = threading.local()

    def thread_stack(self) -> list[Frame]:
        """This thread's stack of open frames, made on first use (and after a switch, from its stack before it).
        A thread's identity is given again to a thread started after it ended: the stack kept for that identity
        at a switch is taken only by the thread that made it (``own_stacks``, a thread-local no switch replaces,
        holds it), never by a new thread, whose blocks would otherwise open inside the ended thread's open
        blocks and be dropped with them."""
        local = self.local
        stack: list[Frame] | None = local.__dict__.get("stack")
        if stack is None:
            with self.tree.lock:
                local = self.local
                ident = threading.get_ident()
                before = self.before_switch.pop(ident, None)
                if before is not None and self.own_stacks.__dict__.get("stack") is not before:
                    before = None  # an ended thread's, whose identity this thread was given
                if before is None:
                    stack = [(None, self.tree.phase(DEFAULT_PHASE).root, 0)]
                else:
                    stack = [dropped_copy(frame) for frame in before]
                    roots = [self.tree.phase_of_root.get(frame[1]) for frame in stack[1:] if frame[0] is None]
                    if roots and roots[-1] is not None:
                        local.phase = roots[-1]
                if self.was_enabled:  # blocks opened while switched off and still open: dropped frames
                    stack.extend((block, DROPPED, 0) for block in self.blocks.take_inside(ident))
                local.stack = stack
                self.own_stacks.stack = stack
                self.by_thread[ident] = stack
        return stack

    def set_window(self, in_window: bool) -> None:
        """The schedule's measured window opened or closed."""
        self.in_window = in_window
        self.update_flags()

    def update_flags(self) -> None:
        """``measuring``: True, blocks open frames; :data:`DROPPING` (switched off after having been on),
        blocks open dropped frames, so that their children never show as top-level rows if it is switched on
        again while they are open; False (never on, or outside the measured window), blocks do nothing.
        DROPPING is falsy but not False: a block that reads ``measuring`` twice while another thread switches
        it on sees True or DROPPING the second time, never False, so it always leaves a frame. ``hot``: blocks
        look for their frame on the way out, needed while a block opened in the window (or dropped) is still
        open; otherwise leaving a block costs what it costs when the stopwatch has never been on."""
        if self.enabled:
            self.measuring = self.in_window
        else:
            self.measuring = DROPPING if self.was_enabled else False
        self.hot = self.measuring is not False or self.blocks_open()

    def blocks_open(self) -> bool:
        """Whether any thread has a timed block open (checked only when the measured window closes)."""
        inside = self.blocks.threads_inside()
        if self.before_switch or inside:
            alive = {thread.ident for thread in threading.enumerate()}
            for ident in [ident for ident in self.before_switch if ident not in alive]:
                del self.before_switch[ident]
            if not inside <= alive:
                self.blocks.forget_threads(inside - alive)
                inside &= alive
        stacks = [*self.by_thread.values(), *self.before_switch.values()]
        return bool(inside) or any(frame[0] is not None and frame[0] is not LOOP for stack in stacks for frame in stack)

    def fold(self, node: Node) -> None:
        """A stage's buffer of recent measurements is full: fold it into the totals (under the lock). A dropped
        block (its buffer always reads as full) only forgets what it measured, without the lock."""
        if node is DROPPED:
            list.clear(node.buf)
            node.device_buf.clear()
            if self.measuring is False:
                with self.tree.lock:
                    self.update_flags()  # the last dropped block may have closed
            return
        if self.timeline is not None:  # blocks with no step: bounded all the same
            self.timeline.bound_loose()
        with self.tree.lock:
            fold(node)

    def track(self, block: BlockBase) -> None:
        """Switched off after having been on: the block opens a dropped frame (see :meth:`update_flags`)."""
        try:
            stack = self.local.stack
        except AttributeError:
            stack = self.thread_stack()
        stack.append((block, DROPPED, 0))

    def unwind(self, stack: list[Any], owner: BlockBase) -> None:
        """A block's frame is not on top of its stack on the way out: if it is further down, the frames above
        it were opened while it was open but outlive it (asyncio tasks interleaving on one thread). Their
        nesting is wrong, so the block's measurement and theirs are dropped and counted in the summary; the
        hierarchy of what follows stays intact. An evaluation loop that auto-instrumentation opened inside the
        block is ended first, and the block then closes as usual."""
        end_segment = self.auto_hooks.end_evaluation
        if end_segment is not None and end_segment() and stack[-1][0] is owner:
            owner.__exit__(None, None, None)
            return
        with self.tree.lock:
            for position in range(len(stack) - 1, 0, -1):
                if stack[position][0] is owner:
                    break
            else:  # opened outside the measured window, or as a dropped block an instant after a switch
                if get_ident() in owner.inside:
                    owner.inside.remove(get_ident())
                return
            above = stack[position + 1 :]
            self.span.dropped_blocks += sum(1 for frame in [stack[position], *above] if frame[1] is not DROPPED)
            stack[position:] = [dropped_copy(frame) for frame in above]
            if not self.measuring:
                self.update_flags()
