"""What ``stepwatch tune`` measured, as plain data: the settings tried (:class:`Setting`), each trial's times
(:class:`Trial`), and the tuning (:class:`Tuning`: the table, the recommendation, the saved file that
``stepwatch report`` prints again). The search and the measuring are in ``_tune``."""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, dataclass
from typing import Any


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
