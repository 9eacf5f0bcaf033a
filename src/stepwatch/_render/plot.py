"""Pictures of a run with matplotlib (``stepwatch[plot]``): the step's breakdown, the step time over the run
and the workers' utilization; and two runs compared stage by stage. Reads summaries only; matplotlib is
imported when a picture is drawn, never with stepwatch."""

from __future__ import annotations

import io
import math
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._constants import ONE_OFF
from .._summary import PhaseSummary, Summary

if TYPE_CHECKING:
    from .._all_ranks import AllRanks

MS = 1e3
COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C", "#CCB974")
STAGE_COLORS = {
    "loader": "#4C72B0",
    "step/h2d": "#64B5CD",
    "step/forward": "#DD8452",
    "step/loss": "#CCB974",
    "step/backward": "#55A868",
    "step/optimizer": "#C44E52",
    "step/zero_grad": "#8172B3",
    "step/other": "#8C8C8C",
    "step": "#937860",
}
"""The colour of each common stage, the same in every picture of every run."""
_OTHER_COLORS = ("#DA8BC3", "#2F4B7C", "#A05195", "#F95D6A", "#665191", "#D45087", "#FFA600", "#3B8B7E")


def literal(text: object) -> str:
    """``text`` as matplotlib draws it literally: ``$`` is not math text, and a leading ``_`` does not hide a
    legend entry. Every name from a run (stages, phases, files, titles) goes through here."""
    value = str(text).replace("$", r"\$")
    return "\u200b" + value if value.startswith("_") else value


def stage_color(path: str) -> str:
    """A stage's colour: fixed for the common stages, else chosen by its name (a stable hash), so a stage is
    drawn in the same colour in every picture, whatever else the run recorded."""
    known = STAGE_COLORS.get(path)
    if known is not None:
        return known
    return _OTHER_COLORS[zlib.crc32(path.encode()) % len(_OTHER_COLORS)]


def pyplot() -> Any:
    """matplotlib's pyplot on a backend that needs no display, or an ImportError that says what to install."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError("plots need matplotlib: pip install 'stepwatch[plot]'") from None
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


MAX_PARTS = 12
"""Parts of a step drawn in a bar; past it the smallest are folded into one (a run of 10,000 stages)."""
MAX_ROWS = 30
"""Stages drawn in a comparison; past it the smallest are folded into one row."""
MAX_RANKS = 16
"""Ranks drawn apart; past it the slowest are kept and the others folded into one (a job of 2,000 ranks)."""
MAX_LINES = 8
"""Ranks drawn as lines over time; past it the slowest and one line for the others."""
FOLDED = "smaller stages, folded"
FOLDED_COLOR = "#C8C8C8"


def breakdown(phase: PhaseSummary) -> dict[str, float]:
    """Seconds per step of the loop's parts: the wait, then each part of the step (its top-level blocks and
    ``other``), in recording order, the smallest folded into :data:`FOLDED` past :data:`MAX_PARTS`; empty
    without steps."""
    if not phase.steps:
        return {}
    parents = {path.rsplit("/", 1)[0] for path in phase.stages if "/" in path}
    parts: dict[str, float] = {}
    for path, stage in phase.stages.items():
        top = path.split("/", 1)[0]
        if top in ONE_OFF or stage.in_workers:
            continue
        depth = path.count("/")
        if (depth == 0 and (top != "step" or path not in parents)) or (depth == 1 and top == "step"):
            parts[path] = stage.total / phase.steps
    return fold_smallest(parts, MAX_PARTS)


def fold_smallest(parts: dict[str, float], limit: int) -> dict[str, float]:
    """``parts`` as they are if at most ``limit``; else the ``limit - 1`` largest, in their order, and the
    rest summed into :data:`FOLDED`."""
    if len(parts) <= limit:
        return parts
    kept = set(sorted(parts, key=lambda path: -parts[path])[: limit - 1])
    folded = {path: value for path, value in parts.items() if path in kept}
    folded[FOLDED] = sum(value for path, value in parts.items() if path not in kept)
    return folded


def _fold_ranks(bars: dict[str, PhaseSummary]) -> tuple[dict[str, dict[str, float]], int]:
    """Each rank's breakdown; past :data:`MAX_RANKS`, the slowest ranks and one bar for the others (their
    mean breakdown). Returns the bars and how many ranks were folded."""
    shown = {label: breakdown(phase) for label, phase in bars.items()}
    if len(shown) <= MAX_RANKS:
        return shown, 0
    by_time = sorted(shown, key=lambda label: -sum(shown[label].values()))
    kept, rest = by_time[: MAX_RANKS - 1], by_time[MAX_RANKS - 1 :]
    mean: dict[str, float] = {}
    for label in rest:
        for part, value in shown[label].items():
            mean[part] = mean.get(part, 0.0) + value / len(rest)
    folded = {label: shown[label] for label in shown if label in set(kept)}
    folded[f"{len(rest)} other ranks (mean)"] = mean
    return folded, len(rest)


def run_figure(run: Summary | AllRanks, title: str = "") -> Any:
    """The step's breakdown (a stacked bar per phase, or per rank for an all-ranks run), the time per step over
    the recent window, and each DataLoader worker's utilization."""
    plt = pyplot()
    runs = tuple(run.runs) if not isinstance(run, Summary) else (run,)
    main = runs[0].main_phase
    figure, (left, middle, right) = plt.subplots(1, 3, figsize=(16, 5.6), gridspec_kw={"width_ratios": [1.1, 1.6, 1]})
    if len(runs) > 1:
        bars = {f"rank {_rank(r, i)}": r.phases[main.name] for i, r in enumerate(runs) if main.name in r.phases}
        left.set_title(literal(f"time per step by rank ({main.name})"))
    else:
        bars = {name: phase for name, phase in main_first(runs[0]).items() if phase.steps}
        left.set_title("time per step by phase")
    stacked, folded_ranks = _fold_ranks(bars) if len(runs) > 1 else ({k: breakdown(p) for k, p in bars.items()}, 0)
    if folded_ranks:
        left.set_title(literal(f"time per step by rank ({main.name}): the {MAX_RANKS - 1} slowest"))
    _stacked(left, stacked)
    _over_time(middle, runs)
    _workers(right, runs[0].phases.get(main.name, main))
    if title:
        figure.suptitle(literal(title))
    figure.tight_layout()
    return figure


def comparison_figure(before: Summary, after: Summary, before_name: str, after_name: str) -> Any:
    """Two runs side by side: ms per call of every stage of the main phase both measured."""
    from .._analysis import common_phases, compare

    plt = pyplot()
    phases = common_phases(before, after)
    comparison = compare(before, after, phases[0] if phases else None)
    changes = [c for c in comparison.stages if c.path.split("/", 1)[0] not in ONE_OFF]
    folded = 0
    if len(changes) > MAX_ROWS:  # the largest stages, in their order, and one row saying how many are left out
        largest = set(sorted(changes, key=lambda c: -max(c.before or 0, c.after or 0))[: MAX_ROWS - 1])
        folded = len(changes) - len(largest)
        changes = [c for c in changes if c in largest]
    changes = changes[::-1]
    figure, axes = plt.subplots(figsize=(10, 1.2 + 0.42 * max(len(changes) + bool(folded), 1)))
    positions = range(len(changes))
    height = 0.38
    axes.barh(
        [p + height / 2 for p in positions],
        [(c.before or 0) * MS for c in changes],
        height,
        label=literal(before_name),
        color=COLORS[0],
    )
    axes.barh(
        [p - height / 2 for p in positions],
        [(c.after or 0) * MS for c in changes],
        height,
        label=literal(after_name),
        color=COLORS[1],
    )
    labels = [literal(c.path) for c in changes]
    if folded:
        labels = [f"{folded:,} smaller stages (not drawn)", *labels]
        positions = range(-1, len(changes))
    axes.set_yticks(list(positions), labels)
    axes.set_xlabel("ms per call")
    step = comparison.step
    headline = f"phase {literal(comparison.phase)}: time per step"
    if step.before is not None and step.after is not None:
        headline += f" {step.before * MS:.3g} ms -> {step.after * MS:.3g} ms ({step.percent or 0:+.1f}%)"
    axes.set_title(headline)
    axes.legend(loc="lower right")
    axes.grid(axis="x", alpha=0.3)
    figure.tight_layout()
    return figure


def main_first(summary: Summary) -> dict[str, PhaseSummary]:
    main = summary.main_phase.name
    return dict(sorted(summary.phases.items(), key=lambda item: item[0] != main))


def save(figure: Any, path: str) -> None:
    """PNG, SVG or PDF by ``path``'s extension."""
    from .._run_file import write_atomically

    plt = pyplot()
    buffer = io.BytesIO()
    try:
        figure.savefig(buffer, dpi=110, format=path.rsplit(".", 1)[-1].lower())
    finally:
        plt.close(figure)
    write_atomically(buffer.getvalue(), path)  # a failed write leaves the old picture, never a cut one


def svg(figure: Any) -> str:
    """The figure as an SVG document (for inline use in HTML)."""
    plt = pyplot()
    buffer = io.StringIO()
    try:
        figure.savefig(buffer, format="svg")
    finally:
        plt.close(figure)
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _rank(summary: Summary, index: int) -> int:
    from .._ranks import rank_of

    return rank_of(summary, index)


def _stacked(axes: Any, bars: dict[str, dict[str, float]]) -> None:
    labels = list(bars)
    shown = [literal(label) for label in labels]
    parts = list(dict.fromkeys(part for figures in bars.values() for part in figures))
    bottoms = [0.0] * len(labels)
    for part in parts:
        heights = [bars[label].get(part, 0.0) * MS for label in labels]
        color = FOLDED_COLOR if part == FOLDED else stage_color(part)
        axes.bar(shown, heights, bottom=bottoms, label=literal(part), color=color, width=0.6)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    axes.set_ylabel("ms per step")
    if parts:  # below the bars, which it would otherwise hide
        axes.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, frameon=False)
    else:
        axes.text(0.5, 0.5, "no steps measured", ha="center", va="center", transform=axes.transAxes)
    axes.grid(axis="y", alpha=0.3)


def _over_time(axes: Any, runs: Sequence[Summary]) -> None:
    """The loop's wait + step for the most recent steps each rank kept (the stages' windows); a rank whose run
    came without its window (the gather sends none) is drawn at its mean time per step, dashed, so that every
    rank is on the panel."""
    axes.set_title("time per step over the recent steps")
    drawn = False
    windowless: list[tuple[int, Summary]] = []
    others: list[Summary] = []
    if len(runs) > MAX_LINES:  # the slowest ranks, and the others as one line: a legend that fits
        means = {i: _mean_step(run) for i, run in enumerate(runs)}
        kept = set(sorted(means, key=lambda i: -means[i])[: MAX_LINES - 1])
        others = [run for i, run in enumerate(runs) if i not in kept and run.main_phase.steps]
        runs_drawn = [(i, run) for i, run in enumerate(runs) if i in kept]
    else:
        runs_drawn = list(enumerate(runs))
    for index, run in runs_drawn:
        phase = run.main_phase
        wait = phase.stages.get("loader")
        body = phase.stages.get("step")
        if body is None or not body.recent_ns:
            if phase.steps and len(runs) > 1:
                windowless.append((index, run))
            continue
        count = (
            min(len(body.recent_ns), len(wait.recent_ns))
            if wait is not None and wait.recent_ns
            else len(body.recent_ns)
        )
        waits = wait.recent_ns[-count:] if wait is not None and wait.recent_ns else (0,) * count
        steps = [(w + s) / 1e6 for w, s in zip(waits, body.recent_ns[-count:], strict=True)]
        first = phase.steps - count + 1
        label = f"rank {_rank(run, index)}" if len(runs) > 1 else "wait + step"
        color = COLORS[index % len(COLORS)] if len(runs) > 1 else "#333333"
        axes.plot(range(first, first + count), steps, linewidth=1, label=label, color=color)
        if len(runs) == 1 and wait is not None and wait.recent_ns:
            axes.plot(
                range(first, first + count),
                [w / 1e6 for w in waits],
                linewidth=1,
                label="wait for data",
                color=stage_color("loader"),
            )
        drawn = True
    if others:
        median = sorted(_mean_step(run) for run in others)[len(others) // 2]
        last = max(run.main_phase.steps for run in others)
        _level(axes, last, median, f"{len(others)} other ranks (median of their means)", ":", "#555555", 1.5)
        drawn = True
    for index, run in windowless:
        phase = run.main_phase
        last = max(phase.steps, 1)
        label = f"rank {_rank(run, index)} (mean: no window kept)"
        _level(axes, last, _mean_step(run), label, "--", COLORS[index % len(COLORS)])
        drawn = True
    axes.set_xlabel("step")
    axes.set_ylabel("ms")
    if drawn:
        axes.legend(fontsize="small", loc="upper right")
        axes.set_ylim(bottom=0)
    else:
        axes.text(0.5, 0.5, "no loop measured", ha="center", va="center", transform=axes.transAxes)
    axes.grid(alpha=0.3)


def _level(axes: Any, last: int, seconds: float, label: str, style: str, color: str, width: float = 1.0) -> None:
    """A flat line over the last 50 steps up to ``last``, at ``seconds`` per step: a rank (or ranks) drawn by a
    mean, where no window of recent steps is there to draw."""
    axes.plot([max(last - 50, 1), last], [seconds * MS] * 2, linewidth=width, linestyle=style, label=label, color=color)


def _mean_step(run: Summary) -> float:
    phase = run.main_phase
    return phase.measured / phase.steps if phase.steps else 0.0


def _workers(axes: Any, phase: PhaseSummary) -> None:
    axes.set_title("DataLoader workers: busy share of their time")
    if not phase.workers:
        axes.text(0.5, 0.5, "no DataLoader workers", ha="center", va="center", transform=axes.transAxes)
        axes.set_xticks([])
        axes.set_yticks([])
        return
    ids = list(phase.workers)
    names = [f"worker {i}" for i in ids]
    axes.bar(names, [phase.workers[i].utilization * 100 for i in ids], color=COLORS[2], width=0.6, label="busy")
    on_cpu = [phase.workers[i].utilization * phase.workers[i].cpu_share * 100 for i in ids]
    if not any(math.isnan(value) for value in on_cpu):  # how much of the busy time computed (the rest waited)
        axes.bar(names, on_cpu, color="#2E6B3A", width=0.3, label="of which on the CPU")
        axes.legend(fontsize="small", loc="upper right")
    axes.set_ylim(0, 100)
    axes.set_ylabel("% busy")
    axes.grid(axis="y", alpha=0.3)
