"""``stepwatch.tune(loader, step=fn)``: the DataLoader settings that make this training fastest, measured.

Each setting is tried by building a new DataLoader over the same dataset, batch size, sampler kind, collate
function, worker init and drop_last, with other ``num_workers`` / ``prefetch_factor``, and running the
program's own step on :data:`STEPS` of its batches (after its first batch, whose start-up is reported apart).
So each setting's time per step includes what its workers take from the training (cores, memory bandwidth,
the main process receiving batches). The search climbs ``num_workers`` from 0 while the time per step improves
by more than the noise measured (beyond the CPU count when the best workers are seen waiting rather than
computing), then tries ``prefetch_factor`` for the best (and ``pin_memory`` with an accelerator), then runs the
best and the original once more: those decisions are ``_tune_plan``'s, this module runs the trials they ask
for. What it measured is plain data in ``_tuning``.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import time
import warnings
from collections.abc import Callable, Generator, Iterator
from typing import Any, cast

from ._dataloader.in_workers import unwrapped
from ._tune_plan import conclude, plan
from ._tuning import Setting, Trial, Tuning

STEPS = 30
"""Steps measured per setting (after its first batch)."""


class Rebuilder:
    """Builds a program's DataLoader again with another setting: the same dataset, batch size, sampler kind,
    collate function, worker init, ``drop_last``, pinning and start method. Raises ValueError, in one line, for a
    loader it cannot rebuild; ``kept`` says what it keeps as the program has it, and why."""

    def __init__(self, loader: Any) -> None:
        from torch.utils.data import DataLoader, IterableDataset, RandomSampler, SequentialSampler

        if not isinstance(loader, DataLoader):
            raise ValueError(f"tune needs a torch DataLoader, got {type(loader).__name__}")
        self.loader = loader
        self.accelerator = _accelerator()
        self.iterable = isinstance(loader.dataset, IterableDataset)
        self.kept: list[str] = []
        if self.iterable:
            if not loader.num_workers and not self.accelerator:
                raise ValueError(
                    "a DataLoader over an IterableDataset keeps its num_workers (the dataset shards itself across"
                    " them), and with num_workers=0 and no accelerator in use no other setting applies"
                )
            self.kept.append(
                f"num_workers={loader.num_workers}, as yours: an IterableDataset shards itself across its workers"
                " (another count would change what it yields)"
            )
            self.kept.append(
                f"persistent_workers={loader.persistent_workers}, as yours: an IterableDataset's epoch cannot be cut"
                " short to time the start of the next"
            )
        if not self.accelerator:
            self.kept.append(f"pin_memory={loader.pin_memory}, as yours: no accelerator in use, pinning gains nothing")
        if loader.batch_size is None and loader.batch_sampler is not None:
            self.kept.append(f"the batch sampler ({type(loader.batch_sampler).__name__}) is reused as it is")
        elif not self.iterable and not isinstance(loader.sampler, (RandomSampler, SequentialSampler)):
            self.kept.append(f"the sampler ({type(loader.sampler).__name__}) is reused as it is")
        self.pin_memory = bool(loader.pin_memory) if self.accelerator else None  # the pinning to try the other of
        prefetch = loader.prefetch_factor if loader.num_workers and loader.prefetch_factor != 2 else None
        persistent = True if loader.num_workers and loader.persistent_workers else None
        self.original = Setting(loader.num_workers, prefetch, persistent_workers=persistent)
        self.describe = describe(loader)

    def build(self, setting: Setting, steps: int) -> Any:
        """The DataLoader for one trial of ``steps`` timed steps. With persistent workers its epoch ends right
        after the trial (the sampler cut; what is left is drained untimed), so that the next epoch's start is
        timed as at a real epoch's end, with nothing prefetched left for the workers to drain."""
        from torch.utils.data import DataLoader, RandomSampler

        loader = self.loader
        # the trial's batches (its settling ones, twice the prefetch at most), then those in flight at its end
        batches = 1 + 3 * settling_batches(setting) + steps if setting.persistent_workers else None
        sampling: dict[str, Any] = {}
        if not self.iterable:
            sampler = loader.sampler
            if isinstance(sampler, RandomSampler):
                sampler = RandomSampler(cast(Any, loader.dataset))  # a fresh order, as a new epoch's
            sampling["sampler"] = sampler
        if loader.batch_size is not None:
            if batches is not None:
                sampling["sampler"] = FirstOnes(sampling["sampler"], batches * loader.batch_size)
            batching = {"batch_size": loader.batch_size, "drop_last": loader.drop_last, **sampling}
        elif loader.batch_sampler is not None:
            batch_sampler = loader.batch_sampler  # its own: reused as it is
            batching = {"batch_sampler": batch_sampler if batches is None else FirstOnes(batch_sampler, batches)}
        else:
            if batches is not None:
                sampling["sampler"] = FirstOnes(sampling["sampler"], batches)
            batching = {"batch_size": None, **sampling}  # the dataset's items are the batches
        options: dict[str, Any] = {
            **batching,
            "collate_fn": unwrapped(loader.collate_fn),
            "num_workers": setting.num_workers,
            "pin_memory": loader.pin_memory if setting.pin_memory is None else setting.pin_memory,
            "worker_init_fn": unwrapped(loader.worker_init_fn),
        }
        if setting.num_workers:
            options["prefetch_factor"] = setting.prefetch_factor or 2
            options["persistent_workers"] = bool(setting.persistent_workers)
            options["multiprocessing_context"] = loader.multiprocessing_context
        with more_workers_than_cores():
            trial = DataLoader(loader.dataset, **options)
        trial.stepwatch_tune_trial = True  # its loop is the tuning's own
        return trial


def describe(loader: Any) -> str:
    """Which DataLoader is tuned, in a few words: its dataset, batch size and epoch length."""
    dataset = type(loader.dataset).__name__
    with contextlib.suppress(TypeError):
        dataset += f" ({len(loader.dataset)} samples)"
    parts = [dataset]
    if loader.batch_size is not None:
        parts.append(f"batch_size={loader.batch_size}")
    elif getattr(loader.batch_sampler, "batch_size", None) is not None:
        parts.append(f"batch_size={loader.batch_sampler.batch_size} ({type(loader.batch_sampler).__name__})")
    with contextlib.suppress(TypeError):
        parts.append(f"{len(loader)} batches an epoch")
    return ", ".join(parts)


class FirstOnes:
    """The first ``count`` indices (or batches) of a sampler: an epoch that ends when a trial does."""

    def __init__(self, sampler: Any, count: int) -> None:
        self.sampler, self.count = sampler, count

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(iter(self.sampler), self.count)

    def __len__(self) -> int:
        try:
            return min(self.count, len(self.sampler))
        except TypeError:
            return self.count


def _accelerator() -> bool:
    """Whether an accelerator is in use (CUDA initialized): pinning host memory only helps copies to one."""
    import torch

    cuda = getattr(torch, "cuda", None)
    return bool(cuda is not None and cuda.is_available() and cuda.is_initialized())


@contextlib.contextmanager
def more_workers_than_cores() -> Iterator[None]:
    """More workers than cores is tried on purpose: torch's warning about it is not shown."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        yield


def tune(loader: Any, step: Callable[[Any], Any], steps: int = STEPS, max_workers: int | None = None) -> Tuning:
    """Tries DataLoader settings on ``step(batch)``, the program's own training step, and recommends the fastest
    (see the module's docstring). ``loader`` is the program's DataLoader (its dataset, batch size, sampler kind,
    collate function and worker init are kept); ``steps`` batches are timed per setting; ``max_workers``
    defaults to the CPU count. Raises ValueError for what cannot be tuned (not a map-style DataLoader)."""
    rebuilder = Rebuilder(loader)
    if not isinstance(steps, int) or steps < 2:
        raise ValueError(f"steps must be an integer of at least 2, got {steps!r}")
    trials: list[Trial] = []
    search = plan(rebuilder.original, max_workers, rebuilder.pin_memory, map_style=not rebuilder.iterable)
    setting = next(search)
    while True:
        trials.append(_measure(setting, rebuilder.build(setting, steps), step, steps))
        try:
            setting = search.send(trials[-1])
        except StopIteration as done:
            return conclude(rebuilder.original, done.value, trials, rebuilder.kept, rebuilder.describe)


def settling_batches(setting: Setting) -> int:
    """Batches run untimed after a setting's first one: those its workers had prefetched while it started come
    at once, faster than the steady state the training will see."""
    return (setting.prefetch_factor or 2) * setting.num_workers


def _measure(setting: Setting, loader: Any, step: Callable[[Any], Any], steps: int) -> Trial:
    """Runs ``step`` on a fresh iterator's batches (see :func:`trial_batches`): the setting's trial."""
    done: list[Trial] = []
    for batch in trial_batches(setting, loader, steps, done):
        step(batch)
    return done[0]


def trial_batches(
    setting: Setting,
    loader: Any,
    steps: int,
    done: list[Trial],
    interrupted: Callable[[], bool] | None = None,
) -> Iterator[Any]:
    """The batches of one trial, for the program's step to run on, from a fresh iterator: its first batch and
    what its workers prefetched meanwhile (untimed), then ``steps`` timed ones: each step's time runs from the
    wait for its batch to the request for the next. A step during which ``interrupted()`` says the program did
    something else (another loader's loop: a validation) is not timed (at most twice ``steps`` batches are
    taken). When they are all run, the trial is appended to ``done``."""
    clock = time.perf_counter
    started = clock()
    with more_workers_than_cores():
        children = {process.pid for process in multiprocessing.active_children()}
        epochs = Epochs(loader)
        workers = {process.pid for process in multiprocessing.active_children()} - children
    if not setting.num_workers:
        workers = set()
    first = epochs.take()
    first_batch = clock() - started
    yield first
    yield from _settle(epochs, settling_batches(setting))
    step_s, wait_s = [], []
    interrupted = interrupted or (lambda: False)
    interrupted()  # what happened before the timed steps does not count
    cpu_before, epoch = _cpu_seconds(workers), epochs.count
    mark = began = clock()
    for _ in range(2 * steps):
        batch = epochs.take()
        wait = clock() - mark
        yield batch
        now = clock()
        if not interrupted():  # an epoch that ends within a trial: its restart is part of the training's time
            step_s.append(now - mark)
            wait_s.append(wait)
            if len(step_s) == steps:
                mark = now
                break
        mark = now
    cpu_after = _cpu_seconds(workers) if epochs.count == epoch else None  # else the workers have changed
    busy = None
    if cpu_before is not None and cpu_after is not None and mark > began:
        busy = (cpu_after - cpu_before) / ((mark - began) * len(workers))
    restart = None
    if setting.persistent_workers:
        for _ in epochs.iterator:  # the rest of the epoch (cut short to the trial's length), so that it ends
            pass
        mark = clock()
        epochs.take()  # a new epoch: the workers kept, what they had prefetched dropped
        restart = clock() - mark
    del epochs  # its workers end now, not with the next setting's
    done.append(Trial(setting, tuple(step_s), tuple(wait_s), first_batch, restart, busy))


def _settle(epochs: Epochs, batches: int) -> Generator[Any, None, None]:
    """The untimed batches after a trial's first: ``batches`` of them (what the workers prefetched), then more,
    as many again at most, until one is waited for. Until then the loop eats a backlog the workers built while
    it started, faster than the steady state it will see (a 30-step window read 4-6% fast). Where the iterator
    says how many batches wait ready (:func:`ready_batches`), a batch was waited for when none did; otherwise
    when its wait was long against the steps' own time (which a main process starved of the CPU can read as a
    wait while batches wait ready: a trial then read 8% faster than its workers can produce)."""
    clock = time.perf_counter
    bodies_s = 0.0  # the steps' own time, their waits aside, over the ``taken`` batches so far
    for taken in range(2 * batches):
        ready = ready_batches(epochs.iterator)
        mark = clock()
        batch = epochs.take()
        wait = clock() - mark
        if ready is None:
            waited = taken >= batches and taken > 0 and wait > 0.1 * bodies_s / taken
        else:
            waited = taken >= batches and ready == 0
        yield batch
        if waited:
            return
        bodies_s += clock() - mark - wait


def ready_batches(iterator: Any) -> int | None:
    """How many batches torch's multi-process iterator holds finished and not yet handed out (in its results
    queue, or received ahead of their turn), or None: another iterator, or a queue whose size the system does
    not tell (``qsize`` on macOS)."""
    results, tasks = getattr(iterator, "_data_queue", None), getattr(iterator, "_task_info", None)
    if results is None or not isinstance(tasks, dict) or not hasattr(results, "qsize"):
        return None
    try:
        queued = int(results.qsize())
    except (NotImplementedError, OSError, ValueError):
        return None
    return queued + sum(1 for task in list(tasks.values()) if isinstance(task, tuple) and len(task) == 2)


class Epochs:
    """A loader's batches across its epochs (a small dataset's epoch may be shorter than a trial)."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.iterator: Iterator[Any] = iter(loader)
        self.count = 1

    def take(self) -> Any:
        """The next batch, from a new epoch when one ends. ValueError for a loader without batches."""
        try:
            return next(self.iterator)
        except StopIteration:
            pass
        with more_workers_than_cores():
            self.iterator = iter(self.loader)
        self.count += 1
        try:
            return next(self.iterator)
        except StopIteration:
            raise ValueError("the DataLoader gives no batch: nothing to tune") from None


def _cpu_seconds(pids: set[int | None]) -> float | None:
    """The CPU time the processes ``pids`` have used (Linux's per-process scheduler statistics), or None: no
    processes, one gone, or no such statistics on this system."""
    if not pids:
        return None
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/schedstat", encoding="ascii") as stats:
                total += int(stats.read().split()[0])
        except (OSError, ValueError, IndexError):
            return None
    return total / 1e9
