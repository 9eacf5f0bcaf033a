"""What a compiled block allocates in its common case. It owns one frame tuple, refilled at each entry while
nothing else holds it (``_block_fast.c``, ``new_own_frame``): the same durations as a fresh frame, never a frame
anyone else holds, and nothing kept alive once the stopwatch goes. A stage's buffer grows by doubling up to the
fold size (``_frames.c``, ``make_room``). On Python 3.11 the ints only stepwatch holds take new values in place
(``_ints.c``): a block's start, a loop's steady frame and the phase's totals, the dataset block's frame for a
batch's reads; never an int or a frame a program holds."""

from __future__ import annotations

import gc
import itertools
import sys
import time
import weakref
from typing import Any

import pytest
import torch

import stepwatch
from stepwatch import Stopwatch, _block_base
from stepwatch._blocks import Block
from stepwatch._self_cost import IN_SITU

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


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="a start is rewritten in place on Python 3.11 only")
def test_a_refilled_frame_rewrites_its_start_in_place_unless_someone_holds_it() -> None:
    """On 3.11 an entry gives the int its own frame held the new start's value, where nothing else holds it (no
    int made or freed); an int the program kept from an open frame keeps its value, the next entry makes a new
    one, and the entries after it rewrite that one."""
    sw = Stopwatch()
    sw.enable()
    block = sw.timed("step")
    identities: list[int] = []
    for round_ in range(7):
        before = time.perf_counter_ns()
        with block:
            start = sw.stacks.thread_stack()[-1][2]
            identities.append(id(start))
            assert before <= start <= time.perf_counter_ns()
            if round_ == 3:
                kept, kept_value = start, int(str(start))  # the program keeps it (its value copied beside)
            del start
        after = time.perf_counter_ns()
        elapsed = sw.tree.phases["train"].root.children["step"].buf[-1]
        assert 0 <= elapsed <= after - before
    # the third entry refills the frame (the first two make the stage and the frame) and the fourth rewrites its
    # int; the fifth makes a new one in place of the kept one, which the sixth and seventh rewrite
    assert identities[2] == identities[3] and identities[4] == identities[5] == identities[6], identities
    assert identities[4] != identities[3] and kept == kept_value
    assert sw.summary().phases["train"].stages["step"].calls == 7


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


def test_the_compiled_paths_fold_at_the_configured_power_of_two_and_refuse_other_sizes() -> None:
    """The C paths keep the fold size as its power of two, beside what a block's exit reads: a size that is not one
    is refused, and a smaller one folds the stage's buffer there, every duration kept."""
    if not _block_base.COMPILED:
        pytest.fail("this machine was expected to build the compiled blocks")
    from stepwatch import _speedups
    from stepwatch._constants import FOLD

    for wrong in (0, -8, 3, 12, FOLD - 1, FOLD + 1):
        with pytest.raises(ValueError, match="power of two"):
            _speedups.configure(wrong)
    sw = Stopwatch()
    sw.enable()
    longest = 0
    try:
        _speedups.configure(8)
        for _ in sw.timed_iter(range(200)):
            with sw.timed("inner"):
                pass
            inner = sw.tree.phases["train"].root.children["step"].children.get("inner")
            longest = max(longest, len(inner.buf) if inner is not None else 0)
    finally:
        _speedups.configure(FOLD)
    assert 0 < longest < 8
    assert sw.summary().phases["train"].stages["step/inner"].calls == 199


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="ints are rewritten in place on Python 3.11 only")
def test_a_steady_loop_refills_its_frame_and_totals_in_place_but_never_what_the_program_holds() -> None:
    """A loop's steady steps (``SteadyLoop``) close a frame and open the next in the same tuple, its start's int
    and the phase's loop time rewritten in place, where nothing else holds them; a frame or a total the program
    kept keeps its values, and the step after it opens a new one."""
    sw = Stopwatch()
    sw.enable()
    frames: list[int] = []
    totals: list[int] = []
    steps = IN_SITU + 100  # (the steps on which stepwatch measures its own cost are not the steady ones)
    kept_at = IN_SITU + 60
    for index in sw.timed_iter(range(steps)):
        phase = sw.tree.phases["train"]
        frame = sw.stacks.thread_stack()[-1]
        frames.append(id(frame))
        totals.append(id(phase.loop_ns))
        assert frame[2] <= time.perf_counter_ns()
        if index == kept_at:
            kept_frame, kept_items = frame, (frame[0], frame[1], int(str(frame[2])))
            kept_total, kept_value = phase.loop_ns, int(str(phase.loop_ns))
        del frame
    # the steady steps: one frame throughout, one int of the loop time, until the program keeps them
    steady = slice(IN_SITU + 20, kept_at + 1)
    assert len(set(frames[steady])) == 1 and len(set(totals[steady])) == 1, (frames, totals)
    assert frames[kept_at + 1] != frames[kept_at] and len(set(frames[kept_at + 1 :])) == 1
    assert totals[kept_at + 1] != totals[kept_at] and len(set(totals[kept_at + 1 :])) == 1
    assert (kept_frame[0], kept_frame[1], kept_frame[2]) == kept_items and kept_total == kept_value
    phase = sw.tree.phases["train"]
    stages = sw.summary().phases["train"].stages
    assert stages["step"].calls == stages["loader"].calls == phase.steps == steps - 1
    assert kept_value < phase.loop_ns == stages["step"].total_ns + stages["loader"].total_ns


class FramesSeen(torch.utils.data.Dataset[int]):
    """Each read notes whether the frame on top of the stack (the batch's ``dataset`` frame) is the ``dataset``
    block's own, and its start; at batch ``keep_at`` the dataset keeps that frame, as a program may."""

    def __init__(self, keep_at: int) -> None:
        self.seen: list[tuple[bool, int]] = []
        self.kept: list[tuple[Any, tuple[Any, ...]]] = []
        self.keep_at = keep_at

    def __len__(self) -> int:
        return 4 * 60

    def __getitem__(self, index: int) -> int:
        sw = stepwatch._default_instance.stopwatch
        frame = sw.stacks.thread_stack()[-1]
        own = [item for item in gc.get_referents(sw.timed("dataset")) if isinstance(item, tuple)]
        self.seen.append((own == [frame] and own[0] is frame, frame[2]))
        if index == 4 * self.keep_at:
            self.kept.append((frame, (frame[0], frame[1], int(str(frame[2])))))
        return index


def test_a_loaders_reads_refill_the_dataset_blocks_frame_but_never_one_the_dataset_holds() -> None:
    """A single-process loader's batch reads in C (``fetch_batch``) refill the ``dataset`` block's own frame, as a
    block's entry does; a frame the dataset kept keeps its items, and the next batches' reads open their own."""
    stepwatch.disable()
    stepwatch.reset()
    stepwatch.enable()
    dataset = FramesSeen(keep_at=40)
    try:
        batches = sum(1 for _ in stepwatch.watch(torch.utils.data.DataLoader(dataset, batch_size=4)))
        stages = stepwatch.summary().stages
    finally:
        stepwatch.disable()
        stepwatch.reset()
    own = [is_own for is_own, _ in dataset.seen[::4]]
    assert batches == 60 and own[5:41] == [True] * 36 and not any(own[41:]), own
    ((kept, items),) = dataset.kept
    assert (kept[0], kept[1], kept[2]) == items and kept[1].path.endswith("dataset")
    starts = [start for _, start in dataset.seen]
    assert all(starts[read] == starts[4 * (read // 4)] for read in range(len(starts)))  # one start a batch
    assert starts[::4] == sorted(starts[::4]) and len(set(starts)) == batches
    assert stages["loader/dataset"].calls + stages["first_batch/dataset"].calls == 4 * 60


def test_a_block_finds_its_stage_under_whichever_parent_it_opens_in() -> None:
    """A block's own frame keeps the node it last opened; on Python 3.11 its next entry takes it from there while
    the parent's children are as they were when it was found (``child_of``, _block_fast.c). Under another parent,
    in another phase, with a sibling added between two entries, or after a reset, each entry's time goes to the
    stage it opened in."""
    sw = Stopwatch()
    sw.enable()
    inner = sw.timed("inner")
    for round_ in range(12):
        with sw.timed("a" if round_ % 3 else "b"), inner:
            pass
        with inner:  # at the top level of the phase
            pass
        if round_ == 5:
            with sw.timed(f"sibling{round_}"):  # a new stage beside the block's parent
                pass
    for _ in sw.timed_iter(range(4), phase="val"):
        with inner:
            pass
    with inner:  # train again: its stage in the train phase, not in val's loop
        pass
    train = sw.summary().phases["train"].stages
    val = sw.summary().phases["val"].stages
    assert (train["a/inner"].calls, train["b/inner"].calls, train["inner"].calls) == (8, 4, 13)
    assert (val["first_step/inner"].calls, val["step/inner"].calls) == (1, 3) and "a/inner" not in val
    sw.reset()
    sw.enable()
    with sw.timed("a"), inner:
        pass
    assert sw.summary().phases["train"].stages["a/inner"].calls == 1
