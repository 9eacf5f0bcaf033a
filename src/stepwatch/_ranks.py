"""The all-ranks analysis: per stage the spread over ranks, per rank its figures, and the straggler.

Under DDP the all-reduce inside backward makes every rank wait for the slowest, so the slow rank hides: the
others show a long ``backward`` while its own cause is a slow ``loader``, ``h2d`` or ``forward``. So only the
stages that run before the ranks synchronize can blame a rank; the stages collectives equalize are marked.
Reads summaries only (one per rank, from saved files or a gather).
"""

from __future__ import annotations

import bisect
import functools
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ._constants import DEFAULT_PHASE, ONE_OFF, OTHER, PRE_SYNC
from ._summary import PhaseSummary, Summary

if TYPE_CHECKING:
    from ._analysis import Comparison

STRAGGLER = 0.15
"""A rank is the straggler when one of its pre-synchronization stages exceeds the median of the *other* ranks
by more than this share of their median step (loader + step) time. Compared with the others, not with a median
that includes it: with two ranks that median is the midpoint and halves what the job loses."""
EQUALIZED = ("step/backward", "step/optimizer")
"""Stages that collectives equalize (the all-reduce in backward under DDP, the optimizer under ZeRO): every
rank waits there for the slowest, so they never blame a rank."""


@dataclass(frozen=True)
class StageSpread:
    """One stage over the ranks, in seconds per step."""

    path: str
    per_rank: Mapping[int, float]

    @property
    def median(self) -> float:
        return statistics.median(self.per_rank.values())

    @property
    def low(self) -> tuple[float, int]:
        rank = min(self.per_rank, key=lambda r: (self.per_rank[r], r))
        return self.per_rank[rank], rank

    @property
    def high(self) -> tuple[float, int]:
        rank = max(self.per_rank, key=lambda r: (self.per_rank[r], -r))
        return self.per_rank[rank], rank

    def excess(self, rank: int) -> float:
        """How much longer ``rank`` spends in this stage per step than the other ranks' median."""
        value = self.per_rank[rank]
        return value - median_without(sorted(self.per_rank.values()), value)

    @property
    def ratio(self) -> float:
        median = self.median
        return self.high[0] / median if median > 0 else float("nan")

    @property
    def equalized(self) -> bool:
        return self.path in EQUALIZED


def median_without(ordered: Sequence[float], value: float) -> float:
    """The median of the sorted ``ordered`` with one copy of ``value`` (one rank's own figure) left out: the
    median of the other ranks; ``value`` itself when no other rank is there."""
    if len(ordered) < 2:
        return value
    position = bisect.bisect_left(ordered, value)
    middle, odd = divmod(len(ordered) - 1, 2)

    def at(index: int) -> float:
        return ordered[index if index < position else index + 1]

    return at(middle) if odd else (at(middle - 1) + at(middle)) / 2


@dataclass(frozen=True)
class RankFigures:
    rank: int
    steps: int
    step_s: float  # loader + step per step
    loader_share: float
    throughput: Mapping[str, float]


@dataclass(frozen=True)
class Straggler:
    rank: int
    stage: str
    excess_s: float  # per step, over the median of the other ranks: what the job loses to it
    step_s: float  # the other ranks' median step time it is compared with


@dataclass(frozen=True)
class RanksReport:
    phase: str
    ranks: Sequence[RankFigures]
    stages: Sequence[StageSpread]
    straggler: Straggler | None
    threshold: float = STRAGGLER
    slowest_in_windows: Mapping[int, int] = field(default_factory=dict)
    """With ``gather_every``: how many windows each rank was the slowest in before the ranks synchronize."""

    @property
    def slowest(self) -> RankFigures:
        return max(self.ranks, key=lambda figures: (figures.step_s, -figures.rank))

    @property
    def job_throughput(self) -> Mapping[str, float]:
        """Units per second of the whole job: the sum over ranks."""
        total: dict[str, float] = {}
        for figures in self.ranks:
            for unit, rate in figures.throughput.items():
                total[unit] = total.get(unit, 0.0) + rate
        return total


def rank_of(summary: Summary, index: int) -> int:
    rank = summary.metadata.get("rank")
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else index


def ranks_report(summaries: Sequence[Summary], phase: str | None = None) -> RanksReport:
    """The all-ranks figures of one phase (default: the main phase of the first rank that has one); ranks
    may have recorded different stages. Raises ValueError when no rank measured a step of that phase, or when
    two summaries claim the same rank."""
    by_rank: dict[int, Summary] = {}
    for index, summary in enumerate(summaries):
        rank = rank_of(summary, index)
        if rank in by_rank:
            raise ValueError(f"two runs are rank {rank}: give one run per rank")
        by_rank[rank] = summary
    if phase is None:
        phase = next((s.main_phase.name for s in by_rank.values() if s.phases), DEFAULT_PHASE)
    phases: dict[int, PhaseSummary] = {
        rank: s.phases[phase] for rank, s in sorted(by_rank.items()) if phase in s.phases and s.phases[phase].steps
    }
    if not phases:
        raise ValueError(f"no rank measured a step of phase {phase!r}")
    ranks = [
        RankFigures(
            rank,
            p.steps,
            p.measured / p.steps,
            p.share("loader") if "loader" in p.stages else 0.0,
            dict(p.throughput),
        )
        for rank, p in phases.items()
    ]
    paths = list(dict.fromkeys(path for p in phases.values() for path in p.stages))
    stages = [
        StageSpread(
            path, {rank: p.stages[path].total / p.steps if path in p.stages else 0.0 for rank, p in phases.items()}
        )
        for path in paths
        if path.split("/", 1)[0] not in ONE_OFF and not path.endswith(f"/{OTHER}")
    ]
    return RanksReport(phase, ranks, stages, _straggler(stages, ranks), STRAGGLER, slowest_in_windows(by_rank))


def slowest_in_windows(by_rank: Mapping[int, Summary]) -> dict[int, int]:
    """Per rank, the windows (``gather_every``'s, the ones every rank has) in which it spent the longest per step
    before the ranks synchronize; empty with fewer than two ranks or two windows. Ties go to the lower rank."""
    windows = {rank: list(summary.metadata.get("windows") or ()) for rank, summary in by_rank.items()}
    count = min((len(values) for values in windows.values()), default=0)
    if len(windows) < 2 or count < 2:
        return {}
    slowest = dict.fromkeys(sorted(windows), 0)
    for index in range(count):
        rank = max(sorted(windows), key=lambda r: (windows[r][index], -r))
        slowest[rank] += 1
    return slowest


def _straggler(stages: Sequence[StageSpread], ranks: Sequence[RankFigures]) -> Straggler | None:
    """The rank whose pre-synchronization stage exceeds the other ranks' median by the most, if by more than
    the threshold of their median step; worker-side stages under the loader name the part of the pipeline to
    blame. Every rank is compared with the others, so a straggler among two ranks is measured in full."""
    if len(ranks) < 2:
        return None
    steps = {figures.rank: figures.step_s for figures in ranks}
    ordered_steps = sorted(steps.values())
    candidates = [s for s in stages if s.path in PRE_SYNC]
    worst: Straggler | None = None
    for spread in candidates:
        ordered = sorted(spread.per_rank.values())
        for rank, value in spread.per_rank.items():
            excess = value - median_without(ordered, value)
            step = median_without(ordered_steps, steps[rank]) if rank in steps else statistics.median(ordered_steps)
            if excess > STRAGGLER * step and (worst is None or excess > worst.excess_s):
                worst = Straggler(rank, spread.path, excess, step)
    if worst is not None and worst.stage == "loader":
        rank, excess = worst.rank, worst.excess_s
        inside = [s for s in stages if s.path.startswith("loader/") and s.path.count("/") == 1]
        blame = max(inside, key=lambda s: s.excess(rank) if rank in s.per_rank else 0.0, default=None)
        if blame is not None and rank in blame.per_rank and blame.excess(rank) > 0.5 * excess:
            worst = Straggler(rank, blame.path, excess, worst.step_s)
    return worst


@dataclass(frozen=True)
class RanksComparison:
    """Two jobs of several ranks side by side, one phase: the job's stages (each stage over all ranks: the
    ranks' calls and totals added up) with the job's throughput (the sum over ranks), each rank's time per
    step, and the straggler of each."""

    job: Comparison
    ranks: Sequence[tuple[int, float | None, float | None]]
    """Per rank: its time per step (loader + step) before and after, None where it has no step."""
    stragglers: tuple[Straggler | None, Straggler | None]
    counts: tuple[int, int]
    """How many ranks each job has."""


def merge_ranks(summaries: Sequence[Summary]) -> Summary:
    """The ranks as one run: every stage's calls and totals added up, so its time per call is the mean over
    the ranks' calls."""
    return functools.reduce(Summary.merge, summaries[1:], summaries[0])


def compare_ranks(before: Sequence[Summary], after: Sequence[Summary], phase: str | None = None) -> RanksComparison:
    """``phase`` of two jobs (default: the first phase in common, else the main phase); either may be one
    run, as a job of one rank."""
    from ._analysis import compare

    job = compare(merge_ranks(before), merge_ranks(after), phase)
    units = list(dict.fromkeys([*_job_rates(before, job.phase), *_job_rates(after, job.phase)]))
    rates_before, rates_after = _job_rates(before, job.phase), _job_rates(after, job.phase)
    job = replace(job, throughput={unit: (rates_before.get(unit), rates_after.get(unit)) for unit in units})
    steps_before, steps_after = _step_times(before, job.phase), _step_times(after, job.phase)
    ranks = [(rank, steps_before.get(rank), steps_after.get(rank)) for rank in sorted({*steps_before, *steps_after})]
    return RanksComparison(
        job, ranks, (_straggler_of(before, job.phase), _straggler_of(after, job.phase)), (len(before), len(after))
    )


def _job_rates(summaries: Sequence[Summary], phase: str) -> dict[str, float]:
    total: dict[str, float] = {}
    for summary in summaries:
        for unit, rate in (summary.phases[phase].throughput if phase in summary.phases else {}).items():
            total[unit] = total.get(unit, 0.0) + rate
    return total


def _step_times(summaries: Sequence[Summary], phase: str) -> dict[int, float]:
    times = {}
    for index, summary in enumerate(summaries):
        measured = summary.phases.get(phase)
        if measured is not None and measured.steps:
            times[rank_of(summary, index)] = measured.measured / measured.steps
    return times


def _straggler_of(summaries: Sequence[Summary], phase: str) -> Straggler | None:
    try:
        return ranks_report(summaries, phase).straggler
    except ValueError:  # no rank measured a step of it, or one rank twice: no straggler to name
        return None
