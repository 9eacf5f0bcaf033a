"""``stepwatch.tune(loader, step=fn)``: the DataLoader settings that make this training fastest, measured.

Each setting is tried by building a new DataLoader over the same dataset, batch size, sampler kind, collate
function, worker init and drop_last, with other ``num_workers`` / ``prefetch_factor``, and running the
program's own step on :data:`STEPS` of its batches (after its first batch, whose start-up is reported apart).
So each setting's time per step includes what its workers take from the training (cores, memory bandwidth,
the main process receiving batches). The search climbs ``num_workers`` from 0 while the time per step improves
by more than the noise measured (beyond the CPU count when the best workers are seen waiting rather than
computing), then tries ``prefetch_factor`` for the best (and ``pin_memory`` with an accelerator), then runs the
best and the original once more. What it measured is plain data in ``_tuning``.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Callable, Generator, Iterator
from dataclasses import replace
from typing import Any, cast

from ._tuning import Setting, Trial, Tuning

STEPS = 30
"""Steps measured per setting (after its first batch)."""
PREFETCH = (4, 8)
"""``prefetch_factor`` values tried beside torch's default (2), for the best number of workers."""


class Rebuilder:
    """Builds a program's DataLoader again with another setting: the same dataset, batch size, sampler kind,
    collate function, worker init, ``drop_last``, pinning and start method. Raises ValueError, in one line, for a
    loader it cannot rebuild; ``kept`` says what it keeps as the program has it."""

    def __init__(self, loader: Any) -> None:
        from torch.utils.data import DataLoader, IterableDataset, RandomSampler, SequentialSampler

        if not isinstance(loader, DataLoader):
            raise ValueError(f"tune needs a torch DataLoader, got {type(loader).__name__}")
        if isinstance(loader.dataset, IterableDataset):
            raise ValueError("tune cannot rebuild a DataLoader over an IterableDataset (its sharding is its own)")
        if loader.batch_size is None and loader.batch_sampler is None:
            raise ValueError("tune cannot rebuild a DataLoader that does not batch (batch_size=None)")
        self.loader = loader
        self.accelerator = _accelerator()
        self.kept = ["persistent_workers, as yours (not tried yet)"]
        if not self.accelerator:
            self.kept.append(f"pin_memory={loader.pin_memory}, as yours: no accelerator in use, pinning gains nothing")
        if loader.batch_size is None:
            self.kept.append(f"the batch sampler ({type(loader.batch_sampler).__name__}) is reused as it is")
        elif not isinstance(loader.sampler, (RandomSampler, SequentialSampler)):
            self.kept.append(f"the sampler ({type(loader.sampler).__name__}) is reused as it is")
        self.pin_memory = bool(loader.pin_memory) if self.accelerator else None  # the pinning to try the other of
        prefetch = loader.prefetch_factor if loader.num_workers and loader.prefetch_factor != 2 else None
        self.original = Setting(loader.num_workers, prefetch)  # torch's default prefetching is None here

    def build(self, setting: Setting) -> Any:
        from torch.utils.data import DataLoader, RandomSampler

        loader = self.loader
        sampler = loader.sampler
        if isinstance(sampler, RandomSampler):
            sampler = RandomSampler(cast(Any, loader.dataset))  # a fresh order, as a new epoch's
        batching: dict[str, Any] = (
            {"batch_size": loader.batch_size, "sampler": sampler, "drop_last": loader.drop_last}
            if loader.batch_size is not None
            else {"batch_sampler": loader.batch_sampler}  # its own: reused as it is
        )
        options: dict[str, Any] = {
            **batching,
            "collate_fn": loader.collate_fn,
            "num_workers": setting.num_workers,
            "pin_memory": loader.pin_memory if setting.pin_memory is None else setting.pin_memory,
            "worker_init_fn": loader.worker_init_fn,
        }
        if setting.num_workers:
            options["prefetch_factor"] = setting.prefetch_factor or 2
            options["multiprocessing_context"] = loader.multiprocessing_context
        with more_workers_than_cores():
            return DataLoader(loader.dataset, **options)


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


def better(candidate: Trial, best: Trial) -> bool:
    """Faster by more than the noise of either."""
    return best.per_step - candidate.per_step > max(candidate.noise, best.noise)


def plan(
    original: Setting, max_workers: int | None = None, pin_memory: bool | None = None
) -> Generator[Setting, Trial, Setting]:
    """The search, as a generator: it yields the next setting to try and is sent its trial; it returns the
    setting chosen. ``num_workers`` is climbed from 0 until two settings in a row gain nothing beyond the noise
    (past the CPU count, up to twice the cores, while the best workers still leave the loop waiting), then
    ``prefetch_factor`` is tried for the best, then, with an accelerator in use (``pin_memory``: the program's own
    pinning), the other pinning; then the original and the best are run once more."""
    cores = os.cpu_count() or 1
    limit = max_workers if max_workers is not None else cores
    best = yield original
    tried = {original}
    workers, misses, extended = -1, 0, max_workers is not None
    while misses < 2:
        workers = _next_workers(workers)
        if workers > limit:
            if extended or best.setting.num_workers != limit or not _waiting(best):
                break
            limit, extended = 2 * cores + 2, True  # the best workers still leave the loop waiting: more than cores
        setting = Setting(workers)
        if setting in tried:
            continue
        tried.add(setting)
        trial = yield setting
        if better(trial, best):
            best, misses = trial, 0
        else:
            misses += 1
    if best.setting.num_workers:
        for factor in PREFETCH:
            setting = Setting(best.setting.num_workers, factor)
            if setting not in tried:
                tried.add(setting)
                trial = yield setting
                if better(trial, best):
                    best = trial
    if pin_memory is not None:
        setting = replace(best.setting, pin_memory=not pin_memory)
        trial = yield setting
        if better(trial, best):
            best = trial
    yield original  # confirm: the original and the best once more, their trials pooled
    if best.setting != original:
        yield best.setting
    return best.setting


def conclude(original: Setting, chosen: Setting, trials: list[Trial], kept: list[str]) -> Tuning:
    """The tuning, every setting's trials pooled: the search's choice, or a setting faster than it beyond the
    noise (its confirmation may have come out slower than its first trial), unless that does not beat the
    original beyond the noise."""
    result = Tuning(original, chosen, tuple(trials), tuple(kept))
    pooled = [result.of(setting) for setting in dict.fromkeys(trial.setting for trial in trials)]
    fastest = min(pooled, key=lambda trial: trial.per_step)
    if better(fastest, result.of(chosen)):
        chosen = fastest.setting
    if chosen != original and not better(result.of(chosen), result.of(original)):
        chosen = original  # not confirmed
    return Tuning(original, chosen, tuple(trials), tuple(kept))


def tune(loader: Any, step: Callable[[Any], Any], steps: int = STEPS, max_workers: int | None = None) -> Tuning:
    """Tries DataLoader settings on ``step(batch)``, the program's own training step, and recommends the fastest
    (see the module's docstring). ``loader`` is the program's DataLoader (its dataset, batch size, sampler kind,
    collate function and worker init are kept); ``steps`` batches are timed per setting; ``max_workers``
    defaults to the CPU count. Raises ValueError for what cannot be tuned (not a map-style DataLoader)."""
    rebuilder = Rebuilder(loader)
    if not isinstance(steps, int) or steps < 2:
        raise ValueError(f"steps must be an integer of at least 2, got {steps!r}")
    trials: list[Trial] = []
    search = plan(rebuilder.original, max_workers, rebuilder.pin_memory)
    setting = next(search)
    while True:
        trials.append(_measure(setting, rebuilder.build(setting), step, steps))
        try:
            setting = search.send(trials[-1])
        except StopIteration as done:
            return conclude(rebuilder.original, done.value, trials, rebuilder.kept)


def settling_batches(setting: Setting) -> int:
    """Batches run untimed after a setting's first one: those its workers had prefetched while it started come
    at once, faster than the steady state the training will see."""
    return (setting.prefetch_factor or 2) * setting.num_workers


def _next_workers(workers: int) -> int:
    """0, 1, 2, 3, 4, 6, 9, 13, ...: one by one up to 4, then by half again."""
    return workers + 1 if workers < 4 else workers + workers // 2


def _waiting(trial: Trial) -> bool:
    """Whether the loop still waits for data with that many workers (they wait on I/O rather than compute)."""
    return trial.wait_share > 0.05


def _measure(setting: Setting, loader: Any, step: Callable[[Any], Any], steps: int) -> Trial:
    """Runs ``step`` on a fresh iterator's batches (see :func:`trial_batches`): the setting's trial."""
    done: list[Trial] = []
    for batch in trial_batches(setting, loader, steps, done):
        step(batch)
    return done[0]


def trial_batches(setting: Setting, loader: Any, steps: int, done: list[Trial]) -> Iterator[Any]:
    """The batches of one trial, for the program's step to run on, from a fresh iterator: its first batch and
    what its workers prefetched meanwhile (untimed), then ``steps`` timed ones: each step's time runs from the
    wait for its batch to the request for the next. When they are all run, the trial is appended to ``done``."""
    clock = time.perf_counter
    with more_workers_than_cores():
        iterator: Iterator[Any] = iter(loader)
    started = clock()
    try:
        first = next(iterator)
    except StopIteration:
        raise ValueError("the DataLoader gives no batch: nothing to tune") from None
    first_batch = clock() - started
    yield first
    for _ in range(settling_batches(setting)):
        batch = next(iterator, None)
        if batch is None:
            break
        yield batch
    step_s, wait_s = [], []
    mark = clock()
    for _ in range(steps):
        try:
            batch = next(iterator)
        except StopIteration:
            break
        wait = clock() - mark
        yield batch
        now = clock()
        step_s.append(now - mark)
        wait_s.append(wait)
        mark = now
    del iterator  # its workers end now, not with the next setting's
    done.append(Trial(setting, tuple(step_s), tuple(wait_s), first_batch))
