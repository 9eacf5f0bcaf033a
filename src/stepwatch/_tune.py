"""``stepwatch.tune(loader, step=fn)``: the DataLoader settings that make this training fastest, measured.

Each setting is tried by building a new DataLoader over the same dataset, batch size, sampler kind, collate
function, worker init and drop_last, with other ``num_workers`` / ``prefetch_factor``, and running the
program's own step on :data:`STEPS` of its batches (after its first batch, whose start-up is reported apart).
So each setting's time per step includes what its workers take from the training (cores, memory bandwidth,
the main process receiving batches). The search climbs ``num_workers`` from 0 while the time per step improves
by more than the noise measured (beyond the CPU count when the best workers are seen waiting rather than
computing), then tries ``prefetch_factor`` for the best, then runs the best and the original once more.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import time
import warnings
from collections.abc import Callable, Generator, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any, cast

STEPS = 30
"""Steps measured per setting (after its first batch)."""
PREFETCH = (4, 8)
"""``prefetch_factor`` values tried beside torch's default (2), for the best number of workers."""


@dataclass(frozen=True)
class Setting:
    """One DataLoader configuration tried."""

    num_workers: int
    prefetch_factor: int | None = None
    """None: torch's default (2 with workers)."""
    pin_memory: bool | None = None
    """None: as the program has it (tried only with an accelerator in use)."""

    def arguments(self) -> dict[str, Any]:
        """The ``DataLoader(...)`` arguments that differ from torch's defaults (and ``pin_memory`` when tried)."""
        arguments: dict[str, Any] = {"num_workers": self.num_workers}
        if self.num_workers and self.prefetch_factor not in (None, 2):
            arguments["prefetch_factor"] = self.prefetch_factor
        if self.pin_memory is not None:
            arguments["pin_memory"] = self.pin_memory
        return arguments

    def describe(self) -> str:
        return ", ".join(f"{name}={value}" for name, value in self.arguments().items())


@dataclass(frozen=True)
class Trial:
    """One setting measured: the time of each step (the wait for its batch and the step itself), the wait
    alone, and the first batch (the workers starting), in seconds."""

    setting: Setting
    step_s: tuple[float, ...]
    wait_s: tuple[float, ...]
    first_batch_s: float

    @property
    def per_step(self) -> float:
        """The mean time per step: what the training's length comes down to (with workers the steps alternate
        between batches waiting ready and batches waited for, so the median would flatter them)."""
        return sum(self.step_s) / len(self.step_s) if self.step_s else float("nan")

    @property
    def p50(self) -> float:
        return statistics.median(self.step_s) if self.step_s else float("nan")

    @property
    def spread(self) -> float:
        """The standard deviation of the time per step within the setting."""
        return statistics.stdev(self.step_s) if len(self.step_s) > 1 else 0.0

    @property
    def noise(self) -> float:
        """How far the mean could be off by chance: twice its standard error (about a 95% interval)."""
        return 2 * self.spread / len(self.step_s) ** 0.5 if len(self.step_s) > 1 else 0.0

    @property
    def wait_share(self) -> float:
        total = sum(self.step_s)
        return sum(self.wait_s) / total if total else 0.0


@dataclass(frozen=True)
class Tuning:
    """What ``tune`` measured: every trial in the order run (the original's and the best's confirmations
    last), the original setting and the recommended one."""

    original: Setting
    best: Setting
    trials: tuple[Trial, ...]
    kept: tuple[str, ...] = ()
    """What was kept as the program had it, and why (it could not be rebuilt or tried)."""

    def of(self, setting: Setting) -> Trial:
        """A setting's figures, its trials pooled."""
        runs = [trial for trial in self.trials if trial.setting == setting]
        if not runs:
            raise KeyError(setting.describe())
        steps = tuple(value for trial in runs for value in trial.step_s)
        waits = tuple(value for trial in runs for value in trial.wait_s)
        return Trial(setting, steps, waits, min(trial.first_batch_s for trial in runs))

    @property
    def gain(self) -> float:
        """The best's time per step against the original's, as a fraction (negative: faster)."""
        before, after = self.of(self.original).per_step, self.of(self.best).per_step
        return after / before - 1 if before else 0.0

    def recommendation(self) -> str:
        if self.best == self.original:
            return f"your settings are already the fastest measured ({self.original.describe()})"
        before, after = self.of(self.original), self.of(self.best)
        return (
            f"DataLoader({self.best.describe()}): {after.per_step * 1e3:.1f} ms per step instead of"
            f" {before.per_step * 1e3:.1f} ms ({self.gain:+.1%}; each ± {max(before.noise, after.noise) * 1e3:.1f} ms)"
        )

    def render(self) -> str:
        settings = list(dict.fromkeys(trial.setting for trial in self.trials))
        rows = [("setting", "ms/step", "± noise", "p50 ms", "spread ms", "wait %", "first batch ms", "vs yours")]
        base = self.of(self.original).per_step
        for setting in settings:
            pooled = self.of(setting)
            mark = " (yours)" if setting == self.original else " (best)" if setting == self.best else ""
            change = "-" if setting == self.original or not base else f"{pooled.per_step / base - 1:+.1%}"
            rows.append(
                (
                    setting.describe() + mark,
                    f"{pooled.per_step * 1e3:.2f}",
                    f"{pooled.noise * 1e3:.2f}",
                    f"{pooled.p50 * 1e3:.2f}",
                    f"{pooled.spread * 1e3:.2f}",
                    f"{pooled.wait_share:.1%}",
                    f"{pooled.first_batch_s * 1e3:.0f}",
                    change,
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = [
            "stepwatch tune: the DataLoader settings measured on your own training step (ms/step: the mean, ± twice"
            " its standard error)"
        ]
        for row in rows:
            lines.append(
                "  ".join([row[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True))])
            )
        lines.extend(f"kept as it is: {reason}" for reason in self.kept)
        lines.append(f"recommended: {self.recommendation()}")
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        return {
            "stepwatch_tune": 1,
            "original": asdict(self.original),
            "best": asdict(self.best),
            "kept": list(self.kept),
            "trials": [
                {"setting": asdict(t.setting), "step_s": t.step_s, "wait_s": t.wait_s, "first_batch_s": t.first_batch_s}
                for t in self.trials
            ],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Tuning:
        """What :meth:`to_dict` wrote; ValueError naming what is wrong."""
        try:
            trials = tuple(
                Trial(
                    Setting(**trial["setting"]),
                    tuple(float(v) for v in trial["step_s"]),
                    tuple(float(v) for v in trial["wait_s"]),
                    float(trial["first_batch_s"]),
                )
                for trial in data["trials"]
            )
            return cls(Setting(**data["original"]), Setting(**data["best"]), trials, tuple(map(str, data["kept"])))
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"not a tuning saved by stepwatch tune ({type(error).__name__}: {error})") from None

    def save(self, path: str | os.PathLike[str]) -> None:
        with open(path, "w", encoding="utf-8") as file:
            json.dump(self.to_dict(), file, indent=1)
            file.write("\n")


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


def load_tuning(path: str | os.PathLike[str]) -> Tuning | None:
    """The tuning saved at ``path`` by ``stepwatch tune -o``; None when the file is not one (a saved run)."""
    try:
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
    except (OSError, ValueError, UnicodeDecodeError):
        return None  # said by whoever reads it as a run
    if not isinstance(data, dict) or "stepwatch_tune" not in data:
        return None
    return Tuning.from_dict(data)


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
