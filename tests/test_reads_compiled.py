"""A batch's dataset reads and collate in the main process in C (``_reads.c``'s ``read_samples`` and
``collate_samples``) against the Python they stand in for (``TimedGetItems.read``, ``TimedCollate.__call__``):
the same samples, batches, rows, calls, stack and errors in every case they can meet, and the C ones are what a
single-process DataLoader of the default stopwatch uses where compiled: both in one call, ``_fetch.c``'s
``fetch_batch``, whose reads are run here as a third way and whose whole fetch against the two halves."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

import stepwatch
from stepwatch import _block_base, _default_instance
from stepwatch._constants import FOLD
from stepwatch._dataloader.in_workers import TimedCollate, TimedGetItems, dataset_timing

pytestmark = pytest.mark.skipif(not _block_base.COMPILED, reason="the C speedups were not built here")

Reads = Callable[[Any], Any]


class Samples(Dataset[int]):
    """Sample ``i`` is ``i * 10``; ``fail_at`` raises there; ``inside`` runs in each read (a block, a switch)."""

    def __init__(self, fail_at: int | None = None, inside: Callable[[], None] | None = None) -> None:
        self.fail_at, self.inside = fail_at, inside

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> int:
        if self.inside is not None:
            self.inside()
        if index == self.fail_at:
            raise KeyError(f"sample {index}")
        return index * 10


def python_reads(wrapper: TimedGetItems) -> Reads:
    return functools.partial(wrapper.read, _default_instance.stopwatch)


def compiled_reads(wrapper: TimedGetItems) -> Reads:
    from stepwatch._speedups import read_samples

    from stepwatch._dataloader.single_process import read_all

    sw = _default_instance.stopwatch
    return functools.partial(read_samples, wrapper.read, sw.timed("dataset"), wrapper.dataset, read_all)


def fetched_reads(wrapper: TimedGetItems) -> Reads:
    """The reads as ``fetch_batch`` makes them, its collate half left to a collate that is not enabled (the samples
    as they are, timed by nothing): ``single_process.install_fetch``'s spec."""
    from stepwatch._speedups import fetch_batch

    reads = compiled_reads(wrapper)
    _, block, dataset, read_all = reads.args
    collate = TimedCollate(lambda samples: samples, None)
    return functools.partial(fetch_batch, (reads, block, dataset, read_all, collate, stepwatch.timed("collate")))


def clean() -> None:
    """The default stopwatch off and empty, and this thread's stack without frames a test left open."""
    stepwatch.disable()
    stepwatch.reset()
    del _default_instance.stopwatch.stacks.thread_stack()[1:]


@pytest.fixture(autouse=True)
def fresh_default() -> Iterator[None]:
    clean()
    yield
    clean()


def outcome(make: Callable[[TimedGetItems], Reads], dataset: Any, batches: list[Any]) -> list[Any]:
    """Reads each batch inside a ``loader`` block of the default stopwatch: what each read returned or raised,
    the stack's depth after it, then the rows (path, calls) and the dataset node's batch entries' calls."""
    sw = _default_instance.stopwatch
    reads = make(dataset_timing(dataset, None))  # type: ignore[arg-type]
    seen: list[Any] = []
    with sw.timed("loader"):
        depth = len(sw.stacks.thread_stack())
        for indices in batches:
            events = len(sw.timeline.events) if sw.timeline is not None else None
            try:
                seen.append(reads(indices))
            except Exception as error:  # what is compared
                seen.append(repr(error))
            seen.append(len(sw.stacks.thread_stack()) - depth)
            if events is not None and sw.timeline is not None:
                seen.append(len(sw.timeline.events) - events)
        node = sw.tree.phase("train").root.children["loader"].children.get("dataset")
        seen.append([calls for calls, _ in node.batches] if node is not None else None)
    summary = stepwatch.summary()
    seen.append(sorted((row.path, row.calls) for row in summary.stages.values()) if summary.stages else [])
    return seen


def both(dataset: Any, batches: Callable[[], list[Any]], before: Callable[[], None] = stepwatch.enable) -> list[Any]:
    """Each way's outcome (``batches`` made afresh for each: some are iterators), asserted the same: the Python
    method, ``read_samples`` and ``fetch_batch``'s reads."""
    results = []
    for make in (python_reads, compiled_reads, fetched_reads):
        clean()
        before()
        results.append(outcome(make, dataset, batches()))
    assert results[0] == results[1], f"python: {results[0]}\nC: {results[1]}"
    assert results[0] == results[2], f"python: {results[0]}\nfetch_batch: {results[2]}"
    return results[1]


def test_a_batch_is_read_and_recorded_as_the_python_method_does() -> None:
    seen = both(Samples(), lambda: [[0, 1, 2], range(4, 8), iter([9])])
    assert seen[0] == [0, 10, 20] and seen[2] == [40, 50, 60, 70] and seen[4] == [90]
    assert seen[1] == seen[3] == seen[5] == 0  # the read's frame is gone
    assert seen[6] == [3, 4, 1]  # one entry per batch, its calls the samples read
    assert ("loader/dataset", 8) in seen[7]


def test_a_failing_read_counts_the_samples_read_and_the_failed_one_and_raises() -> None:
    seen = both(Samples(fail_at=5), lambda: [[3, 4, 5, 6, 7], [1]])
    assert seen[0] == "KeyError('sample 5')" and seen[1] == 0
    assert seen[4] == [3, 1]  # 3, 4 and the failing 5
    unsized = both(Samples(fail_at=5), lambda: [iter([3, 4, 5, 6])])
    assert unsized[2] == [1]  # indices without a length: the failed read alone, as in Python


def test_indices_that_cannot_be_iterated_raise_and_leave_nothing_open() -> None:
    seen = both(Samples(), lambda: [5, [1]])
    assert seen[0] == "TypeError(\"'int' object is not iterable\")" and seen[1] == 0
    assert seen[4] == [1]
    after_one = both(Samples(), lambda: [[1], 5, [2]])  # the node there already: fetch_batch's compact reads
    assert after_one[2] == "TypeError(\"'int' object is not iterable\")" and after_one[3] == 0
    assert after_one[6] == [1, 1]


def test_blocks_inside_the_reads_nest_under_dataset() -> None:
    def decode() -> None:
        with stepwatch.timed("decode"):
            pass

    seen = both(Samples(inside=decode), lambda: [[1, 2], [3]])
    assert ("loader/dataset/decode", 3) in seen[5]


def test_a_block_left_open_inside_a_read_is_handled_as_the_python_method_does() -> None:
    left_open = Samples(inside=lambda: stepwatch.timed("leaked").__enter__())
    seen = both(left_open, lambda: [[1]])
    assert seen[0] == [10] and seen[2] == []  # the read is not recorded: its nesting is wrong


def test_a_reset_inside_a_read_records_nothing_and_raises_nothing() -> None:
    seen = both(Samples(inside=stepwatch.reset), lambda: [[1, 2]])
    assert seen[0] == [10, 20]


def test_while_not_measuring_the_reads_go_to_the_python_method() -> None:
    def on_then_off() -> None:
        stepwatch.enable()
        stepwatch.disable()  # was on: dropping

    seen = both(Samples(), lambda: [[1, 2]], before=on_then_off)
    assert seen[0] == [10, 20]


def test_the_timeline_gets_the_batchs_event() -> None:
    def with_timeline() -> None:
        stepwatch.enable(trace_steps=4)

    try:
        seen = both(Samples(), lambda: [[1, 2], [3]], before=with_timeline)
    finally:
        _default_instance.stopwatch._set_timeline(None)
    assert seen[2] == seen[5] == 4  # each read's event: (node, start, end, stack)


def test_the_batches_fold_at_the_fold_size() -> None:
    seen = both(Samples(), lambda: [[1]] * (FOLD + 3))
    assert seen[-2] == [1, 1, 1]  # folded once FOLD entries were buffered
    assert ("loader/dataset", FOLD + 3) in seen[-1]


def test_a_single_process_loader_of_the_default_stopwatch_reads_in_c() -> None:
    from stepwatch._speedups import collate_samples, fetch_batch, read_samples

    stepwatch.enable()
    loader = DataLoader(TensorDataset(torch.arange(12.0)), batch_size=4)
    for (batch,) in stepwatch.watch(loader):
        assert batch.shape == (4,)
        made_now = loader._get_iterator()  # as the loop's was: the watched loader's iterators read through us
        assert made_now._dataset_fetcher.dataset.__getitems__.func is read_samples
        assert made_now._dataset_fetcher.collate_fn.func is collate_samples
        assert made_now._dataset_fetcher.fetch.func is fetch_batch  # the two in one call
    stages = stepwatch.summary().stages
    assert stages["first_batch/dataset"].calls + stages["loader/dataset"].calls == 12
    assert stages["first_batch/collate"].calls + stages["loader/collate"].calls == 3
    plain = loader._get_iterator()  # outside a watch() loop, the loader reads as torch does
    assert type(plain._dataset_fetcher.dataset) is TensorDataset


Collate = Callable[[Any], Any]


def python_collate(collate: TimedCollate) -> Collate:
    return collate


def compiled_collate(collate: TimedCollate) -> Collate:
    from stepwatch._speedups import collate_samples

    return functools.partial(collate_samples, collate, _default_instance.stopwatch.timed("collate"))


def collated(make: Callable[[TimedCollate], Collate], function: Collate, flags: tuple[bool, bool]) -> list[Any]:
    """Collates three batches inside a ``loader`` block of the default stopwatch, with the wrapper's
    (enabled, watching) ``flags``: what each returned or raised and the stack's depth after it, then the rows."""
    clean()
    stepwatch.enable()
    sw = _default_instance.stopwatch
    collate = TimedCollate(function, None)
    collate.enabled, collate.watching = flags
    call = make(collate)
    seen: list[Any] = []
    with sw.timed("loader"):
        depth = len(sw.stacks.thread_stack())
        for samples in ([1, 2], [3], [4, 5, 6]):
            try:
                seen.append(call(samples))
            except Exception as error:  # what is compared
                seen.append(repr(error))
            seen.append(len(sw.stacks.thread_stack()) - depth)
    seen.append(sorted((row.path, row.calls) for row in stepwatch.summary().stages.values()))
    return seen


def collated_both(function: Collate, flags: tuple[bool, bool] = (True, True)) -> list[Any]:
    python, compiled = (collated(make, function, flags) for make in (python_collate, compiled_collate))
    assert python == compiled, f"python: {python}\nC: {compiled}"
    return compiled


def test_a_collate_is_timed_as_the_python_wrapper_times_it() -> None:
    seen = collated_both(sum)
    assert seen[:6] == [3, 0, 3, 0, 15, 0]
    assert ("loader/collate", 3) in seen[6]


def test_blocks_inside_a_collate_nest_under_it() -> None:
    def stacked(samples: list[int]) -> int:
        with stepwatch.timed("stack"):
            return len(samples)

    assert ("loader/collate/stack", 3) in collated_both(stacked)[6]


def test_a_failing_collate_raises_through_its_block_and_leaves_nothing_open() -> None:
    def fails_on_one(samples: list[int]) -> int:
        if len(samples) == 1:
            raise ValueError("one sample")
        return len(samples)

    seen = collated_both(fails_on_one)
    assert seen[2] == "ValueError('one sample')" and seen[3] == 0
    assert ("loader/collate", 3) in seen[6]  # the failed one timed too, as a with block times it


@pytest.mark.parametrize("flags", [(False, True), (True, False), (False, False)])
def test_a_collate_not_enabled_or_not_watching_is_the_wrapped_function_alone(flags: tuple[bool, bool]) -> None:
    seen = collated_both(sum, flags)
    assert seen[:6] == [3, 0, 3, 0, 15, 0]
    assert not any(path.endswith("collate") for path, _ in seen[6])


def test_a_collate_of_another_class_has_its_flags_read_by_name() -> None:
    """``collate_samples`` reads a TimedCollate's three slots in place; an object of another class (here a
    subclass) is read by name, and is timed or not as its flags say."""

    class Subclass(TimedCollate):
        __slots__ = ()

    stepwatch.enable()
    sw = _default_instance.stopwatch
    collate = Subclass(sum, None)
    compiled = compiled_collate(collate)
    for watching in (False, True):
        collate.enabled, collate.watching = True, watching
        with sw.timed("loader"):
            assert compiled([1, 2]) == 3
        assert [row.calls for path, row in stepwatch.summary().stages.items() if path.endswith("collate")] == (
            [1] if watching else []
        )


def test_the_c_read_leaves_the_samples_to_the_interpreters_own_loop() -> None:
    """Each ``__getitem__`` is called from a list comprehension (``read_all``), never from C: from C each call
    re-entered the interpreter, about 100 ns a sample, a cost that grew with the batch."""
    import sys

    callers: list[str] = []

    class Recording(Samples):
        def __getitem__(self, index: int) -> int:
            callers.append(sys._getframe(1).f_code.co_qualname)
            return index

    stepwatch.enable()
    reads = compiled_reads(dataset_timing(Recording(), None))  # type: ignore[arg-type]
    with stepwatch.timed("loader"):
        assert reads(range(5)) == [0, 1, 2, 3, 4]
    assert callers == ["read_all.<locals>.<listcomp>"] * 5


def watched_rows(dataset: Any, collate: Collate, monkeypatch: pytest.MonkeyPatch, in_one_call: bool) -> list[Any]:
    """Two epochs of a watched single-process loader (batches of 3): what each step got or raised, the stack's
    depth after each epoch, and the rows (path, calls), with the fetch in one C call or as its two halves."""
    from stepwatch._dataloader import watch

    if not in_one_call:
        monkeypatch.setattr(watch, "install_fetch", lambda iterator: False)
    clean()
    stepwatch.enable()
    loader = DataLoader(dataset, batch_size=3, collate_fn=collate)
    seen: list[Any] = []
    depth = len(_default_instance.stopwatch.stacks.thread_stack())
    for _ in range(2):
        try:
            seen.extend(stepwatch.watch(loader))
        except Exception as error:  # what is compared
            seen.append(repr(error))
        seen.append(len(_default_instance.stopwatch.stacks.thread_stack()) - depth)
    monkeypatch.undo()
    seen.append(sorted((row.path, row.calls) for row in stepwatch.summary().stages.values()))
    return seen


def test_a_watched_loaders_fetch_in_one_call_records_what_its_two_halves_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def decode() -> None:
        with stepwatch.timed("decode"):
            pass

    def stacked(samples: list[int]) -> int:
        with stepwatch.timed("stack"):
            return sum(samples)

    halves, one_call = (watched_rows(Samples(inside=decode), stacked, monkeypatch, way) for way in (False, True))
    assert halves == one_call, f"halves: {halves}\none call: {one_call}"
    assert one_call[:22] == [
        30,
        120,
        210,
        300,
        390,
        480,
        570,
        660,
        750,
        840,
        930,
        1020,
        1110,
        1200,
        1290,
        1380,
        1470,
        1560,
        1650,
        1740,
        1830,
        630,
    ]  # batches of 3 and the last of one
    rows = dict(one_call[-1])
    assert rows["loader/dataset"] + rows["first_batch/dataset"] == 2 * 64  # every sample, once
    assert rows["loader/dataset/decode"] + rows["first_batch/dataset/decode"] == 2 * 64
    assert rows["loader/collate/stack"] + rows["first_batch/collate/stack"] == 2 * 22


def test_a_read_or_a_collate_failing_in_the_one_call_fetch_raises_and_leaves_nothing_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fails_on_one(samples: list[int]) -> int:
        if len(samples) == 1:  # the last batch of each epoch
            raise ValueError("one sample")
        return len(samples)

    for dataset, collate in ((Samples(fail_at=40), sum), (Samples(), fails_on_one)):
        halves, one_call = (watched_rows(dataset, collate, monkeypatch, way) for way in (False, True))
        assert halves == one_call, f"halves: {halves}\none call: {one_call}"
        failed = [item for item in one_call if isinstance(item, str)]
        assert len(failed) == 2 and one_call[one_call.index(failed[0]) + 1] == 0  # the stack as before the loop


def test_a_dataset_that_reads_its_own_batches_keeps_torchs_fetch() -> None:
    from stepwatch._speedups import fetch_batch

    class Batched(Samples):
        def __getitems__(self, indices: list[int]) -> list[int]:
            return [index for index in indices]

    stepwatch.enable()
    loader = DataLoader(Batched(), batch_size=8)
    for batch in stepwatch.watch(loader):
        assert len(batch) == 8
        fetch = loader._get_iterator()._dataset_fetcher.__dict__.get("fetch")
        assert fetch is None or fetch.func is not fetch_batch
    assert stepwatch.summary().stages["loader/dataset_batch"].calls == 7
