"""One row per measurement, one column per stage: the recent windows as TSV or CSV, for pandas or a
spreadsheet."""

from __future__ import annotations

import csv
import io
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._summary import Summary


def _measurement_rows(summary: Summary) -> list[list[str]]:
    """A header of ``phase:stage`` paths, then a row per measurement (the k-th most recent kept of each stage,
    oldest first), durations in seconds; empty where a stage has fewer measurements."""
    columns: list[tuple[str, tuple[int, ...]]] = []
    for phase in summary.phases.values():
        columns.extend(
            (f"{phase.name}:{stage.path}", stage.recent_ns) for stage in phase.stages.values() if stage.spread
        )
    length = max((len(values) for _, values in columns), default=0)
    rows = [[name for name, _ in columns]]
    for index in range(length):
        rows.append([f"{values[index] * 1e-9:.9f}" if index < len(values) else "" for _, values in columns])
    return rows


def render_tsv(summary: Summary) -> str:
    """Per-measurement export, tab-separated (see :func:`_measurement_rows`)."""
    return "\n".join("\t".join(row) for row in _measurement_rows(summary)) + "\n"


def render_csv(summary: Summary) -> str:
    """Per-measurement export as CSV (RFC 4180 quoting), the same rows and columns as the TSV."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(_measurement_rows(summary))
    return buffer.getvalue()
