"""Worker-side timing through real DataLoader worker processes (fork and spawn)."""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import time
import traceback
import weakref
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import stepwatch
from stepwatch import Stopwatch
from stepwatch._dataloader.watch import instrument_always

from .conftest import spin

SAMPLE_S = 0.010
AUGMENT_S = 0.004


def augment(x: torch.Tensor) -> tuple[torch.Tensor, float]:
    took = spin(AUGMENT_S)
    return x * 2, took


class BusyDataset(Dataset[dict[str, Any]]):
    """Each sample costs a known busy-wait (SAMPLE_S, of which AUGMENT_S is a timed transform)."""

    def __init__(self, size: int = 16, fail_at: int | None = None, kill_at: int | None = None) -> None:
        self.size = size
        self.fail_at = fail_at
        self.kill_at = kill_at
        self.augment = stepwatch.timed_transform(augment, "augment")

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, Any]:
        if index == self.fail_at:
            raise ValueError(f"sample {index} is corrupt")
        if index == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        started = time.perf_counter()
        spin(SAMPLE_S - AUGMENT_S)
        x, augment_took = self.augment(torch.full((3,), float(index)))
        took = time.perf_counter() - started  # what the sample really cost, by the worker's own clock
        return {"x": x, "label": index, "name": f"s{index}", "took": took, "augment_took": augment_took}


def make_loader(method: str | None, **kwargs: Any) -> DataLoader[Any]:
    options: dict[str, Any] = {"batch_size": 4, "num_workers": 2, "shuffle": False}
    options.update(kwargs)
    if options["num_workers"]:
        options["multiprocessing_context"] = method
    dataset = options.pop("dataset", None) or BusyDataset()
    return DataLoader(dataset, **options)


def release_frames(error: BaseException) -> None:
    """Frees what a DataLoader worker's re-raised error holds. torch's ``ExceptionWrapper.reraise`` keeps the error
    in a local of the frame its traceback holds, a cycle that keeps the loader's iterator alive until a garbage
    collection, which shuts its workers down in an order that makes each wait 5 s before it is killed: a stall
    of whichever later test triggers that collection. Plain torch does this too; stepwatch is not involved."""
    traceback.clear_frames(error.__traceback__)


def calls(sw: Stopwatch, stage: str, phase: str = "train") -> int:
    """Calls of a worker-side stage, wherever it was filed: the first batch of each epoch goes under
    ``first_batch/``, the others under ``loader/``."""
    stages = sw.summary().phases[phase].stages
    return sum(stages[path].calls for path in (f"loader/{stage}", f"first_batch/{stage}") if path in stages)


def assert_worker_figures_hold(sw: Stopwatch, batches: list[Any], augment: bool = True) -> None:
    """Stepwatch's per-sample figures hold what the samples measured themselves, never less; and they fit
    inside what contains them (a transform inside its sample, the samples inside the batches' fetch time).
    No upper bound against the samples' own clocks: in a worker, the queue's feeder thread can take the GIL
    between a workload's last clock read and the block's, and on a loaded machine be preempted holding it;
    that wait is real time in the block that the workload's own clock missed."""
    took = [t for batch in batches for t in batch["took"].tolist()]
    augment_took = [t for batch in batches for t in batch["augment_took"].tolist()]
    phase = sw.summary().main_phase
    stages = phase.stages

    def total(stage: str) -> float:
        rows = [stages[p] for p in (f"loader/{stage}", f"first_batch/{stage}") if p in stages]
        assert sum(row.calls for row in rows) == len(took), stage  # a call per sample (dataset: read per batch)
        return sum(row.total for row in rows)

    assert total("dataset") >= sum(took)
    if augment:
        assert sum(augment_took) <= total("dataset/augment") <= total("dataset")
    if phase.workers:  # the samples ran inside the workers' busy time
        assert total("dataset") <= sum(worker.busy_ns for worker in phase.workers.values()) * 1e-9
    else:  # the samples ran inside the loop's waits
        assert total("dataset") <= sum(stages[p].total for p in ("loader", "first_batch") if p in stages)
    assert min(took) >= SAMPLE_S - 1e-9 and min(augment_took) >= AUGMENT_S - 1e-9  # float rounding


def plain_batches(loader: DataLoader[Any], epochs: int = 1) -> list[Any]:
    return [batch for _ in range(epochs) for batch in loader]


def assert_same_batches(got: list[Any], expected: list[Any]) -> None:
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert type(a) is type(b) and a.keys() == b.keys()
        assert torch.equal(a["x"], b["x"]) and torch.equal(a["label"], b["label"]) and a["name"] == b["name"]


@pytest.fixture
def sw() -> Stopwatch:
    stopwatch = Stopwatch()
    stopwatch.enable()
    return stopwatch


@pytest.mark.parametrize("persistent", [False, True], ids=["per-epoch", "persistent"])
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_worker_stages_come_back(sw: Stopwatch, method: str, persistent: bool) -> None:
    expected = plain_batches(make_loader(method, persistent_workers=persistent), epochs=2)
    loader = make_loader(method, persistent_workers=persistent, prefetch_factor=3)
    got = [batch for _ in range(2) for batch in sw.watch(loader)]  # two epochs
    assert_same_batches(got, expected)

    stages = sw.summary().stages
    assert calls(sw, "dataset") == 32  # one per sample
    assert calls(sw, "dataset/augment") == 32
    assert calls(sw, "collate") == 8  # one per batch
    assert stages["first_batch/collate"].calls == 2  # one first batch per epoch
    assert stages["loader"].calls == 6 and stages["first_batch"].calls == 2 and stages["step"].calls == 6
    assert stages["first_step"].calls == 2  # the first step of each epoch, wait and body, is apart
    assert stages["loader/dataset"].in_workers and stages["loader/dataset/other"].in_workers
    # The truth is what each sample measured itself in its worker (preempted or not); nominal lengths are
    # lower bounds only.
    assert_worker_figures_hold(sw, got)

    workers = sw.summary().main_phase.workers
    assert sorted(workers) == [0, 1]
    assert sum(w.batches for w in workers.values()) == 8
    assert sum(w.busy_ns for w in workers.values()) * 1e-9 >= sum(float(b["took"].sum()) for b in got)
    for worker in workers.values():
        assert worker.busy_per_batch >= 4 * SAMPLE_S
        assert 0 < worker.utilization <= 1.0
        assert worker.wait_ns >= 0
    assert "dataset [w]" in sw.report() and "worker 1:" in sw.report()


@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true but no accelerator")
def test_pin_memory_keeps_batches_and_timings(sw: Stopwatch) -> None:
    expected = plain_batches(make_loader("fork", pin_memory=True))
    got = list(sw.watch(make_loader("fork", pin_memory=True)))
    assert_same_batches(got, expected)
    assert calls(sw, "collate") == 4


def test_carrier_survives_torch_pin_memory() -> None:
    from torch.utils.data._utils.pin_memory import pin_memory

    from stepwatch._dataloader.in_workers import Carrier, WorkerReport

    report: WorkerReport = (0, 1, 2, 3, 4, {"dataset": (1, 5, 25, 5, 5, [5])})
    batch = {"x": torch.ones(2), "name": ["a"]}
    try:
        pinned = pin_memory(Carrier(batch, report))
    except RuntimeError as error:  # a CPU-only build cannot pin; the carrier must still be the one handled
        assert "pin" in str(error).lower() or "accelerator" in str(error).lower() or "cuda" in str(error).lower()
        return
    assert type(pinned) is Carrier and pinned.report is report
    assert torch.equal(pinned.batch["x"], batch["x"])


def test_break_mid_epoch_then_next_epoch(sw: Stopwatch) -> None:
    loader = make_loader("fork", dataset=BusyDataset(size=32))
    for i, _ in enumerate(sw.watch(loader)):
        if i == 2:
            break
    assert calls(sw, "collate") == 3  # only batches the loop received count
    assert len(list(sw.watch(loader))) == 8
    assert calls(sw, "collate") == 11


@pytest.mark.parametrize("how", ["watch", "instrumented"])
@pytest.mark.parametrize("persistent", [False, True], ids=["per-epoch", "persistent"])
def test_a_watched_loader_is_freed_when_dropped_not_left_to_the_garbage_collector(
    sw: Stopwatch, persistent: bool, how: str
) -> None:
    """A watched DataLoader and its iterator must not sit in a reference cycle: the garbage collector shuts such
    an iterator's workers down in an order that leaves each waiting 5 s before torch kills it (a 10 s stall
    of training at some later collection, seen with persistent workers)."""
    loader = make_loader("fork", dataset=BusyDataset(size=8), persistent_workers=persistent)
    if how == "watch":
        source: Any = sw.watch(loader)
    else:  # what Lightning's profiler and auto-instrumentation do: the loader iterated as it is
        instrument_always(loader, sw)
        source = loader
    for _ in range(2):
        assert sum(len(batch["name"]) for batch in source) == 8
    gone = [weakref.ref(loader)] + ([weakref.ref(loader._iterator)] if persistent else [])
    gc.disable()
    try:
        del source, loader
        assert all(ref() is None for ref in gone)  # freed by reference counting, before any collection
    finally:
        gc.enable()
    if how == "watch":  # (instrumented, the reports go to whatever stage is open: none here)
        assert calls(sw, "collate") == 4


def test_worker_exception_reaches_the_loop_unchanged(sw: Stopwatch) -> None:
    def first_error(iterable: Any) -> tuple[type[BaseException], str]:
        try:
            for _ in iterable:
                pass
        except ValueError as error:  # keep only its type and text: the traceback holds the workers alive
            release_frames(error)
            return type(error), str(error)
        raise AssertionError("the worker's error did not reach the loop")

    plain = first_error(make_loader("fork", dataset=BusyDataset(fail_at=15)))
    gc.collect()
    multiprocessing.active_children()  # reap the first loader's workers before the next loader starts
    watched = first_error(sw.watch(make_loader("fork", dataset=BusyDataset(fail_at=15))))
    assert watched[0] is plain[0]
    assert "sample 15 is corrupt" in watched[1] and "sample 15 is corrupt" in plain[1]
    assert calls(sw, "collate") >= 1  # batches before the error kept their timings


def test_killed_worker_keeps_timings_of_delivered_batches(sw: Stopwatch) -> None:
    loader = make_loader("fork", dataset=BusyDataset(size=40, kill_at=30), num_workers=1, prefetch_factor=1)
    received = 0
    with pytest.raises(RuntimeError, match=r"killed by signal|exited unexpectedly"):
        for _ in sw.watch(loader):
            received += 1
    assert received >= 1
    assert calls(sw, "collate") == received
    assert calls(sw, "dataset") == 4 * received


def test_single_process_reads_are_timed_without_touching_the_dataset(sw: Stopwatch) -> None:
    """With ``num_workers=0`` the reads are timed through the iterator's fetcher: the dataset's own attributes are
    never added to (an attribute set on an instance makes Python stop sharing its dictionary's keys, which slows
    every attribute read of each sample's ``__getitem__``), the iterator hands out torch's plain batches, and a
    loader iterated outside ``watch()`` reads untimed."""
    dataset = BusyDataset(size=8)
    own = dict(vars(dataset))
    loader = make_loader(None, dataset=dataset, num_workers=0)
    for _ in sw.watch(loader):
        assert vars(dataset) == own
    assert calls(sw, "dataset") == 8 and calls(sw, "collate") == 2
    for _ in loader:  # iterated directly: nothing recorded
        pass
    assert calls(sw, "dataset") == 8 and calls(sw, "collate") == 2
    assert vars(dataset) == own


def test_single_process_reads_of_more_batches_than_a_fold_keep_exact_calls_and_totals(sw: Stopwatch) -> None:
    """A batch's reads are kept as (calls, total) until a fold's worth of batches, like a block's times: past it,
    and in a summary taken between folds, the row's calls are the samples read and its total the batches'."""
    from torch.utils.data import TensorDataset

    from stepwatch._constants import FOLD

    batches = FOLD + 30
    loader = DataLoader(TensorDataset(torch.arange(2 * batches)), batch_size=2)
    for index, _ in enumerate(sw.watch(loader)):
        if index == 10:
            assert calls(sw, "dataset") == 2 * 11  # between folds: the pending batches are counted (first_batch's too)
    node = sw.tree.phase("train").root.children["loader"].children["dataset"]
    assert 0 < len(node.batches) < FOLD  # the first fold's worth was folded on the way
    pending = sum(total for _, total in node.batches)
    stats = sw.summary().stages["loader/dataset"]
    assert stats.calls == 2 * (batches - 1)  # (the first batch's reads are under first_batch)
    assert stats.total * 1e9 >= pending > 0


def test_single_process_loader_nests_under_the_wait(sw: Stopwatch) -> None:
    dataset = BusyDataset(size=8)
    loader = make_loader(None, dataset=dataset, num_workers=0)
    expected = plain_batches(make_loader(None, dataset=BusyDataset(size=8), num_workers=0))
    got = list(sw.watch(loader))
    assert_same_batches(got, expected)
    stages = sw.summary().stages
    assert calls(sw, "dataset") == 8 and not stages["loader/dataset"].in_workers
    assert calls(sw, "collate") == 2
    assert_worker_figures_hold(sw, got)  # timed_transform's blocks reach sw with 0 workers as with N
    parts = stages["loader/dataset"].total + stages["loader/collate"].total + stages["loader/other"].total
    assert parts == pytest.approx(stages["loader"].total)
    assert "__getitems__" not in vars(dataset)  # the dataset is left as it was
    assert not sw.summary().main_phase.workers


def test_after_reset_a_run_without_workers_has_no_worker_rows(sw: Stopwatch) -> None:
    """``reset()`` forgets which stages ran in workers: the next run, with 0 workers, nests its pipeline under
    the wait (no ``[w]``) and has its ``loader/other``."""
    for _ in sw.watch(make_loader("fork", dataset=BusyDataset(size=8), num_workers=2)):
        pass
    assert sw.summary().stages["loader/dataset"].in_workers
    sw.reset()
    for _ in sw.watch(make_loader(None, dataset=BusyDataset(size=8), num_workers=0)):
        pass
    stages = sw.summary().stages
    assert not any(stage.in_workers for stage in stages.values())
    assert "loader/other" in stages and calls(sw, "dataset") == 8


@pytest.mark.slow
def test_workers_that_compute_or_wait_for_a_core_are_told_from_workers_that_sleep(sw: Stopwatch) -> None:
    """Each worker's CPU time and its time waiting for a core, per batch, by its own clocks: 4 workers that
    busy-wait on this machine's cores need a core nearly all their busy time (computing, or queued for one when
    they outnumber the cores), while workers whose reads sleep need one for a small part of it."""
    for _ in sw.watch(make_loader("fork", dataset=BusyDataset(size=32), num_workers=4)):
        pass
    computing = sw.summary().main_phase.workers
    assert len(computing) == 4
    for worker in computing.values():
        assert worker.cpu_ns > 0 and worker.queued_ns >= 0
        assert worker.needs_core_share > 0.8, worker  # whatever share of a core each one got
    assert "mostly wait" not in " ".join(sw.summary().verdict.advice)
    sleeping = Stopwatch()
    sleeping.enable()
    for _ in sleeping.watch(make_loader("fork", dataset=SleepyDataset(), num_workers=2)):
        pass
    for worker in sleeping.summary().main_phase.workers.values():
        assert worker.needs_core_share < 0.3, worker


class SleepyDataset(Dataset[int]):
    """Each read sleeps 20 ms: a worker that waits (on a disk, a remote store) rather than computes. (Woken, a
    worker may wait for a core: beside two CPU hogs on 2 cores, about 2 ms a read, which was a third of 5 ms.)"""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> int:
        time.sleep(0.02)
        return index


def test_disabled_stopwatch_leaves_the_pipeline_alone() -> None:
    sw = Stopwatch()
    loader = make_loader("fork")
    expected = plain_batches(make_loader("fork"))
    assert_same_batches(list(sw.watch(loader)), expected)
    assert not sw.summary().phases


def test_module_level_watch_and_phase(sw: Stopwatch) -> None:
    stepwatch.enable()
    try:
        list(stepwatch.watch(make_loader("fork"), phase="val"))
        stages = stepwatch.summary().phases["val"].stages
        assert stages["loader/collate"].calls + stages["first_batch/collate"].calls == 4
    finally:
        stepwatch.disable()
        stepwatch.reset()


def test_persistent_workers_started_on_then_stopwatch_off() -> None:
    sw = Stopwatch()
    sw.enable()
    loader = make_loader("fork", persistent_workers=True)
    expected = plain_batches(make_loader("fork"))
    assert_same_batches(list(sw.watch(loader)), expected)
    sw.disable()  # the workers keep sending their timings; the batches must still be the plain ones
    assert_same_batches(list(sw.watch(loader)), expected)
    assert calls(sw, "collate") == 4  # nothing recorded while off


class Counting(torch.utils.data.IterableDataset[int]):
    def __iter__(self) -> Any:
        for i in range(8):
            spin(0.002)
            yield i


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_iterable_dataset_is_timed_per_item_in_the_workers(method: str) -> None:
    sw = Stopwatch()
    sw.enable()
    dataset = Counting()
    loader = DataLoader(dataset, batch_size=4, num_workers=1, multiprocessing_context=method)
    assert [batch.tolist() for batch in sw.watch(loader)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert type(dataset) is Counting  # the user's object is untouched; only the worker's copy is timed
    phase = sw.summary().main_phase
    (worker,) = phase.workers.values()
    assert worker.batches == 2
    assert worker.busy_per_batch >= 4 * 0.002  # the items' production, not only the collate
    assert calls(sw, "dataset") == 8
    assert all(not phase.share(p) > 1.0 for p, s in phase.stages.items() if s.in_workers)  # NaN: one-off rows


# -- the loader outside watch() yields exactly its own batches (hardening) --------------------------------


@pytest.mark.parametrize("persistent", [False, True], ids=["per-epoch", "persistent"])
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_loader_iterated_directly_after_watch_yields_its_batches(method: str, persistent: bool) -> None:
    sw = Stopwatch()
    sw.enable()
    expected = plain_batches(make_loader(method))
    loader = make_loader(method, persistent_workers=persistent)
    assert_same_batches(list(sw.watch(loader)), expected)
    assert_same_batches(list(loader), expected)  # an evaluation pass over the training loader
    first = next(iter(loader))
    assert isinstance(first, dict) and torch.equal(first["x"], expected[0]["x"])
    assert_same_batches(list(sw.timed_iter(loader)), expected)  # timed_iter over a watched loader
    sw.disable()
    assert_same_batches(list(loader), expected)  # and after the stopwatch is off
    assert calls(sw, "collate") == 4  # only the watched epoch is recorded


def test_single_process_loader_iterated_directly_records_nothing() -> None:
    sw = Stopwatch()
    sw.enable()
    loader = make_loader(None, dataset=BusyDataset(size=8), num_workers=0)
    list(sw.watch(loader))
    before = sw.summary().stages
    batches = list(loader)
    assert len(batches) == 2 and isinstance(batches[0], dict)
    after = sw.summary().stages
    assert "collate" not in after  # no phantom top-level row
    assert after["loader/collate"].calls == before["loader/collate"].calls


@pytest.mark.parametrize("thing", [[1, 2, 3], range(4), iter([1, 2])], ids=["list", "range", "iterator"])
def test_watch_needs_a_dataloader(thing: Any) -> None:
    with pytest.raises(TypeError, match=r"watch\(\) needs a torch.utils.data.DataLoader.*timed_iter"):
        Stopwatch().watch(thing)


def test_persistent_workers_after_a_caught_exception_count_only_batches_received(sw: Stopwatch) -> None:
    loader = make_loader(
        "fork", dataset=BusyDataset(size=16, fail_at=5), num_workers=1, persistent_workers=True, prefetch_factor=1
    )
    received = 0
    for _ in range(3):  # each epoch fails at sample 5; the loop catches it and starts the next epoch
        try:
            for batch in sw.watch(loader):
                received += len(batch["name"])
        except ValueError as error:
            release_frames(error)
    assert received == 3 * 4  # batch 0 of each epoch
    assert calls(sw, "dataset") == received  # not the samples of the batch that failed
    assert calls(sw, "collate") == 3


def slow_worker_start(worker_id: int) -> None:
    time.sleep(0.5)  # opening files, building an index


def test_worker_start_up_is_its_own_figure_not_idle_time(sw: Stopwatch) -> None:
    loader = make_loader("fork", dataset=BusyDataset(size=32), worker_init_fn=slow_worker_start)
    started = time.perf_counter()
    for _ in sw.watch(loader):
        pass  # the loop only consumes: the workers are the bottleneck
    loop_s = time.perf_counter() - started
    stages = sw.summary().stages
    init = [stages[p] for p in ("first_batch/worker_init", "loader/worker_init") if p in stages]
    assert sum(s.calls for s in init) == 2 and min(s.min for s in init) >= 0.5
    # Each worker's wall time is what the loop took, less its half-second start-up: never counted as idle (it
    # was, and utilization read 12-13%). Compared with the loop's own length, a stall of the machine moves both.
    for worker in sw.summary().main_phase.workers.values():
        assert worker.wall_ns / 1e9 <= loop_s - 0.5, worker
        assert worker.busy_ns <= worker.wall_ns
    assert "workers (2 configured, 2 delivered batches)" in sw.report()


def test_utilization_counts_only_while_the_loop_consumes(sw: Stopwatch) -> None:
    loader = make_loader("fork", dataset=BusyDataset(size=16), persistent_workers=True)
    consuming_s = 0.0
    for _ in range(3):
        started = time.perf_counter()
        for _ in sw.watch(loader):
            pass
        consuming_s += time.perf_counter() - started
        time.sleep(0.4)  # a validation pass between epochs: the persistent workers wait, not idle
    for worker in sw.summary().main_phase.workers.values():
        assert worker.wall_ns / 1e9 <= consuming_s, worker  # the 0.8 s between epochs are not in it
        assert worker.busy_ns <= worker.wall_ns


class Decoding(Dataset[int]):
    """Each sample runs a timed ``decode`` block: the child whose counts the parent must agree with."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> int:
        with stepwatch.timed("decode"):
            spin(0.0005)
        return index


class BatchFetching(Decoding):
    """Fetches whole batches itself, as Hugging Face ``datasets`` do."""

    def __getitems__(self, indices: list[int]) -> list[int]:
        return [self[i] for i in indices]


@pytest.mark.parametrize("workers", [0, 2])
def test_random_split_subsets_are_timed_per_sample(workers: int) -> None:
    from torch.utils.data import random_split

    stepwatch.enable()
    try:
        subset, _ = random_split(Decoding(), [32, 0], generator=torch.Generator().manual_seed(0))
        options: dict[str, Any] = {"multiprocessing_context": "fork"} if workers else {}
        loader = DataLoader(subset, batch_size=4, num_workers=workers, **options)
        batches = list(stepwatch.watch(loader))
        assert sorted(i for batch in batches for i in batch.tolist()) == list(range(32))
        assert calls(stepwatch._default, "dataset") == 32  # per sample, as without random_split
        assert calls(stepwatch._default, "dataset/decode") == 32
    finally:
        stepwatch.disable()
        stepwatch.reset()


def test_a_dataset_fetching_batches_itself_is_labelled_per_batch() -> None:
    stepwatch.enable()
    try:
        list(stepwatch.watch(DataLoader(BatchFetching(), batch_size=4, num_workers=2, multiprocessing_context="fork")))
        assert calls(stepwatch._default, "dataset_batch") == 8  # one per batch, and named so
        assert calls(stepwatch._default, "dataset_batch/decode") == 32
        assert "loader/dataset" not in stepwatch.summary().stages
    finally:
        stepwatch.disable()
        stepwatch.reset()


class RoundRobin:
    """A loader of loaders, like metatrain's CombinedDataLoader: batches from each DataLoader in turn."""

    def __init__(self, *dataloaders: DataLoader[Any]) -> None:
        self.dataloaders = list(dataloaders)

    def __len__(self) -> int:
        return sum(len(loader) for loader in self.dataloaders)

    def __iter__(self) -> Any:
        iterators = [iter(loader) for loader in self.dataloaders]
        for _ in range(len(self.dataloaders[0])):
            for iterator in iterators:
                yield next(iterator)


def test_a_loader_of_loaders_is_watched_through_its_loaders(sw: Stopwatch) -> None:
    first = make_loader("fork", dataset=BusyDataset(size=8))
    second = make_loader("fork", dataset=BusyDataset(size=8))
    combined = RoundRobin(first, second)
    batches = list(sw.watch(combined))
    assert len(batches) == 4 and all(isinstance(batch, dict) for batch in batches)
    phase = sw.summary().main_phase
    assert phase.steps == 3 and phase.stages["loader"].calls == 3  # the outer wait, timed once per step
    assert calls(sw, "dataset") == 16 and calls(sw, "collate") == 4  # both loaders' workers came back
    assert sorted(phase.workers) == [0, 1, 1000, 1001]  # worker 0 of each loader kept apart
    assert "loader 1 worker 0:" in sw.report()
    assert_same_batches(list(first), plain_batches(make_loader("fork", dataset=BusyDataset(size=8))))


def test_loaders_can_be_given(sw: Stopwatch) -> None:
    inner = make_loader("fork", dataset=BusyDataset(size=8))

    def hidden() -> Any:  # a generator: nothing to find in it
        yield from inner

    assert len(list(sw.watch(hidden(), loaders=[inner]))) == 2
    assert calls(sw, "collate") == 2


@stepwatch.timed("resize")
def resize() -> None:
    """A function decorated at import: it keeps the module-level stopwatch's block of that time."""
    spin(0.0002)


class OwnStopwatchDataset(Dataset[int]):
    """Blocks on the user's own stopwatch and on the module-level one, inside the dataset."""

    def __init__(self, stopwatch: Stopwatch) -> None:
        self.stopwatch = stopwatch

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        with self.stopwatch.timed("decode"):
            spin(0.0002)
        with stepwatch.timed("normalize"):
            spin(0.0002)
        resize()
        return index


@pytest.mark.parametrize("default_was_on", [False, True], ids=["default-as-it-is", "default-on-then-off"])
def test_the_same_dataset_code_gives_the_same_rows_with_0_or_2_workers(default_was_on: bool) -> None:
    """Also when the module-level stopwatch was switched on and off before (as the Lightning profiler and
    attach() do): its blocks, dropped blocks while it is off, record into the watching stopwatch all the same."""
    if default_was_on:
        stepwatch.enable()
        stepwatch.disable()
    rows = {}
    for workers in (0, 2):
        sw = Stopwatch()
        sw.enable()
        options: dict[str, Any] = {"multiprocessing_context": "fork"} if workers else {}
        list(sw.watch(DataLoader(OwnStopwatchDataset(sw), batch_size=4, num_workers=workers, **options)))
        stages = sw.summary().stages
        rows[workers] = {path for path in stages if path.startswith(("loader/dataset", "first_batch/dataset"))}
        assert calls(sw, "dataset/decode") == 8 and calls(sw, "dataset/normalize") == 8, workers
        assert calls(sw, "dataset/resize") == 8, workers
    assert rows[0] == rows[2]
    assert not stepwatch.summary().phases  # the module-level stopwatch, off, recorded nothing of its own


def test_a_batch_that_failed_in_a_worker_leaves_nothing_for_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker side of the case above, driven in this process as a worker would run it: a fetch that
    raises, then the next batch, whose report must hold only its own samples."""
    from stepwatch._dataloader import in_workers as _workers

    worker = Stopwatch()
    worker.enable()
    monkeypatch.setattr(_workers, "_default_stopwatch", lambda: worker)
    monkeypatch.setattr(_workers, "_state", _workers._WorkerState())
    _workers._state.start(0)
    dataset = BusyDataset(size=8, fail_at=5)
    getitems = _workers.TimedGetItems(dataset, None, None)
    collate = _workers.TimedCollate(lambda samples: samples, None)
    collate.enabled = True
    with pytest.raises(ValueError, match="sample 5"):
        getitems([4, 5, 6, 7])  # sample 4 was timed, then 5 raised: no collate, no report
    carrier = collate(getitems([0, 1, 2, 3]))
    assert carrier.report[5]["dataset"][0] == 4  # the 4 samples of this batch, not 6


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_batch_is_read_under_one_clock_pair_with_a_call_per_sample(num_workers: int) -> None:
    """The dataset row of a batch costs one clock pair whatever the batch's size: its calls are the samples,
    its total holds their time, its mean is per sample and its recent window holds a mean per batch; a timed
    block inside ``__getitem__`` still nests under it."""
    sw = Stopwatch(trace_steps=10)
    sw.enable()
    batches = [batch for batch in sw.watch(make_loader("fork", num_workers=num_workers, batch_size=8))]
    took = [t for batch in batches for t in batch["took"].tolist()]
    stages = sw.summary().main_phase.stages
    rows = [stages[path] for path in ("loader/dataset", "first_batch/dataset") if path in stages]
    assert sum(row.calls for row in rows) == 16
    assert sum(len(row.recent_ns) for row in rows) == 2  # one per batch
    assert sum(row.total for row in rows) >= sum(took)
    # its mean per sample is the samples' own, by their clock (a busy machine stretches both alike)
    assert sum(row.total for row in rows) / 16 == pytest.approx(sum(took) / 16, rel=0.1)
    assert sum(stages[p].calls for p in ("loader/dataset/augment", "first_batch/dataset/augment") if p in stages) == 16
    events = [e for e in sw.summary().trace if e.path.endswith("/dataset")]
    assert len(events) == 2 and all(e.duration_ns >= 8 * SAMPLE_S * 1e9 for e in events)


def test_a_sample_that_fails_is_counted_in_its_batch_read() -> None:
    sw = Stopwatch()
    sw.enable()
    with pytest.raises(ValueError, match="sample 5 is corrupt"):
        for _ in sw.watch(make_loader(None, num_workers=0, dataset=BusyDataset(fail_at=5))):
            pass
    stages = sw.summary().main_phase.stages
    assert sum(stages[p].calls for p in ("loader/dataset", "first_batch/dataset") if p in stages) == 6  # 4 + 1 + 1


def test_a_collate_wrapper_sent_to_a_worker_keeps_its_function_and_flag_but_not_its_stopwatch() -> None:
    import pickle

    from stepwatch._dataloader.in_workers import TimedCollate

    collate = TimedCollate(sum, stepwatch._default_instance.stopwatch)
    collate.enabled = collate.watching = True
    copy = pickle.loads(pickle.dumps(collate))
    assert (copy.collate_fn, copy.enabled, copy.watching, copy._stopwatch) == (sum, True, False, None)
