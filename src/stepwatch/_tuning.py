"""What ``stepwatch tune`` measured, as plain data: the settings tried (:class:`Setting`), each trial's times
(:class:`Trial`), and the tuning (:class:`Tuning`: the table, the recommendation, the saved file that
``stepwatch report`` prints again). The search and the measuring are in ``_tune``."""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import asdict, dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Setting:
    """One DataLoader configuration tried."""

    num_workers: int
    prefetch_factor: int | None = None
    """None: torch's default (2 with workers)."""
    pin_memory: bool | None = None
    """None: as the program has it (tried only with an accelerator in use)."""
    persistent_workers: bool | None = None
    """None: torch's default (False): each epoch starts its workers again."""

    def arguments(self) -> dict[str, Any]:
        """The ``DataLoader(...)`` arguments that differ from torch's defaults (and ``pin_memory`` when tried)."""
        arguments: dict[str, Any] = {"num_workers": self.num_workers}
        if self.num_workers and self.prefetch_factor not in (None, 2):
            arguments["prefetch_factor"] = self.prefetch_factor
        if self.pin_memory is not None:
            arguments["pin_memory"] = self.pin_memory
        if self.persistent_workers is not None:
            arguments["persistent_workers"] = self.persistent_workers
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
    restart_s: float | None = None
    """With persistent workers: the wait for the first batch of a new epoch (the workers kept)."""
    workers_busy: float | None = None
    """The share of their time the workers spent on a CPU during the timed steps (None: no workers, or no way
    to read it on this system). Low while the loop waits: they wait on reads rather than compute."""
    drift: float = 0.0
    """How much a setting's mean moves from run to run beyond its steps' own noise, as a share of it (the
    machine changes between runs: other processes, caches, clock speeds); see :meth:`Tuning.drift`."""

    @property
    def epoch_start_s(self) -> float:
        """What each epoch's start costs: a fresh iterator's first batch, or a persistent one's restart."""
        return self.first_batch_s if self.restart_s is None else self.restart_s

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
        """How far the mean could be off by chance: twice its standard error (about a 95% interval). With
        workers, steps are not independent (batches come in rounds of one per worker, ready ones and waited-for
        ones in turn), so the standard error of the means of whole rounds is taken where it is the larger."""
        count = len(self.step_s)
        if count < 2:
            return 0.0
        own: float = 2 * self.spread / count**0.5
        size = max(1, self.setting.num_workers)
        rounds = [statistics.fmean(self.step_s[i : i + size]) for i in range(0, count - size + 1, size)]
        if size > 1 and len(rounds) >= 3:
            own = max(own, 2 * statistics.stdev(rounds) / math.sqrt(len(rounds)))
        return math.hypot(own, 2 * self.drift * self.per_step)

    @property
    def wait_share(self) -> float:
        total = sum(self.step_s)
        return sum(self.wait_s) / total if total else 0.0


def steady_state(setting: Setting) -> Setting:
    """The setting without its persistence: what decides its steps (persistence decides an epoch's start)."""
    return replace(setting, persistent_workers=None)


@dataclass(frozen=True)
class Tuning:
    """What ``tune`` measured: every trial in the order run (the original's and the best's confirmations
    last), the original setting and the recommended one."""

    original: Setting
    best: Setting
    trials: tuple[Trial, ...]
    kept: tuple[str, ...] = ()
    """What was kept as the program had it, and why (it could not be rebuilt or tried)."""
    loader: str = ""
    """Which DataLoader was tuned: its dataset, batch size and epoch length."""

    def runs(self, setting: Setting) -> list[Trial]:
        """A setting's trials, in the order run."""
        return [trial for trial in self.trials if trial.setting == setting]

    def steady_runs(self, setting: Setting) -> list[Trial]:
        """The trials whose steps a setting's figures pool: its own and its persistent (or not) twin's, in the
        order run. Persistent workers change nothing within an epoch (the same worker loop; only an epoch's
        start differs), so the two time the same steps, and comparing their runs compared a setting with itself
        (the persistent one, moved by the drift between runs, was turned down in 14 tunings of 100)."""
        twin = steady_state(setting)
        return [trial for trial in self.trials if steady_state(trial.setting) == twin]

    def of(self, setting: Setting) -> Trial:
        """A setting's figures: its steps and its twin's pooled (:meth:`steady_runs`), its own epoch start."""
        runs = self.runs(setting)
        if not runs:
            raise KeyError(setting.describe())
        steady = self.steady_runs(setting)
        steps = tuple(value for trial in steady for value in trial.step_s)
        waits = tuple(value for trial in steady for value in trial.wait_s)
        restarts = [trial.restart_s for trial in runs if trial.restart_s is not None]
        busy = [trial.workers_busy for trial in steady if trial.workers_busy is not None]
        return Trial(
            setting,
            steps,
            waits,
            min(trial.first_batch_s for trial in runs),
            min(restarts) if restarts else None,
            sum(busy) / len(busy) if busy else None,
        )

    def measured(self, setting: Setting) -> Trial:
        """A setting's figures as the table gives them: its trials pooled, except the best's steps, which are its
        confirming run's alone when it has one (the run that got it chosen is the luckiest of several, so it
        flatters it: the winner's curse), with the drift between runs in their noise."""
        figures = self.of(setting)
        if setting == self.best:
            steady = self.steady_runs(setting)
            if len(steady) > 1:
                last = steady[-1]  # one run: another would move by the drift
                busy = last.workers_busy
                return replace(figures, step_s=last.step_s, wait_s=last.wait_s, workers_busy=busy, drift=self.drift())
        return figures

    def drift(self) -> float:
        """The run-to-run variation of a setting's mean beyond its steps' own noise, as a share of the mean,
        estimated from the settings run more than once (the original and the best: their confirmations; a
        setting and its persistent twin count as one). A run's figure promises what another run of it gets only
        within both."""
        squares, freedom = 0.0, 0
        for setting in dict.fromkeys(steady_state(trial.setting) for trial in self.trials):
            runs = [run for run in self.steady_runs(setting) if len(run.step_s) > 1]
            if len(runs) < 2:
                continue
            centre = statistics.fmean(run.per_step for run in runs)
            for run in runs:
                standard_error = run.noise / 2
                squares += ((run.per_step - centre) ** 2 - (1 - 1 / len(runs)) * standard_error**2) / centre**2
            freedom += len(runs) - 1
        return math.sqrt(max(0.0, squares / freedom)) if freedom else 0.0

    @property
    def gain(self) -> float:
        """The best's time per step against the original's, as a fraction (negative: faster)."""
        before, after = self.measured(self.original).per_step, self.measured(self.best).per_step
        return after / before - 1 if before else 0.0

    def recommendation(self) -> str:
        if self.best == self.original:
            return f"your settings are already the fastest measured ({self.original.describe()})"
        before, after = self.measured(self.original), self.measured(self.best)
        text = (
            f"DataLoader({self.best.describe()}): {after.per_step * 1e3:.1f} ms per step instead of"
            f" {before.per_step * 1e3:.1f} ms ({self.gain:+.1%}; each ± {max(before.noise, after.noise) * 1e3:.1f} ms)"
        )
        if self.best.persistent_workers and not self.original.persistent_workers:
            fresh = steady_state(self.best)
            if any(trial.setting == fresh for trial in self.trials):
                text += (
                    f"; persistent workers start an epoch in {after.epoch_start_s * 1e3:.0f} ms instead of"
                    f" {self.of(fresh).epoch_start_s * 1e3:.0f} ms"
                )
        return text

    def render(self) -> str:
        settings = list(dict.fromkeys(trial.setting for trial in self.trials))
        rows = [
            (
                "setting",
                "ms/step",
                "± noise",
                "p50 ms",
                "spread ms",
                "wait %",
                "workers busy",
                "epoch start ms",
                "vs yours",
            )
        ]
        base = self.measured(self.original).per_step
        for setting in settings:
            figures = self.measured(setting)
            mark = " (yours)" if setting == self.original else " (best)" if setting == self.best else ""
            change = "-" if setting == self.original or not base else f"{figures.per_step / base - 1:+.1%}"
            rows.append(
                (
                    setting.describe() + mark,
                    f"{figures.per_step * 1e3:.2f}",
                    f"{figures.noise * 1e3:.2f}",
                    f"{figures.p50 * 1e3:.2f}",
                    f"{figures.spread * 1e3:.2f}",
                    f"{figures.wait_share:.1%}",
                    "-" if figures.workers_busy is None else f"{figures.workers_busy:.0%}",
                    f"{figures.epoch_start_s * 1e3:.0f}",
                    change,
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = [
            "stepwatch tune: the DataLoader settings measured on your own training step (ms/step: the mean, ± twice"
            " its standard error, the best's from its confirming run alone, with the drift between runs; workers"
            " busy: their share of time on a CPU; epoch start: the wait for an epoch's first batch)"
        ]
        if self.loader:
            lines.append(f"the loader tuned: {self.loader}")
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
            "loader": self.loader,
            "trials": [
                {
                    "setting": asdict(t.setting),
                    "step_s": t.step_s,
                    "wait_s": t.wait_s,
                    "first_batch_s": t.first_batch_s,
                    "restart_s": t.restart_s,
                    "workers_busy": t.workers_busy,
                }
                for t in self.trials
            ],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Tuning:
        """What :meth:`to_dict` wrote, every field checked; ValueError naming what is wrong, in one line."""
        try:
            trials = tuple(_trial_from(trial) for trial in data["trials"])
            original, best = _setting_from(data["original"]), _setting_from(data["best"])
            kept = data["kept"]
            if not isinstance(kept, list) or not all(isinstance(line, str) for line in kept):
                raise ValueError("kept is not a list of texts")
            settings = {trial.setting for trial in trials}
            if original not in settings or best not in settings:
                raise ValueError("the original or the best setting has no trial")
            loader = data.get("loader", "")
            if not isinstance(loader, str):
                raise ValueError("loader is not a text")
            kept_lines = tuple(line.replace("\n", " ") for line in kept)
            return cls(original, best, trials, kept_lines, loader.replace("\n", " "))
        except (AttributeError, KeyError, TypeError, ValueError, OverflowError) as error:
            message = str(error).replace("\n", " ")[:200]
            raise ValueError(f"not a tuning saved by stepwatch tune ({type(error).__name__}: {message})") from None

    def save(self, path: str | os.PathLike[str]) -> None:
        with open(path, "w", encoding="utf-8") as file:
            json.dump(self.to_dict(), file, indent=1)
            file.write("\n")


def _setting_from(data: Any) -> Setting:
    if not isinstance(data, dict):
        raise ValueError("a setting is not an object")
    setting = Setting(**data)
    if type(setting.num_workers) is not int or not 0 <= setting.num_workers <= 4096:
        raise ValueError(f"num_workers {setting.num_workers!r}")
    prefetch = setting.prefetch_factor
    if prefetch is not None and (type(prefetch) is not int or not 1 <= prefetch <= 4096):
        raise ValueError(f"prefetch_factor {prefetch!r}")
    for flag in (setting.pin_memory, setting.persistent_workers):
        if flag is not None and not isinstance(flag, bool):
            raise ValueError(f"a switch that is not true, false or null: {flag!r}")
    return setting


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e9:
        raise ValueError(f"not a time in seconds: {value!r:.40}")
    return float(value)


def _trial_from(data: Any) -> Trial:
    if not isinstance(data, dict):
        raise ValueError("a trial is not an object")
    step_s = tuple(_seconds(value) for value in data["step_s"])
    wait_s = tuple(_seconds(value) for value in data["wait_s"])
    if not step_s or len(wait_s) != len(step_s):
        raise ValueError("a trial's steps and waits are empty or of different lengths")
    restart, busy = data.get("restart_s"), data.get("workers_busy")
    return Trial(
        _setting_from(data["setting"]),
        step_s,
        wait_s,
        _seconds(data["first_batch_s"]),
        None if restart is None else _seconds(restart),
        None if busy is None else _seconds(busy),
    )


def load_tuning(path: str | os.PathLike[str]) -> Tuning | None:
    """The tuning saved at ``path`` by ``stepwatch tune -o``; None when the file is not one (a saved run)."""
    try:
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return None  # said by whoever reads it as a run
    if not isinstance(data, dict) or "stepwatch_tune" not in data:
        return None
    return Tuning.from_dict(data)
