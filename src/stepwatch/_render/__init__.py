"""Renderers: turn a :class:`Summary` into text for people or files for tools, one module per format (``text``,
``table`` for TSV and CSV, ``html``, ``trace``, and ``plot`` for matplotlib's pictures). They read the summary
only.

``FORMATS`` is the one registry of output formats; the CLI's ``--format`` and the guess from a file's
extension both use it. The page, the trace and the pictures are imported when first used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .table import render_csv, render_tsv
from .text import (
    missing_line,
    rates,
    render_comparison,
    render_ranks,
    render_ranks_comparison,
    render_text,
    render_verdict,
    straggler_verdict,
)

if TYPE_CHECKING:
    from .._all_ranks import AllRanks
    from .._summary import Summary

__all__ = [
    "FORMATS",
    "Format",
    "format_for_path",
    "missing_line",
    "rates",
    "render_comparison",
    "render_csv",
    "render_ranks",
    "render_ranks_comparison",
    "render_text",
    "render_tsv",
    "render_verdict",
    "straggler_verdict",
]


def render_json(summary: Summary) -> str:
    from .._run_file import summary_to_json

    return summary_to_json(summary) + "\n"


@dataclass(frozen=True)
class Format:
    name: str
    render: Callable[[Summary], str]
    extensions: tuple[str, ...]
    description: str
    render_ranks: Callable[[AllRanks], str] | None = None
    """For the formats that also show a job's ranks (an all-ranks file)."""


def render_html(summary: Summary) -> str:
    from .html import render_html as page

    return page(summary, "run")


def render_trace(summary: Summary) -> str:
    from .trace import render_trace as trace

    return trace(summary)


def render_trace_ranks(job: AllRanks) -> str:
    from .trace import render_trace_ranks as trace

    return trace(job)


def render_html_ranks(job: AllRanks) -> str:
    from .html import render_html as page

    return page(job, "all ranks")


FORMATS: dict[str, Format] = {
    format.name: format
    for format in (
        Format("text", render_text, (".txt",), "the report table"),
        Format("tsv", render_tsv, (".tsv",), "one row per measurement, one column per stage"),
        Format("csv", render_csv, (".csv",), "the same as tsv, comma-separated"),
        Format(
            "trace",
            render_trace,
            ("trace.json", "trace.json.gz"),
            "Chrome / Perfetto trace of the recent steps (Stopwatch(trace_steps=N))",
            render_trace_ranks,
        ),
        Format("json", render_json, (".json",), "the saved-run file"),
        Format(
            "html", render_html, (".html", ".htm"), "one self-contained page: tables, verdict, plots", render_html_ranks
        ),
    )
}


def format_for_path(path: str) -> Format | None:
    """The format whose extension ``path`` ends with, if any (``.gz`` aside: any format can be compressed)."""
    lowered = path.lower().removesuffix(".gz")
    for format in FORMATS.values():
        if lowered.endswith(format.extensions):
            return format
    return None
