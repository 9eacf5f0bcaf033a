"""The text renderers: the report (phases, stages, workers, the verdict), comparisons of two runs, and the
all-ranks report. They read a summary (or the ranks' report) only."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._analysis import analyze
from .._compile_report import compile_line
from .._mfu import flops_of
from .._self_cost import own_cost

if TYPE_CHECKING:
    from .._analysis import Comparison, Verdict
    from .._figures import StageStats
    from .._ranks import RanksComparison, RanksReport
    from .._summary import PhaseSummary, Summary

MS = 1e3


def format_ms(seconds: float) -> str:
    """Seconds as milliseconds, as every report shows them (3 decimals below 10 ms, else 2)."""
    if math.isnan(seconds):
        return "-"
    return f"{seconds * MS:.3f}" if seconds * MS < 10 else f"{seconds * MS:.2f}"


def format_rate(value: float) -> str:
    """A rate per second, as every report shows it."""
    return f"{value:,.1f}" if value < 1e4 else f"{value:,.0f}"


_ms, _rate = format_ms, format_rate  # the short names this module's tables use


def render_text(summary: Summary) -> str:
    """The five-second report: a section per phase, a row per stage, children indented under parents."""
    if not summary.phases:
        return "stepwatch: nothing recorded (is it enabled? set STEPWATCH=1 or call stepwatch.enable())\n"
    loaders = summary.metadata.get("loaders") or {}
    found = summary.metadata.get("auto")
    sections = [found + "\n"] if found else []
    for phase in summary.phases.values():
        section = _render_phase(phase, loaders.get(phase.name) or {})
        flops = flops_of(summary, phase)
        sections.append(section if flops is None else section + flops.describe() + "\n")
    if summary.metadata.get("flops_note"):
        sections.append(f"FLOPs: {summary.metadata['flops_note']}\n")
    compiled = compile_line(summary)
    if compiled is not None:
        sections.append(compiled + "\n")
    sections.append(render_verdict(analyze(summary)))
    devices = summary.metadata.get("devices") or []
    footer = f"run: {summary.elapsed:.2f} s wall"
    if devices:
        footer += " on " + " then ".join(str(d) for d in devices)
    footer += "\n"
    config = summary.metadata.get("config") or {}
    if config.get("sync"):
        footer += "sync mode on: the device was synchronized at every stage boundary (exact wall times, slower run)\n"
    if summary.metadata.get("device_error"):
        footer += f"device failed; its pending measurements were dropped: {summary.metadata['device_error']}\n"
    dropped = summary.metadata.get("dropped_blocks") or 0
    if dropped:
        footer += (
            f"{dropped:,} timed blocks were dropped: they overlapped out of order on one thread (asyncio tasks),"
            " so their nesting could not be known\n"
        )
    for event in summary.out_of_memory:
        footer += (
            f"out of memory in {event.phase}:{event.stage} with {event.allocated / MIB:,.0f} MiB allocated,"
            f" {event.reserved / MIB:,.0f} MiB reserved: {event.message}\n"
        )
    cost = own_cost(summary)
    if cost is not None:
        footer += cost + "\n"
    return "".join(sections) + footer


MIB = 2**20


_HEADER = ("stage", "calls", "total s", "ms/call", "± std", "p50 ms", "p90 ms", "p99 ms", "[n]", "% time")


_DEVICE_HEADER = ("dev ms/call", "peak MiB")


def _render_phase(phase: PhaseSummary, loader: Mapping[str, Any]) -> str:
    throughput = rates(phase.throughput)
    title = f"stepwatch · {phase.name} · {phase.steps} steps · {phase.measured:.3f} s measured"
    if throughput:
        title += f" · {throughput}"
    elif phase.counters and not phase.loop_ns:
        title += f" · {', '.join(phase.counters)} counted, no rate: without a timed loop the span is unknown"
    with_device = any(stage.device is not None or stage.peak_allocated is not None for stage in phase.stages.values())
    header = _HEADER + _DEVICE_HEADER if with_device else _HEADER
    rows = [header] + [_row(phase, stage, with_device) for stage in phase.stages.values()]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [title]
    if phase.device.steps:
        busy = phase.device.busy_ns / 1e9
        device_rates = rates(phase.device_throughput)
        line = f"device: {busy:.3f} s busy over {phase.device.steps} steps, idle {phase.device.idle_share * 100:.1f}%"
        line += " between steps"
        if device_rates:
            line += f" · {device_rates} of device time"
        lines.append(line)
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [
            cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=False)
        ]
        lines.append("  ".join(cells).rstrip())
    lines.extend(_workers_section(phase, loader.get("num_workers")))
    return "\n".join(lines) + "\n\n"


def _row(phase: PhaseSummary, stage: StageStats, with_device: bool) -> tuple[str, ...]:
    cells = (
        "  " * stage.depth + stage.name + (" [w]" if stage.in_workers else ""),
        f"{stage.calls:,}",
        f"{stage.total:.3f}",
        _ms(stage.mean),
        _ms(stage.std),
        _ms(stage.p50),
        _ms(stage.p90),
        _ms(stage.p99),
        f"{len(stage.recent_ns):,}" if stage.spread else "-",
        _percent(phase.share(stage.path)),
    )
    if not with_device:
        return cells
    device = _ms(stage.device.mean) if stage.device is not None else "-"
    peak = f"{stage.peak_allocated / MIB:,.1f}" if stage.peak_allocated is not None else "-"
    return (*cells, device, peak)


def _percent(fraction: float) -> str:
    return "-" if math.isnan(fraction) else f"{fraction * 100:.1f}"


def _workers_section(phase: PhaseSummary, configured: Any) -> list[str]:
    if not phase.workers:
        return []
    delivered = len(phase.workers)
    count = f"{configured} configured, {delivered} delivered batches" if isinstance(configured, int) else delivered
    lines = [f"workers ({count}); [w] rows ran inside them, % of their busy time:"]
    for worker in phase.workers.values():
        loader, worker_id = divmod(worker.worker_id, 1000)  # several loaders: see _dataloader.watch.LOADER_STRIDE
        name = f"loader {loader} worker {worker_id}" if loader else f"worker {worker_id}"
        cpu = "" if math.isnan(worker.cpu_share) else f" ({_percent(worker.cpu_share)}% of it on the CPU"
        if cpu and worker.queued_share >= 0.01:
            cpu += f", {_percent(worker.queued_share)}% waiting for a core"
        cpu += ")" if cpu else ""
        lines.append(
            f"  {name}: {worker.batches:,} batches, {_ms(worker.busy_per_batch)} ms busy per batch{cpu},"
            f" utilization {_percent(worker.utilization)}%, batches waited {_ms(worker.wait_per_batch)} ms ready"
        )
    return lines


def render_verdict(verdict: Verdict) -> str:
    lines = [f"verdict: {verdict.headline}"]
    lines.extend(f"  - {advice}" for advice in verdict.advice)
    return "\n".join(lines) + "\n\n"


def render_comparison(comparison: Comparison, before_name: str = "before", after_name: str = "after") -> str:
    """Per stage ms/call before and after (absolute and relative change), time per step, throughput, verdicts."""

    def ms(value: float | None) -> str:
        return "-" if value is None else _ms(value)

    header = ("stage", "before ms", "after ms", "change ms", "change %", "")
    rows: list[tuple[str, ...]] = [header]
    for change in (comparison.step, *comparison.stages):
        note = "only before" if change.after is None else "only after" if change.before is None else ""
        depth = change.path.count("/") if change is not comparison.step else 0
        rows.append(
            (
                "  " * depth + (change.path.rsplit("/", 1)[-1] if depth else change.path),
                ms(change.before),
                ms(change.after),
                "-" if change.delta is None else f"{change.delta * MS:+.3f}",
                "-" if change.percent is None else f"{change.percent:+.1f}%",
                note,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [f"stepwatch compare: {before_name} -> {after_name} (phase {comparison.phase}, per call)"]
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:-1], widths[1:-1], strict=True)]
        lines.append(("  ".join(cells) + "  " + row[-1]).rstrip())
    for unit, (before, after) in comparison.throughput.items():
        if before and after:
            lines.append(f"{unit}/s: {_rate(before)} -> {_rate(after)} ({(after / before - 1) * 100:+.1f}%)")
        else:
            lines.append(f"{unit}/s: {_rate(before) if before else '-'} -> {_rate(after) if after else '-'}")
    if comparison.verdicts is None:
        return "\n".join(lines) + "\n"
    first, second = comparison.verdicts
    if first.label == second.label:
        lines.append(f"verdict: {second.label} in both")
    else:
        lines.append(f"verdict: {first.label} -> {second.label}")
    lines.append(f"  before: {first.headline}")
    lines.append(f"  after:  {second.headline}")
    return "\n".join(lines) + "\n"


def render_ranks(report: RanksReport, world_size: int | None = None) -> str:
    """The all-ranks report: each stage's spread over the ranks, each rank's figures, the straggler."""
    count = len(report.ranks)
    of = f" of {world_size}" if world_size is not None and world_size > count else ""
    lines = [f"stepwatch · all ranks · {report.phase} · {count}{of} ranks · ms per step"]
    header = ("stage", "median", "min", "(rank)", "max", "(rank)", "max/median", "")
    rows = [header]
    for spread in report.stages:
        low, low_rank = spread.low
        high, high_rank = spread.high
        rows.append(
            (
                "  " * spread.path.count("/") + spread.path.rsplit("/", 1)[-1],
                _ms(spread.median),
                _ms(low),
                str(low_rank),
                _ms(high),
                str(high_rank),
                f"{spread.ratio:.2f}" if not math.isnan(spread.ratio) else "-",
                "equalized by collectives" if spread.equalized else "",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [
            cell.rjust(width) for cell, width in zip(row[1:-1], widths[1:-1], strict=True)
        ]
        lines.append("  ".join(cells + ([row[-1]] if row[-1] else [])).rstrip())
    lines.append("")
    lines.append("rank  steps  step ms  loader %  throughput")
    for figures in report.ranks:
        per_rank = rates(figures.throughput) or "-"
        lines.append(
            f"{figures.rank:>4}  {figures.steps:>5}  {_ms(figures.step_s):>7}  {figures.loader_share:>8.1%}  {per_rank}"
        )
    job = rates(report.job_throughput)
    lines.append(f"job: {job or 'no counts'} (sum over ranks); {step_times(report)}")
    lines.append(straggler_verdict(report))
    persistence = windows_verdict(report)
    if persistence is not None:
        lines.append(persistence)
    return "\n".join(lines) + "\n"


def step_times(report: RanksReport) -> str:
    """The ranks' time per step: with a straggler named, their range (collectives make every rank wait for
    it, so which rank is slowest overall is noise and would contradict the straggler line); else the slowest."""
    if report.straggler is not None:
        low = min(figures.step_s for figures in report.ranks)
        high = max(figures.step_s for figures in report.ranks)
        return f"ms per step over ranks: {_ms(low)} to {_ms(high)} (every rank waits for the straggler)"
    slowest = report.slowest
    return f"slowest rank: {slowest.rank} ({_ms(slowest.step_s)} ms per step)"


def straggler_verdict(report: RanksReport) -> str:
    """The straggler verdict in one line: the rank, the stage to blame and what the job loses, or none."""
    straggler = report.straggler
    if straggler is None:
        return (
            f"no straggler: no rank's loader, h2d or forward exceeds the median of the other ranks by more than"
            f" {report.threshold:.0%} of their median step"
        )
    return (
        f"straggler: rank {straggler.rank}, {straggler.stage}: {_ms(straggler.excess_s)} ms per step over the"
        f" median of the other ranks ({straggler.excess_s / straggler.step_s:.0%} of their median step); the job loses"
        f" about that much per step waiting for it (backward and optimizer are equalized by collectives and"
        f" never blamed)"
    )


PERSISTENT = 0.75
"""A rank the slowest in at least this share of the windows is a persistent straggler."""


def windows_verdict(report: RanksReport) -> str | None:
    """Whether the slowest rank is always the same over the windows gathered (``gather_every``): a persistent
    straggler (one node) or rotating noise; None without two windows on two ranks."""
    counts = report.slowest_in_windows
    if not counts:
        return None
    windows = sum(counts.values())
    rank, most = max(counts.items(), key=lambda item: (item[1], -item[0]))
    if most >= PERSISTENT * windows:
        return (
            f"rank {rank} was the slowest in {most} of {windows} windows before the ranks synchronize: a persistent"
            " straggler (look at its node, its data shard or its input pipeline)"
        )
    spread = ", ".join(f"rank {r} in {n}" for r, n in sorted(counts.items(), key=lambda item: -item[1]) if n)
    return (
        f"the slowest rank changed from window to window ({spread} of {windows} windows): rotating noise rather than"
        " one bad node"
    )


def rates(throughput: Mapping[str, float]) -> str:
    """``1,234.5 samples/s, 98,765.4 tokens/s``; empty without counts."""
    return ", ".join(f"{_rate(rate)} {unit}/s" for unit, rate in throughput.items())


def render_ranks_comparison(comparison: RanksComparison, before_name: str = "before", after_name: str = "after") -> str:
    """Two jobs of several ranks: the job's stages (over all ranks) and throughput (sum over ranks), each
    rank's time per step, and each job's straggler."""
    before_count, after_count = comparison.counts
    text = render_comparison(comparison.job, before_name, after_name)
    lines = text.rstrip("\n").split("\n")
    lines[0] += f"; all ranks: {before_count} -> {after_count} ranks, per call over every rank's calls"
    lines.append("")
    lines.append("rank  before ms/step  after ms/step  change %")
    for rank, before, after in comparison.ranks:
        change = f"{(after / before - 1) * 100:+.1f}%" if before and after else "-"
        cells = ("-" if before is None else _ms(before), "-" if after is None else _ms(after))
        lines.append(f"{rank:>4}  {cells[0]:>14}  {cells[1]:>13}  {change:>8}")
    for label, straggler in zip(("before", "after"), comparison.stragglers, strict=True):
        named = (
            "none"
            if straggler is None
            else f"rank {straggler.rank}, {straggler.stage} (+{_ms(straggler.excess_s)} ms per step over the others)"
        )
        lines.append(f"straggler {label}: {named}")
    return "\n".join(lines) + "\n"


def missing_line(missing: Sequence[int]) -> str:
    """The line naming the ranks of a job that did not answer the gather."""
    return (
        f"missing: rank {', '.join(map(str, missing))}: no answer in time, or not among the files given (a rank's"
        " own run file, if it wrote one, has its figures)"
    )
