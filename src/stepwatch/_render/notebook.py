"""What a notebook shows for a run, the ranks of a job and a comparison: the HTML report's tables and verdict
(no plots), as one self-contained fragment whose style applies to it alone; and their text reports. The
package registers these with ``_display`` when it is imported."""

from __future__ import annotations

import re
from html import escape
from typing import TYPE_CHECKING

from .._analysis import Comparison
from .html import STYLE, content
from .text import format_ms, format_rate, render_comparison, render_ranks_comparison, render_text

__all__ = ["compared_html", "compared_text", "ranks_html", "render_text", "summary_html"]

if TYPE_CHECKING:
    from .._all_ranks import AllRanks
    from .._compared import Compared
    from .._summary import Summary


def _scoped(style: str) -> str:
    """``STYLE`` with every rule limited to the fragment (``.stepwatch``); the page's ``body`` rule is the
    fragment's own, on a light background of its own so that a dark notebook theme keeps it readable."""
    rules = []
    for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", style):
        scoped = []
        for selector in selectors.split(","):
            selector = selector.strip()
            scoped.append(".stepwatch" if selector == "body" else f".stepwatch {selector}")
        if selectors.strip() == "body":
            body = "font: 13px/1.45 system-ui, -apple-system, 'Segoe UI', sans-serif; color: #222; background: #fff;"
            body += " padding: 0.2em 1em 0.6em; max-width: 1200px;"
        rules.append(f"{', '.join(scoped)} {{{body.strip()}}}")
    return "\n".join(rules)


SCOPED_STYLE = _scoped(STYLE)


def fragment(parts: list[str]) -> str:
    return f'<div class="stepwatch"><style>{SCOPED_STYLE}</style>' + "\n".join(parts) + "</div>"


def summary_html(summary: Summary) -> str:
    return fragment(content(summary, "run"))


def ranks_html(job: AllRanks) -> str:
    return fragment(content(job, "all ranks"))


def compared_text(compared: Compared) -> str:
    before, after = compared.names
    if compared.jobs:
        return "\n".join(render_ranks_comparison(job, before, after) for job in compared.jobs)
    return "\n".join(render_comparison(comparison, before, after) for comparison in compared.phases)


def compared_html(compared: Compared) -> str:
    before, after = compared.names
    parts = [f"<h1>stepwatch compare · {escape(before)} → {escape(after)}</h1>"]
    jobs = compared.jobs or (None,) * len(compared.phases)
    for comparison, job in zip(compared.phases, jobs, strict=True):
        parts.append(_verdicts(comparison))
        parts.append(_changes(comparison, before, after))
        if job is not None:
            rows = "".join(
                f'<tr data-rank="{rank}"><td>{rank}</td><td>{_cell(b)}</td><td>{_cell(a)}</td>'
                f"<td>{_percent(b, a)}</td></tr>"
                for rank, b, a in job.ranks
            )
            parts.append(
                f'<table class="ranks"><tr><th>rank</th><th>{escape(before)} ms/step</th>'
                f"<th>{escape(after)} ms/step</th><th>change %</th></tr>{rows}</table>"
            )
            for label, straggler in zip((before, after), job.stragglers, strict=True):
                named = "none" if straggler is None else f"rank {straggler.rank}, {straggler.stage}"
                parts.append(f"<p>straggler in {escape(label)}: {escape(named)}</p>")
    return fragment(parts)


def _verdicts(comparison: Comparison) -> str:
    if comparison.verdicts is None:
        return ""
    first, second = comparison.verdicts
    same = first.label == second.label
    headline = f"{second.label} in both" if same else f"{first.label} → {second.label}"
    ok = "verdict ok" if second.kind in ("compute-bound", "balanced") else "verdict"
    return (
        f'<div class="{ok}"><p><strong>verdict: {escape(headline)}</strong></p><ul>'
        f"<li>before: {escape(first.headline)}</li><li>after: {escape(second.headline)}</li></ul></div>"
    )


def _changes(comparison: Comparison, before: str, after: str) -> str:
    rows = []
    for change in (comparison.step, *comparison.stages):
        depth = change.path.count("/") if change is not comparison.step else 0
        name = change.path.rsplit("/", 1)[-1] if depth else change.path
        note = f"only {before}" if change.after is None else f"only {after}" if change.before is None else ""
        delta = "-" if change.delta is None else f"{change.delta * 1e3:+.3f}"
        rows.append(
            f'<tr data-path="{escape(change.path)}"><td>{"&nbsp;&nbsp;" * depth}{escape(name)}</td>'
            f"<td>{_cell(change.before)}</td><td>{_cell(change.after)}</td><td>{delta}</td>"
            f"<td>{_percent(change.before, change.after)}</td><td>{escape(note)}</td></tr>"
        )
    throughput = "".join(
        f"<p>{escape(unit)}/s: {format_rate(b) if b else '-'} → {format_rate(a) if a else '-'}"
        f"{f' ({(a / b - 1) * 100:+.1f}%)' if a and b else ''}</p>"
        for unit, (b, a) in comparison.throughput.items()
    )
    return (
        f"<h2>phase {escape(comparison.phase)} · per call</h2>"
        f'<table class="comparison" data-phase="{escape(comparison.phase)}"><tr><th>stage</th>'
        f"<th>{escape(before)} ms</th><th>{escape(after)} ms</th><th>change ms</th><th>change %</th><th></th></tr>"
        + "".join(rows)
        + f"</table>{throughput}"
    )


def _cell(seconds: float | None) -> str:
    return "-" if seconds is None else format_ms(seconds)


def _percent(before: float | None, after: float | None) -> str:
    return f"{(after / before - 1) * 100:+.1f}%" if before and after is not None else "-"
