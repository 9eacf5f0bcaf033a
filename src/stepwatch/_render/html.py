"""The one-file HTML report: the tables, the verdict and its advice, the per-worker and per-rank tables, and the
plots as inline SVG. Self-contained (no script, no stylesheet or font fetched, no CDN): it opens offline in
any browser and can be attached to an issue. Without matplotlib the page says how to get the plots."""

from __future__ import annotations

import math
from html import escape
from typing import TYPE_CHECKING

from .._analysis import analyze
from .._compile_report import compile_line
from .._constants import ONE_OFF
from .._mfu import flops_of
from .._self_cost import own_cost
from .._summary import PhaseSummary, Summary
from .text import missing_line, rates, straggler_verdict, windows_verdict

if TYPE_CHECKING:
    from .._all_ranks import AllRanks

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1200px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
.meta, .note { color: #666; } .auto { font-family: ui-monospace, monospace; }
.verdict { border-left: 4px solid #C44E52; padding: 0.4em 1em; background: #fbf3f3; }
.verdict.ok { border-color: #55A868; background: #f3faf5; }
table { border-collapse: collapse; margin: 0.6em 0; } th, td { padding: 0.2em 0.7em; text-align: right; }
th { border-bottom: 1px solid #999; font-weight: 600; } td:first-child, th:first-child { text-align: left; }
tr:nth-child(even) td { background: #f6f6f6; } .oneoff td { color: #888; }
figure { margin: 1em 0; } svg { max-width: 100%; height: auto; }
"""


def render_html(run: Summary | AllRanks, title: str = "run", plots: bool = True) -> str:
    """The page for one run, or for the ranks of a job (their spread, the straggler, and rank 0's tables);
    ``plots=False`` leaves the plots out (drawing them is most of the time)."""
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>stepwatch · {escape(title)}</title><style>{STYLE}</style></head><body>",
        *content(run, title),
    ]
    if plots:
        parts.append(_plots(run))
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def content(run: Summary | AllRanks, title: str) -> list[str]:
    """The report's title, what was measured, the ranks (for a job), the verdict and every phase's tables: the
    page's body without its plots, which a notebook shows too (``_render.notebook``)."""
    job = None if isinstance(run, Summary) else run
    summary = run if isinstance(run, Summary) else run.runs[0]
    parts = [
        f"<h1>stepwatch · {escape(title)}</h1>",
        f'<p class="meta">{escape(_meta(summary))}</p>',
    ]
    found = summary.metadata.get("auto")
    if isinstance(found, str) and found:  # what auto-instrumentation found, as the text report's first line
        parts.append(f'<p class="auto">{escape(found)}</p>')
    if job is not None and len(job.runs) > 1:
        parts.append(_ranks(job))
        parts.append(f"<h2>rank {escape(str(summary.metadata.get('rank', 0)))}</h2>")
    elif job is not None and job.missing:  # only one rank answered: say so, this page is that rank's
        parts.append(
            f'<div class="verdict"><p><strong>{escape(missing_line(job.missing))}; 1 of {job.world_size} ranks'
            f" answered: this page is rank {escape(str(summary.metadata.get('rank', 0)))}'s</strong></p></div>"
        )
    parts.append(_verdict(summary))
    for phase in summary.phases.values():
        parts.append(_phase(phase))
        flops = flops_of(summary, phase)
        if flops is not None:
            parts.append(f'<p class="meta">{escape(flops.describe())}</p>')
    notes = [compile_line(summary), own_cost(summary)]
    if summary.metadata.get("flops_note"):
        notes.insert(0, f"FLOPs: {summary.metadata['flops_note']}")
    parts.extend(f'<p class="meta">{escape(note)}</p>' for note in notes if note)
    return parts


def _meta(summary: Summary) -> str:
    metadata = summary.metadata
    devices = " then ".join(str(d) for d in metadata.get("devices") or []) or "unknown device"
    started = metadata.get("started_at") or "an unknown time"
    return (
        f"{summary.elapsed:.2f} s wall on {devices}, started {started} on {metadata.get('host') or 'an unknown host'};"
        f" stepwatch {metadata.get('stepwatch') or '?'}, torch {metadata.get('torch') or '-'}"
    )


def _verdict(summary: Summary) -> str:
    verdict = analyze(summary)
    kind = "verdict ok" if verdict.kind in ("compute-bound", "balanced") else "verdict"
    advice = "".join(f"<li>{escape(line)}</li>" for line in verdict.advice)
    return f'<div class="{kind}"><p><strong>{escape(verdict.headline)}</strong></p><ul>{advice}</ul></div>'


def _cell(value: float, scale: float = 1e3, digits: int = 3) -> str:
    return "-" if value is None or math.isnan(value) else f"{value * scale:.{digits}f}"


MAX_TABLE_ROWS = 200
"""Stage rows in a phase's table; past it the largest are shown (with their parents) and one row says how
many are folded, so that a run of 10,000 stages gives a page a browser opens."""


def shown_stages(phase: PhaseSummary, limit: int = MAX_TABLE_ROWS) -> tuple[list[str], int, float]:
    """The paths of the rows shown, in the report's order: all, or the ``limit`` largest by total time with
    their parents; and how many were left out, and their total seconds (the fold row)."""
    paths = list(phase.stages)
    if len(paths) <= limit:
        return paths, 0, 0.0
    chosen: set[str] = set()
    for path in sorted(paths, key=lambda p: -phase.stages[p].total_ns):
        needed = [path] + [path.rsplit("/", k)[0] for k in range(1, path.count("/") + 1)]
        new = [p for p in needed if p not in chosen]
        if len(chosen) + len(new) > limit:
            break
        chosen.update(new)
    left_out = [p for p in paths if p not in chosen]
    return [p for p in paths if p in chosen], len(left_out), sum(phase.stages[p].total for p in left_out)


def _phase(phase: PhaseSummary) -> str:
    throughput = rates(phase.throughput)
    rows = []
    paths, folded, folded_s = shown_stages(phase)
    for path in paths:
        stage = phase.stages[path]
        one_off = path.split("/", 1)[0] in ONE_OFF
        share = phase.share(path)
        marker = " [w]" if stage.in_workers else ""
        rows.append(
            f'<tr class="{"oneoff" if one_off else "stage"}" data-path="{escape(path)}">'
            f"<td>{'&nbsp;&nbsp;' * path.count('/')}{escape(path.rsplit('/', 1)[-1] + marker)}</td>"
            f"<td>{stage.calls}</td><td>{stage.total:.4f}</td><td>{_cell(stage.mean)}</td>"
            f"<td>{_cell(stage.std)}</td><td>{_cell(stage.p50)}</td><td>{_cell(stage.p90)}</td>"
            f"<td>{_cell(stage.p99)}</td><td>{_cell(share, 100, 1)}</td></tr>"
        )
    if folded:
        rows.append(
            f'<tr class="folded"><td>{folded:,} smaller stages, folded</td><td></td><td>{folded_s:.4f}</td>'
            '<td colspan="6">the largest are shown above with their parents; stepwatch report lists them all</td></tr>'
        )
    table = (
        f'<table class="stages" data-phase="{escape(phase.name)}"><tr><th>stage</th><th>calls</th><th>total s</th>'
        "<th>ms/call</th><th>± std</th><th>p50 ms</th><th>p90 ms</th><th>p99 ms</th><th>% time</th></tr>"
        + "".join(rows)
        + "</table>"
    )
    heading = f"{phase.name} · {phase.steps} steps · {phase.measured:.3f} s measured"
    heading += f" · {throughput}" if throughput else ""
    note = (
        '<p class="note">[w] rows ran inside DataLoader workers, beside the main process: their % time is a share'
        " of the workers' busy time, not of the loop.</p>"
        if any(stage.in_workers for stage in phase.stages.values())
        else ""
    )
    return f"<h2>{escape(heading)}</h2>{table}{note}{_workers(phase)}"


def _workers(phase: PhaseSummary) -> str:
    if not phase.workers:
        return ""
    rows = "".join(
        f'<tr data-worker="{worker_id}"><td>worker {worker_id}</td><td>{worker.batches}</td>'
        f"<td>{_cell(worker.busy_per_batch)}</td><td>{_cell(worker.wait_per_batch)}</td>"
        f"<td>{_cell(worker.utilization, 100, 1)}</td><td>{_cell(worker.cpu_share, 100, 1)}</td>"
        f"<td>{_cell(worker.queued_share, 100, 1)}</td></tr>"
        for worker_id, worker in phase.workers.items()
    )
    return (
        f'<table class="workers" data-phase="{escape(phase.name)}"><tr><th>DataLoader worker</th><th>batches</th>'
        f"<th>busy ms/batch</th><th>wait ms/batch</th><th>% busy</th><th>% of busy on CPU</th>"
        f"<th>% of busy waiting for a core</th></tr>{rows}</table>"
    )


def _ranks(job: AllRanks) -> str:
    report = job.report()
    spread = "".join(
        f'<tr data-path="{escape(s.path)}"><td>{escape(s.path)}</td><td>{_cell(s.median)}</td>'
        f"<td>{_cell(s.low[0])}</td><td>{s.low[1]}</td><td>{_cell(s.high[0])}</td><td>{s.high[1]}</td>"
        f"<td>{'-' if math.isnan(s.ratio) else f'{s.ratio:.2f}'}</td>"
        f"<td>{'equalized by collectives' if s.equalized else ''}</td></tr>"
        for s in report.stages
    )
    ranks = "".join(
        f'<tr data-rank="{r.rank}"><td>{r.rank}</td><td>{r.steps}</td><td>{_cell(r.step_s)}</td>'
        f"<td>{_cell(r.loader_share, 100, 1)}</td>"
        f"<td>{escape(rates(r.throughput) or '-')}</td></tr>"
        for r in report.ranks
    )
    straggler = report.straggler
    verdict = straggler_verdict(report)
    persistence = windows_verdict(report)
    windows = f"<p>{escape(persistence)}</p>" if persistence else ""
    missing = f"<p>{escape(missing_line(job.missing))}</p>" if job.missing else ""
    job_rate = rates(report.job_throughput) or "no counts"
    return (
        f"<h2>all ranks · {escape(report.phase)} · {len(report.ranks)} of {job.world_size} ranks</h2>"
        f'<div class="verdict{" ok" if straggler is None else ""}"><p><strong>{escape(verdict)}</strong></p>'
        f"{windows}</div>"
        '<table class="spread"><tr><th>stage (ms per step)</th><th>median</th><th>min</th><th>rank</th><th>max</th>'
        f"<th>rank</th><th>max/median</th><th></th></tr>{spread}</table>"
        '<table class="ranks"><tr><th>rank</th><th>steps</th><th>step ms</th><th>loader %</th><th>throughput</th></tr>'
        f"{ranks}</table><p>job: {escape(job_rate)} (sum over ranks)</p>{missing}"
    )


def _plots(run: Summary | AllRanks) -> str:
    from . import plot as _plot

    try:
        picture = _plot.svg(_plot.run_figure(run))
    except ImportError:
        return "<p><em>No plots: they need matplotlib (pip install 'stepwatch[plot]').</em></p>"
    return f'<h2>plots</h2><figure class="plots">{picture}</figure>'
