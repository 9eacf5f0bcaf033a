"""Two runs, or two jobs of several ranks, compared phase by phase: what ``stepwatch compare`` prints and
``stepwatch.compare(before, after)`` returns (a value a notebook displays as a table)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import _display
from ._all_ranks import AllRanks, load_runs
from ._analysis import Comparison, common_phases, compare
from ._ranks import RanksComparison, compare_ranks, merge_ranks
from ._summary import Summary

Comparable = Summary | AllRanks | Sequence[Summary] | str | os.PathLike[str]
"""A run, the ranks of a job (or their runs), or the path of a saved run or all-ranks file."""


@dataclass(frozen=True)
class Compared:
    """``before`` against ``after``, each phase both measured (the main one first). ``phases`` holds the
    per-phase comparisons (for jobs of several ranks, the job's rows, every rank's calls together); ``jobs``, for
    jobs, the same phases with each rank's time per step and each job's straggler. ``names`` label the two."""

    phases: tuple[Comparison, ...]
    jobs: tuple[RanksComparison, ...] = ()
    names: tuple[str, str] = ("before", "after")

    def render(self) -> str:
        """The comparison as text, as ``stepwatch compare`` prints it."""
        return _display.text_of(self)

    def slower_than(self, percent: float, stages: Sequence[str] = ()) -> list[str]:
        """What got slower by more than ``percent`` in the main phase: the time per step, and each stage named."""
        return [f"{self.phases[0].phase}: {failure}" for failure in self.phases[0].slower_than(percent, stages)]

    def _repr_html_(self) -> str:
        return _display.html_of(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        _display.pretty(self, printer, cycle)


def compare_runs(before: Comparable, after: Comparable, names: tuple[str, str] | None = None) -> Compared:
    """``stepwatch.compare``: two runs (a :class:`Summary`, an :class:`AllRanks`, or a saved file's path) compared
    phase by phase; all-ranks input compares the jobs. ``names`` default to the files' names, else
    ``before``/``after``. Raises ``ValueError`` when the two have no phase in common (and, for paths, what
    ``stepwatch.load`` raises)."""
    before_runs, after_runs = _runs(before), _runs(after)
    if names is None:
        names = (_name(before, "before"), _name(after, "after"))
    merged_before, merged_after = merge_ranks(before_runs), merge_ranks(after_runs)
    phases = common_phases(merged_before, merged_after)
    if not phases:
        raise ValueError(
            f"nothing to compare: {names[0]} has phases {', '.join(merged_before.phases) or 'none'},"
            f" {names[1]} has {', '.join(merged_after.phases) or 'none'}"
        )
    if len(before_runs) > 1 or len(after_runs) > 1:  # jobs of several ranks: the jobs are compared
        jobs = tuple(compare_ranks(before_runs, after_runs, phase) for phase in phases)
        return Compared(tuple(job.job for job in jobs), jobs, names)
    return Compared(tuple(compare(merged_before, merged_after, phase) for phase in phases), (), names)


def _runs(value: Comparable) -> list[Summary]:
    if isinstance(value, Summary):
        return [value]
    if isinstance(value, AllRanks):
        return list(value.runs)
    if isinstance(value, (str, os.PathLike)):
        return load_runs(value)
    if isinstance(value, (list, tuple)) and value and all(isinstance(run, Summary) for run in value):
        return list(value)  # a job's runs, as read from its files
    raise TypeError(f"compare takes runs, all-ranks values or paths of saved runs, got {type(value).__name__}")


def _name(value: Comparable, default: str) -> str:
    return os.fspath(value) if isinstance(value, (str, os.PathLike)) else default
