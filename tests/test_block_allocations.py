"""What a compiled block allocates in its common case. It owns one frame tuple, refilled at each entry while
nothing else holds it (``_block_fast.c``, ``new_own_frame``): the same durations as a fresh frame, never a frame
anyone else holds, and nothing kept alive once the stopwatch goes. A stage's buffer grows by doubling up to the
fold size (``_frames.c``, ``make_room``)."""

from __future__ import annotations

import gc
import itertools
import sys
import time
import weakref

import pytest

from stepwatch import Stopwatch, _block_base
from stepwatch._blocks import Block

pytestmark = pytest.mark.skipif(
    not _block_base.COMPILED, reason="the compiled blocks were not built (pure-Python install)"
)


def open_frame(sw: Stopwatch) -> tuple[int, int]:
    """The identity and the start of the frame on top of this thread's stack, without holding it."""
    stack = sw.stacks.thread_stack()
    return id(stack[-1]), stack[-1][2]


def test_a_block_used_again_refills_its_frame_and_records_each_duration() -> None:
    sw = Stopwatch()
    sw.enable()
    block = sw.timed("step")
    identities: list[int] = []
    for round_ in range(6):
        if round_ == 3:
            sw.reset()  # a new tree: the kept frame's node is the old tree's until refilled
            sw.enable()
            block = sw.timed("step")
        before = time.perf_counter_ns()
        block.__enter__()
        identity, start = open_frame(sw)
        block.__exit__(None, None, None)
        after = time.perf_counter_ns()
        identities.append(identity)
        elapsed = sw.tree.phases["train"].root.children["step"].buf[-1]
        assert before <= start <= after and 0 <= elapsed <= after - before
    # from a block's third entry on (its first makes its stage, its second its frame), its own frame: after the
    # reset too, where the same block's first entry makes the new tree's stage
    assert identities[2] == identities[4] == identities[5] and identities[1] != identities[2], identities
    assert sw.summary().phases["train"].stages["step"].calls == 3
    assert sw.stacks.thread_stack() == [sw.stacks.thread_stack()[0]]


def test_a_frame_someone_holds_is_never_refilled() -> None:
    sw = Stopwatch()
    sw.enable()
    block = sw.timed("step")
    with block:
        held = sw.stacks.thread_stack()[-1]  # the program keeps the open frame
    snapshot = tuple(held)
    with block:
        assert sw.stacks.thread_stack()[-1] is not held
    assert tuple(held) == snapshot
    with block:
        pass  # the block's own frame again, which only it holds once closed
    found = [item for item in gc.get_referents(block) if isinstance(item, tuple) and len(item) == 3]
    assert len(found) == 1 and found[0][0] is block
    taken = found[0]  # taken from the collector, as a debugger would
    kept = tuple(taken)
    with block:
        assert sw.stacks.thread_stack()[-1] is not taken
    assert tuple(taken) == kept
    assert sw.summary().phases["train"].stages["step"].calls == 4


def test_a_block_inside_itself_keeps_one_frame_and_times_both() -> None:
    sw = Stopwatch()
    sw.enable()
    block = sw.timed("again")
    frames = []
    for round_ in range(4):
        before = time.perf_counter_ns()
        with block, block:
            pass
        after = time.perf_counter_ns()
        if round_:  # (the first entries make the stages, the next the frame)
            frames.append(block_frame(block))
    # from the third round, the outer entry refills the frame and the inner one, the frame on the stack, goes the
    # general way: the same frame throughout
    assert frames[1] is frames[2]
    outer = sw.tree.phases["train"].root.children["again"]
    assert 0 <= outer.children["again"].buf[-1] <= outer.buf[-1] <= after - before
    stages = sw.summary().phases["train"].stages
    assert stages["again"].calls == 4 and stages["again/again"].calls == 4
    assert sw.stacks.thread_stack() == [sw.stacks.thread_stack()[0]]


def test_a_stopwatch_whose_blocks_kept_frames_is_collected() -> None:
    """The kept frame holds its block, which holds it: the collector sees the cycle (the block's traversal) and
    frees both with the stopwatch."""
    names = {"kept-then-collected-a", "kept-then-collected-b"}

    def ours() -> list[object]:
        return [item for item in gc.get_objects() if issubclass(type(item), Block) and item._name in names]

    sw = Stopwatch()
    sw.enable()
    for name in sorted(names) * 2:  # (a first use goes the general way: a new stage)
        with sw.timed(name):
            pass
    assert len(ours()) == 2 and all(isinstance(item, tuple) for block in ours() for item in [block_frame(block)])
    gone = weakref.ref(sw)
    del sw
    gc.collect()
    assert gone() is None and ours() == []


def block_frame(block: object) -> object:
    """The frame a block keeps, found as the collector finds it."""
    return next(item for item in gc.get_referents(block) if isinstance(item, tuple) and item[:1] == (block,))


def test_a_stages_buffer_doubles_up_to_the_fold_size_and_keeps_every_duration() -> None:
    """A list grows by an eighth: 28 reallocations on the way to 1,024 items. Each stage's buffer, a block's and
    the loop's, is reallocated at most 8 times per fold, and records every call."""
    from stepwatch._constants import FOLD

    sw = Stopwatch()
    sw.enable()
    sizes: dict[str, list[int]] = {"step": [], "inner": []}
    for _ in sw.timed_iter(range(3 * FOLD)):
        with sw.timed("inner"):
            pass
        step = sw.tree.phases["train"].root.children["step"]
        for name, seen in sizes.items():
            node = step if name == "step" else step.children.get(name)
            if node is None:  # (the first step has a node of its own)
                continue
            size = sys.getsizeof(node.buf)
            if not seen or seen[-1] != size:
                seen.append(size)
    for name, seen in sizes.items():
        growths = sum(1 for before, after in itertools.pairwise(seen) if after > before)
        assert growths <= 3 * 8, (name, seen)
        assert max(seen) <= sys.getsizeof([]) + FOLD * 8, (name, seen)
    stages = sw.summary().phases["train"].stages
    assert stages["step/inner"].calls == 3 * FOLD - 1 and stages["step"].calls == 3 * FOLD - 1, stages.keys()
