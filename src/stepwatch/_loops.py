"""Timed iterators: the wait for each item (``loader``) and the loop body (``step``), phases and the schedule.

The outermost timed iterator on a thread defines the steps the schedule counts and the phase (``train`` unless
named). Each iteration reads the thread's stack afresh, so a ``reset()`` or ``load_state_dict()`` inside the
body (a common way to drop warm-up) leaves the rest of the loop recorded normally, and every way out of the
loop (the end of the data, ``break``, an exception from the data or the body, ``iter()`` itself failing)
leaves the stack as it found it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from ._batch_size import CountSamples
from ._block_base import DirectLoop, SteadyLoop, swap_frame
from ._constants import DEFAULT_PHASE, FIRST_BATCH, FIRST_STEP, FOLD
from ._dataloader.find import loader_config
from ._device import _Loop
from ._job import seen_by
from ._loop_frames import close_frame, end_of_data, end_step, exclude_from_enclosing, trace_step
from ._loop_sites import LoopSite, check_enclosing
from ._periodic import steps_before_due
from ._tree import DROPPED, LOOP, Frame, pop_frame

if TYPE_CHECKING:
    from ._recorder import Stopwatch

T = TypeVar("T")


WAITING: Any = object()
"""What a loop in beats yields when its wait begins."""

FETCHED, EXHAUSTED = 2, 3
"""How the steady steps in C (``SteadyLoop``, ``_steady.c``) stopped, besides before a step's end (1): an item
fetched whose step they could not open, or the end of the data (the wait still open)."""


def is_outermost(stack: list[Any]) -> bool:
    """Whether a loop starting on this stack is the outermost one of its thread (no phase root is open)."""
    return not any(frame[0] is None for frame in stack[1:])


def timed_loop(
    sw: Stopwatch, iterable: Iterable[T], stage: str, body: str, phase_name: str | None, **options: Any
) -> Iterator[T]:
    """A ``for`` statement's timed loop: :func:`iterate`'s generator, behind the compiled ``DirectLoop`` where it is
    built (its steady steps then run without resuming the generator; ``_direct_loop.c``)."""
    if DirectLoop is None:
        return iterate(sw, iterable, stage, body, phase_name, **options)
    delegate: list[Any] = [None]
    return DirectLoop(iterate(sw, iterable, stage, body, phase_name, **options, delegate=delegate), delegate)  # type: ignore[no-any-return]


def iterate(
    sw: Stopwatch,
    iterable: Iterable[T],
    stage: str,
    body: str,
    phase_name: str | None,
    source: Any = None,
    driven: bool = False,
    beats: bool = False,
    around: Callable[[], Callable[[], None]] | None = None,
    for_frame: bool = True,
    samples: tuple[int | None, int] | None = None,
    delegate: list[Any] | None = None,
) -> Generator[T, None, None]:
    """The generator behind :meth:`Stopwatch.timed_iter`; ``source``, when it is a DataLoader, has its
    configuration recorded for the phase (the advice depends on it). A ``driven`` loop is advanced by hooks
    rather than a ``for`` statement (auto-instrumentation's steps ended by optimizer steps): the step still
    open when it closes is not a step, and is dropped. A loop in ``beats`` is advanced in two beats per step by
    a framework's hooks (its fetch starting and ending): the first ``next()`` ends the step and starts the
    wait, yielding :data:`WAITING`; the second ends the wait and starts the next step, yielding None. ``around``
    is called as the loop starts (before ``iter(iterable)``) and what it returns as the loop ends: ``watch()``'s
    setup, with no generator of its own between the loop and its batches. ``for_frame``: whether the frame
    calling ``next()`` is the one whose ``for`` statement consumes the loop (not behind auto()'s iterator).
    ``samples``: count each measured step's batch's samples (``watch()``), ``(uniform, full)`` as
    :func:`~stepwatch._batch_size.uniform_batches` gives them; a loop without a phase of its own counts none (its
    batches are the enclosing step's). ``delegate``: where the ``SteadyLoop`` delegated to is put while it runs, for
    the ``DirectLoop`` in front of this generator (:func:`timed_loop`)."""
    clock = sw.clock
    stacks = sw.stacks
    stack = stacks.thread_stack()
    local = stacks.local  # replaced by a switch: then the stack is read again
    outer = is_outermost(stack)
    own_phase = outer or phase_name is not None
    previous_phase = stacks.phase_name()
    phase = sw.tree.phase(phase_name or (DEFAULT_PHASE if outer else previous_phase))
    root_frame: Frame | None = None
    wait_frame: Frame | None = None
    body_frame: Any = None
    device = sw.device_timer
    device_loop = _Loop(phase) if device is not None and own_phase else None
    loop_phase = phase if own_phase else None
    iterator: Any = None
    site = LoopSite(None if driven or beats or not for_frame else sys._getframe(1), phase.name)  # calling next()
    if outer:
        seen_by(sw.out)  # the job is kept while its group is up; rank 0 is to wait for this rank's run at exit
        sw.compiles.install()  # torch.compile loaded since stepwatch was enabled: its compilations are seen
    main = outer and sw.tree.is_main(phase.name)  # warm-up applies to it; evaluation loops measure from step 1
    trace = sw.timeline  # the timeline of recent steps, when kept
    periodic = sw.periodic
    every = periodic.every if main else ()  # what runs every N training steps
    live = sw.live if main else None  # the live view, drawn between two steps
    index = 0
    if not outer:
        check_enclosing(sw, site, sys._getframe(1) if site.code is not None else None)
    sites = sw.loops.here()
    sites.append(site)
    loop_started = clock()
    ended: Callable[[], None] | None = None
    counting = CountSamples(sw, phase, samples) if samples is not None and own_phase else None
    try:
        if own_phase:
            config = loader_config(iterable if source is None else source)
            if config is not None:
                sw.tree.loader_configs[phase.name] = config
            root_frame = (None, phase.root, 0)
            stack.append(root_frame)
            stacks.local.phase = phase.name
        parent = stack[-1][1]
        wait_node = parent.children.get(stage) or sw.tree.add_child(parent, stage)
        body_node = parent.children.get(body) or sw.tree.add_child(parent, body)
        first_node = parent.children.get(FIRST_BATCH) or sw.tree.add_child(parent, FIRST_BATCH)
        first_body_node = parent.children.get(FIRST_STEP) or sw.tree.add_child(parent, FIRST_STEP)
        schedule = sw.schedule
        measure_all = schedule.active is None
        warmup = schedule.warmup if main else 0
        if around is not None:
            ended = around()
        iterator = iter(iterable)
        # the steady state of a loop with nothing but its own frames to keep: closed and opened inline, below
        fast = outer and measure_all and device is None and trace is None and live is None and not (driven or beats)
        steady = fast and SteadyLoop is not None
        ticker = periodic if main else None  # what counts the training steps in the steady state
        item: Any = None
        while True:
            fetched = False  # an item the steady steps fetched without opening its step: the general path opens it
            if (
                steady
                and body_frame is not None
                and body_frame[1] is body_node
                and index >= warmup
                and (not every or (until_due := steps_before_due(every, periodic.ticks)) != 0)
            ):  # the steady state of most loops: the steps run in C (``_steady.c``) until it no longer holds, or
                # until a periodic call is due
                sizes = None if counting is None else counting.steady()  # (the batches' samples counted with)
                steps = SteadyLoop(
                    stacks, local, stack, body_frame, body_node, wait_node, phase, clock, iterator, ticker, index,
                    sizes, until_due if every else -1,
                )  # fmt: skip
                if delegate is not None:
                    delegate[0] = steps
                try:
                    yield from steps
                finally:  # (an exception from the data, or a close() between two items, goes on with these)
                    if delegate is not None:
                        delegate[0] = None
                    wait_frame, body_frame, index, outcome, item = steps.state()
                if outcome == EXHAUSTED:
                    end_of_data(sw, local, stack, wait_frame)
                    wait_frame = None
                    return
                fetched = outcome == FETCHED
            if not fetched:
                if (
                    fast
                    and not steady  # (compiled: SteadyLoop tried this very swap above, or it cannot hold)
                    and (not every or steps_before_due(every, periodic.ticks) != 0)
                    and index >= warmup
                    and (
                        opened := swap_frame(
                            stacks, local, stack, body_frame, body_node, wait_node, phase, clock, True, False
                        )
                    )
                ):  # the path of most steps in Python: what the general one below does in this case (the clock read,
                    # the step's body closed, the wait opened, the loop's own phase counting them), in one call
                    wait_frame, body_frame = opened, None
                    if main:
                        periodic.ticks += 1
                else:
                    if device is not None:
                        device.before_clock()
                    now = clock()
                    if stacks.local is not local:
                        local, stack = stacks.local, stacks.thread_stack()
                    if body_frame is not None:
                        frame, body_frame = body_frame, None
                        if stack[-1] is frame and frame[1] is body_node and device is None and loop_phase is not None:
                            # a steady-state step of the outer loop, closed as end_step would, inlined: the hot path
                            del stack[-1]
                            elapsed = now - frame[2]
                            buf = body_node.buf
                            buf.append(elapsed)
                            if len(buf) >= FOLD:
                                stacks.fold(body_node)
                            loop_phase.loop_ns += elapsed
                            loop_phase.steps += 1
                        elif frame[1] is DROPPED:  # a step that began while not measuring: not a step
                            close_frame(sw, stack, frame, None, None)
                            frame = None
                        else:
                            end_step(sw, stack, frame, now, loop_phase, device_loop, first_body_node)
                        if trace is not None and frame is not None:
                            trace_step(trace, frame, now, stack, phase.name if loop_phase is not None else None)
                    if device is not None:
                        device.poll()
                    if outer:
                        in_window = index >= warmup and (measure_all or schedule.measures(phase.schedule_pos))
                        if in_window != stacks.in_window:
                            stacks.set_window(in_window)
                            if not in_window and main and index > warmup and schedule.closes:
                                sw.window_end.closed(sw, index)  # the last measured step ended: report, save, stop
                        elif stacks.hot and not stacks.measuring:  # a block that spanned the window's end is done?
                            stacks.update_flags()
                        if every and index:
                            every = periodic.tick(every, now)  # between two steps: in neither, nor in the loop's time
                            now = clock()
                        elif main and index:
                            periodic.ticks += 1  # nothing left to call: the training step is still counted
                        if live is not None and now >= live.due_ns and index:
                            live.draw(now, phase, index)  # the live view, between two steps too
                            now = clock()
                    if stacks.measuring and not driven:  # a driven loop has no batch to wait for: no loader row
                        first = index == 0 and own_phase  # a one-off: workers starting, caches filling
                        wait_frame = (LOOP, first_node if first else wait_node, now)
                        stack.append(wait_frame)
                try:
                    item = (yield WAITING) if beats else next(iterator)
                except StopIteration:
                    end_of_data(sw, local, stack, wait_frame)
                    wait_frame = None
                    return
                if fast and (
                    opened := swap_frame(
                        stacks, local, stack, wait_frame, wait_node, body_node, phase, clock, False, index >= warmup
                    )
                ):
                    # the path of most steps again: the clock read, the wait closed, the step opened and counted
                    wait_frame, body_frame = None, opened
                    index += 1
                    if counting is not None:
                        counting.count(item, index)
                    yield item
                    continue
            ready = clock()
            if outer and index >= warmup:
                phase.schedule_pos += 1
            index += 1
            starting: bool | None = None  # set when a measured step starts: is it the loop's one-off first step
            if driven and stacks.measuring:  # no wait to close: the step starts at once
                if stacks.local is not local:
                    local, stack = stacks.local, stacks.thread_stack()
                starting = index == 1 and outer  # an evaluation's first forward (a loop in a step) is no one-off
            elif wait_frame is not None:
                frame, wait_frame = wait_frame, None
                if stacks.local is not local:
                    local, stack = stacks.local, stacks.thread_stack()
                starting = frame[1] is first_node
                if stack[-1] is frame and not starting and device is None:  # close_frame's common case, inlined
                    del stack[-1]
                    elapsed = ready - frame[2]
                    buf = wait_node.buf
                    buf.append(elapsed)
                    if len(buf) >= FOLD:
                        stacks.fold(wait_node)
                    if loop_phase is not None:
                        loop_phase.loop_ns += elapsed
                else:
                    close_frame(sw, stack, frame, ready, loop_phase if frame[1] is wait_node else None)
                if trace is not None and frame[1] is not DROPPED:
                    trace.events += (frame[1], frame[2], ready, stack)
            if starting is not None:
                node = first_body_node if starting else body_node
                if starting and loop_phase is not None:
                    loop_phase.in_first_step = True
                if device is None:
                    body_frame = (LOOP, node, ready)
                else:
                    start, allocated, reserved = device.begin(body, stack[-1])
                    body_frame = [LOOP, node, ready, start, allocated, reserved]
                stack.append(body_frame)
                if counting is not None:
                    if index == 1:
                        counting.check_first(item)
                    if not starting:
                        counting.count(item, index)
            elif own_phase and stacks.was_enabled:
                # a step that begins while not measuring: blocks in it (were stepwatch switched on in the middle
                # of it) are dropped with it, rather than recorded at the phase's top level
                if stacks.local is not local:
                    local, stack = stacks.local, stacks.thread_stack()
                body_frame = (LOOP, DROPPED, ready)
                stack.append(body_frame)
            yield item
    finally:
        end = clock()
        if live is not None:
            live.loop_ended(phase, index)
        stack = stacks.thread_stack()
        if wait_frame is not None:  # an exception in next()
            close_frame(sw, stack, wait_frame, end, loop_phase if wait_frame[1] is wait_node else None)
        if body_frame is not None and driven:  # no step ended it: not a step
            if loop_phase is not None:
                loop_phase.in_first_step = False
            close_frame(sw, stack, body_frame, None, None)
        elif body_frame is not None and body_frame[1] is DROPPED:
            close_frame(sw, stack, body_frame, None, None)
        elif body_frame is not None:  # a body left early: break, return or an exception
            end_step(sw, stack, body_frame, end, loop_phase, device_loop, first_body_node)
            if trace is not None:
                trace_step(trace, body_frame, end, stack, phase.name if loop_phase is not None else None)
        if device_loop is not None and device is not None:
            device.loop_finished(device_loop)
        if root_frame is not None:
            if not outer and phase.name != previous_phase:
                exclude_from_enclosing(stack, root_frame, end - loop_started)
            pop_frame(stack, root_frame)
            stacks.local.phase = previous_phase
        if outer:  # between loops, blocks are measured while the schedule still has steps to measure
            stacks.set_window(sw.schedule.measures(phase.schedule_pos))
        if site in sites:
            sites.remove(site)
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
        if ended is not None:
            ended()
