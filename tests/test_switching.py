"""Switching and unusual control flow never corrupt what is recorded after them: reset() and
load_state_dict() inside a running loop, loops whose iter() fails, asyncio tasks whose blocks overlap,
abandoned loops, and disable()/enable()/reset() racing with threads inside blocks."""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from stepwatch import Stopwatch
from stepwatch._blocks import Block, DroppedBlock, TracedBlock

from .conftest import FakeClock

MS = 1_000_000  # ns


def data(clock: FakeClock, n: int, wait_ns: int = 3 * MS) -> Iterator[int]:
    for i in range(n):
        clock.advance(wait_ns)
        yield i


def train(sw: Stopwatch, clock: FakeClock, n: int = 20, on_step: Any = None) -> None:
    for k in sw.timed_iter(data(clock, n)):
        with sw.timed("forward"):
            clock.advance(1 * MS)
        sw.count(samples=1)
        if on_step is not None:
            on_step(k)


@pytest.mark.parametrize("how", ["reset", "load_state_dict of an empty run"])
def test_reset_inside_a_loop_records_the_rest_normally(clock: FakeClock, how: str) -> None:
    sw = Stopwatch(clock=clock)
    sw.enable()
    empty = Stopwatch().state_dict()

    def at_step(k: int) -> None:
        if k == 5:
            sw.reset() if how == "reset" else sw.load_state_dict(empty)

    train(sw, clock, 20, at_step)
    phase = sw.summary().main_phase
    stages = phase.stages
    assert phase.steps == 14  # steps 6..19; the step under way at the reset is dropped
    assert [stages[p].calls for p in ("loader", "step", "step/forward")] == [14, 14, 14]
    assert "forward" not in stages and "first_batch" not in stages
    assert phase.loop_ns == 14 * 4 * MS
    assert phase.counters["samples"] == 14
    assert phase.throughput["samples"] == pytest.approx(250.0)  # one sample per 4 ms, as it truly was
    assert sw.summary().verdict.kind == "input-bound"


def test_disable_then_enable_inside_a_running_loop_leaves_no_top_level_row(clock: FakeClock) -> None:
    """Switched off at step 10 and on again at step 20, each time before its forward: steps 10 to 20 are not
    recorded (step 20 began while off), and nothing lands at the phase's top level."""
    sw = Stopwatch(clock=clock)
    sw.enable()
    for k in sw.timed_iter(data(clock, 30)):
        if k == 10:
            sw.disable()
        if k == 20:
            sw.enable()
        with sw.timed("forward"):
            clock.advance(1 * MS)
    stages = sw.summary().main_phase.stages
    assert "forward" not in stages  # no phantom top-level row
    assert stages["step/forward"].calls == stages["step"].calls == sw.summary().main_phase.steps == 9 + 9
    assert stages["first_step/forward"].calls == 1


def test_load_state_dict_inside_a_loop_carries_on_from_the_checkpoint(clock: FakeClock) -> None:
    before = Stopwatch(clock=clock)
    before.enable()
    train(before, clock, 10)
    state = before.state_dict()

    sw = Stopwatch(clock=clock)
    sw.enable()
    train(sw, clock, 20, lambda k: sw.load_state_dict(state) if k == 5 else None)
    phase = sw.summary().main_phase
    assert phase.steps == 9 + 14  # the checkpoint's first step is a one-off, reported apart
    assert phase.stages["step/forward"].calls == 9 + 14
    assert phase.counters["samples"] == 9 + 14


class FailsToStart:
    """An iterable whose ``__iter__`` fails the first time (workers that fail to start)."""

    def __init__(self) -> None:
        self.failed = False

    def __iter__(self) -> Iterator[int]:
        if not self.failed:
            self.failed = True
            raise RuntimeError("workers failed to start")
        return iter(range(6))


def test_iter_failing_leaves_a_clean_state(clock: FakeClock) -> None:
    sw = Stopwatch(warmup=2, clock=clock)
    sw.enable()
    flaky = FailsToStart()
    with pytest.raises(RuntimeError, match="failed to start"):
        for _ in sw.timed_iter(flaky):
            pass
    assert len(sw.stacks.thread_stack()) == 1
    for _ in sw.timed_iter(flaky):
        clock.advance(MS)
    phase = sw.summary().main_phase
    assert phase.steps == 4  # warm-up still applies: 6 items, 2 skipped
    assert phase.stages["step"].calls == 4


def test_exceptions_from_data_and_body_leave_a_clean_state(clock: FakeClock) -> None:
    sw = Stopwatch(clock=clock)
    sw.enable()

    def broken() -> Iterator[int]:
        yield 1
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        for _ in sw.timed_iter(broken()):
            pass
    with pytest.raises(KeyError):
        for _ in sw.timed_iter(range(3)):
            raise KeyError("body")
    assert len(sw.stacks.thread_stack()) == 1
    train(sw, clock, 4)
    assert sw.summary().main_phase.stages["step/forward"].calls == 3


# -- asyncio -----------------------------------------------------------------------------------------------


def test_overlapping_async_blocks_are_dropped_and_said(clock: FakeClock) -> None:
    sw = Stopwatch()
    sw.enable()

    async def task(name: str, seconds: float) -> None:
        with sw.timed(name):
            await asyncio.sleep(seconds)

    async def main() -> None:
        await asyncio.gather(task("a", 0.01), task("b", 0.03))  # a ends while b, opened after it, is open

    asyncio.run(main())
    with sw.timed("after"):
        pass
    summary = sw.summary()
    assert set(summary.stages) == {"after"}  # nothing nests under a stale frame
    assert summary.metadata["dropped_blocks"] == 2
    assert "2 timed blocks were dropped" in sw.report()
    assert len(sw.stacks.thread_stack()) == 1


def test_timed_async_function_times_the_awaited_coroutine() -> None:
    sw = Stopwatch()
    sw.enable()

    @sw.timed("fetch")
    async def fetch() -> int:
        await asyncio.sleep(0.02)
        return 7

    assert asyncio.run(fetch()) == 7
    assert sw.summary().stages["fetch"].min >= 0.02


def test_timed_refuses_generator_functions() -> None:
    sw = Stopwatch()
    with pytest.raises(TypeError, match="generator function"):

        @sw.timed("gen")
        def gen() -> Iterator[int]:
            yield 1

    with pytest.raises(TypeError, match="generator function"):

        @sw.timed("agen")
        async def agen() -> Any:
            yield 1


# -- threads racing with the switch --------------------------------------------------------------------------


def test_switching_while_threads_are_inside_blocks_keeps_the_hierarchy() -> None:
    sw = Stopwatch()
    sw.enable()
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            with sw.timed("outer"):
                with sw.timed("inner"):
                    pass
                with sw.timed("inner"):
                    pass

    threads = [threading.Thread(target=work) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        for i in range(300):
            sw.disable()
            sw.enable()
            if i % 7 == 0:
                sw.reset()
        time.sleep(0.05)  # the threads record for a while after the last switch
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    stages = set(sw.summary().stages)
    assert stages <= {"outer", "outer/inner", "outer/other"}, stages
    assert "outer/inner" in stages
    with sw.timed("later"):
        pass
    assert "later" in sw.summary().stages


@pytest.mark.parametrize("switch", ["disable and enable", "reset"])
def test_a_thread_given_an_ended_threads_identity_never_takes_its_open_blocks_at_a_switch(switch: str) -> None:
    """A thread that ends inside a block (a generator never finished, a block never closed) leaves its stack
    open; a thread started after it is given its identity again (glibc reuses the ended thread's). At a switch
    the new thread must start from a stack of its own, not from the ended thread's with a dropped stand-in for
    the block it left open, inside which its blocks and counts would silently vanish (found by
    ``test_differential.py``: one run in four, as identities fell)."""
    for _ in range(50):  # until the second thread is given the first one's identity (nearly always at once)
        sw = Stopwatch()
        sw.enable()
        identities: list[int] = []

        def leave_a_block_open(sw: Stopwatch = sw, identities: list[int] = identities) -> None:
            identities.append(threading.get_ident())
            sw.timed("left open").__enter__()

        def switch_then_record(sw: Stopwatch = sw, identities: list[int] = identities) -> None:
            identities.append(threading.get_ident())
            if switch == "reset":
                sw.reset()
            else:
                sw.disable()
                sw.enable()
            sw.count(samples=60)
            with sw.timed("after"):
                pass

        for target in (leave_a_block_open, switch_then_record):
            thread = threading.Thread(target=target)
            thread.start()
            thread.join()
            time.sleep(0.01)  # the ended thread's stack handed back to the C library, to give its identity again
        if identities[0] == identities[1]:
            break
    assert identities[0] == identities[1], "no thread was given an ended one's identity in 50 tries"
    phase = sw.summary().phases["train"]
    assert phase.stages["after"].calls == 1, dict(phase.stages)
    assert phase.counters == {"samples": 60}
    assert sw.span.dropped_blocks == 0


def test_disable_drops_open_blocks_and_what_opens_inside_them(clock: FakeClock) -> None:
    sw = Stopwatch(clock=clock)
    sw.enable()
    with sw.timed("outer"):
        sw.disable()
        sw.enable()
        with sw.timed("inner"):  # inside a block that no longer counts: not a top-level row
            clock.advance(MS)
    with sw.timed("next"):
        clock.advance(MS)
    assert set(sw.summary().stages) == {"next"}
    assert not sw.stacks.hot or sw.stacks.measuring


def test_a_block_opened_while_off_keeps_what_opens_inside_it_off_the_top_level(clock: FakeClock) -> None:
    """Off after on, a block only pushes a dropped frame (its class is DroppedBlock, no clock read); switched
    on while it is open, the blocks opened inside it are dropped with it, and later ones count."""
    sw = Stopwatch(clock=clock)
    sw.enable(trace_steps=2)
    assert type(sw.timed("outer")) is TracedBlock
    sw.disable()
    outer = sw.timed("outer")
    assert type(outer) is DroppedBlock and type(sw.timed("made while off")) is DroppedBlock
    with outer:  # opened while off
        sw.enable()
        assert type(outer) is TracedBlock  # the same block, live again
        with sw.timed("inner"):
            clock.advance(MS)
        with sw.timed("inner"):
            clock.advance(MS)
    with sw.timed("next"):
        clock.advance(MS)
    assert set(sw.summary().stages) == {"next"}
    assert len(sw.stacks.thread_stack()) == 1


def test_a_block_entered_between_the_switch_and_its_class_following_is_dropped_cleanly(clock: FakeClock) -> None:
    """enable() switches on, then changes the blocks' class: a block entered in between is still a dropped
    block. Its class follows while it is open; it and what opens inside it are dropped, nothing is left."""
    sw = Stopwatch(clock=clock)
    sw.enable()
    sw.disable()
    block = sw.timed("stage")
    sw.stacks.enabled = True  # the switch as enable() makes it, before the blocks follow
    sw.stacks.update_flags()
    with block:
        sw._blocks.follow_switch()
        assert type(block) is Block
        with sw.timed("inner"):
            clock.advance(MS)
    with sw.timed("stage"):
        clock.advance(MS)
    stages = sw.summary().stages
    assert set(stages) == {"stage"} and stages["stage"].calls == 1
    assert block.inside == [] and len(sw.stacks.thread_stack()) == 1


def test_a_note_the_thread_stack_missed_is_taken_back_on_the_way_out(clock: FakeClock) -> None:
    """The same instant, when the thread's stack was rebuilt before the dropped block noted its thread: the
    block's exit, now live, finds no frame of its own and takes its note back, so no later stack inherits it."""
    sw = Stopwatch(clock=clock)
    sw.enable()
    sw.disable()
    block = sw.timed("stage")
    sw.stacks.enabled = True
    sw.stacks.update_flags()
    sw.stacks.thread_stack()
    with block:
        sw._blocks.follow_switch()
    assert block.inside == []
    sw.disable()
    sw.enable()
    with sw.timed("next"):
        clock.advance(MS)
    assert set(sw.summary().stages) == {"next"} and len(sw.stacks.thread_stack()) == 1


def test_off_after_on_a_block_notes_only_its_thread(clock: FakeClock) -> None:
    """Off after on, a block reads no clock and touches no stack: it notes the threads inside it, once per
    open call (the same block on two threads, or nested in itself), and forgets each on the way out."""
    sw = Stopwatch(clock=clock)
    sw.enable()
    sw.disable()
    block = sw.timed("stage")
    entered, leave = threading.Event(), threading.Event()

    def other_thread() -> None:
        with block:
            entered.set()
            leave.wait(5)

    thread = threading.Thread(target=other_thread)
    thread.start()
    entered.wait(5)
    with block, block:
        assert sorted(block.inside) == sorted([thread.ident, threading.get_ident(), threading.get_ident()])
        assert "stage" not in sw.stacks.by_thread.get(threading.get_ident(), [])
    assert block.inside == [thread.ident]
    leave.set()
    thread.join()
    assert block.inside == [] and not sw.stacks.by_thread
    assert sw.summary().stages == {}


def test_threads_inside_blocks_opened_while_off_get_their_inner_blocks_dropped() -> None:
    """Switched on while two threads are inside blocks opened while off: each thread's inner blocks are dropped
    with its block, the switching thread's own later blocks count."""
    sw = Stopwatch()
    sw.enable()
    sw.disable()
    switched, done = threading.Event(), threading.Event()

    def worker() -> None:
        with sw.timed("outer"):
            switched.wait(5)
            with sw.timed("inner"):
                pass
        done.set()

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    time.sleep(0.05)
    sw.enable()
    switched.set()
    for thread in threads:
        thread.join()
    with sw.timed("after"):
        pass
    assert set(sw.summary().stages) == {"after"}
    assert all(not block.inside for block in sw._blocks.made)


# -- abandoned loops -------------------------------------------------------------------------------------------


def test_abandoned_loop_is_detected_and_said(caplog: pytest.LogCaptureFixture) -> None:
    sw = Stopwatch()
    sw.enable()
    loop = sw.timed_iter(range(10))
    for i in loop:
        if i == 2:
            break  # kept in a variable: Python does not close it
    for _ in sw.timed_iter(range(3), phase="val"):
        pass
    assert "left (break or return) but not closed" in caplog.text
    loop.close()  # type: ignore[attr-defined]
    assert len(sw.stacks.thread_stack()) == 1


class Held:
    """Something a function holds in a local variable (a tensor, say), that can be seen to be freed."""


def test_a_loop_left_in_a_function_that_kept_it_ends_as_the_function_returns() -> None:
    """A loop kept in a local variable and left with ``break`` stays open while the function runs; when it returns,
    Python frees the variable, which closes the loop: the blocks after it are top-level, and what the function held
    is freed. stepwatch held the function's frame (to tell an abandoned loop), which kept its locals alive, the loop
    among them: it never closed, every block after it nested inside its first step, and the locals were never freed
    (found by running random programs split by a checkpoint)."""
    sw = Stopwatch()
    sw.enable()
    held: list[weakref.ref[Held]] = []

    def evaluate() -> None:
        kept, loop = Held(), sw.timed_iter(range(3))
        held.append(weakref.ref(kept))
        for index, _ in enumerate(loop):
            if index == 0:
                break

    evaluate()
    assert held[0]() is None, "the function's locals outlived it"
    with sw.timed("after"):
        pass
    assert sw.summary().stages["after"].calls == 1
    assert len(sw.stacks.thread_stack()) == 1 and not sw.loops.innermost_here()


def validate(sw: Stopwatch) -> None:
    for _ in sw.timed_iter(range(2), phase="val"):
        pass


def batches(sw: Stopwatch) -> Iterator[int]:
    yield from sw.timed_iter(range(3))


def test_loops_legitimately_nested_are_not_called_abandoned(caplog: pytest.LogCaptureFixture) -> None:
    sw = Stopwatch()
    sw.enable()
    for _ in sw.timed_iter(range(3)):  # inline
        for _ in sw.timed_iter(range(2), phase="val"):
            pass
    for _ in sw.timed_iter(range(3)):  # in a function called from the body
        validate(sw)
    for _ in enumerate(sw.timed_iter(range(3))):  # through enumerate
        validate(sw)
    for _ in batches(sw):  # consumed by a generator
        validate(sw)
    loop = sw.timed_iter(range(3))  # in a variable, but still running
    for _ in loop:
        validate(sw)
    assert "not closed" not in caplog.text
    assert sw.summary().phases["val"].steps == 5 * 3 * 1  # each val loop: a first step, then one step


def test_counts_after_a_reset_inside_a_validation_loop_stay_in_it(clock: FakeClock) -> None:
    sw = Stopwatch(clock=clock)
    sw.enable()
    for k in sw.timed_iter(data(clock, 6), phase="val"):
        if k == 2:
            sw.reset()
        sw.count(samples=1)  # right after the reset: still the val phase
    summary = sw.summary()
    assert "train" not in summary.phases
    assert summary.phases["val"].counters["samples"] == 3  # the step under way is dropped, its count too
    assert summary.phases["val"].steps == 3
