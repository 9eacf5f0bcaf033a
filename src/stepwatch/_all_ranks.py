"""A job's ranks as one value (:class:`AllRanks`), put together from files (:func:`combine_jobs`) or read from an
all-ranks file, and a rank's report at the end of a run (:func:`end_report`)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import _display
from ._job import all_ranks_path
from ._run_file import SCHEMA, FormatError, parse_summary, read_document, save_ranks

if TYPE_CHECKING:
    from ._ranks import RanksReport
    from ._summary import Summary


@dataclass(frozen=True)
class AllRanks:
    """The summaries of a job's ranks, gathered onto rank 0 (or read from per-rank files): one per rank that
    answered, by rank, and the ranks that did not answer in time."""

    runs: tuple[Summary, ...]
    world_size: int
    missing: tuple[int, ...] = ()

    def report(self, phase: str | None = None) -> RanksReport:
        """The all-ranks figures and the straggler verdict of ``phase`` (default: the main phase)."""
        from ._ranks import ranks_report

        return ranks_report(self.runs, phase)

    def render(self, phase: str | None = None) -> str:
        """The all-ranks report as text, with the ranks that did not answer named."""
        from ._render import render_ranks

        try:
            text = render_ranks(self.report(phase), self.world_size)
        except ValueError as error:  # no rank measured a step of the phase
            text = f"stepwatch · all ranks: {error}\n"
        if self.missing:
            from ._render import missing_line

            text += missing_line(self.missing) + "\n"
        return text

    def _repr_html_(self) -> str:
        """A notebook shows the all-ranks tables, the straggler verdict and rank 0's report (no plots)."""
        return _display.html_of(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        _display.pretty(self, printer, cycle)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the all-ranks file that ``stepwatch report`` and ``stepwatch compare`` read."""
        save_ranks(list(self.runs), path, self.world_size, self.missing)


def combine_jobs(named: Sequence[tuple[str, AllRanks]]) -> AllRanks:
    """The ranks of one job from its files (per-rank run files, all-ranks files, or both), ordered by rank,
    with the job's world size and the ranks none of them holds as missing. Raises ValueError, naming the
    files, for a run without a rank among several, two runs of one rank, a rank outside the world, or files
    of different jobs (their sizes, or their launcher's job ids, differ)."""
    runs: dict[int, tuple[str, Summary]] = {}
    worlds: dict[int, str] = {}
    job_ids: dict[str, str] = {}  # a launcher's job id -> the first file of it
    missing: set[int] = set()
    several = sum(len(job.runs) for _, job in named) > 1
    for path, job in named:
        whole = len(job.runs) > 1 or bool(job.missing)  # an all-ranks file: its world size is the job's
        if whole:
            worlds.setdefault(job.world_size, path)
        missing.update(job.missing)
        for run in job.runs:
            rank, world = run.metadata.get("rank"), None if whole else run.metadata.get("world_size")
            if type(rank) is not int:
                if several:
                    raise ValueError(f"{path} holds a run of no rank (not from a job): give the ranks' own files")
                rank = 0
            if type(world) is int:
                worlds.setdefault(world, path)
            job_id = run.metadata.get("job")
            if isinstance(job_id, str):
                job_ids.setdefault(job_id, path)
            if rank in runs:
                raise ValueError(f"two runs are rank {rank} ({runs[rank][0]} and {path}): give one run per rank")
            runs[rank] = (path, run)
    if len(job_ids) > 1:
        (_, first), (_, second) = list(job_ids.items())[:2]
        raise ValueError(f"{first} and {second} are runs of different jobs (torchrun ids): give the files of one job")
    if len(worlds) > 1:
        (a, first), (b, second) = list(worlds.items())[:2]
        raise ValueError(f"{first} is of a job of {a} ranks, {second} of {b}: give the files of one job")
    world = next(iter(worlds), max(runs) + 1)
    outside = [rank for rank in runs if rank >= world]
    if outside:
        raise ValueError(f"{runs[outside[0]][0]} holds rank {outside[0]} of a job of {world} ranks")
    if several:  # the job's ranks that none of the files holds
        missing |= set(range(world))
    missing -= set(runs)
    return AllRanks(tuple(runs[rank][1] for rank in sorted(runs)), world, tuple(sorted(missing)))


def end_report(
    text: str, written: str, gathered: AllRanks | None, out: str | os.PathLike[str], replaced: bool = False
) -> str:
    """A rank's report at the end of a run, followed, on rank 0 of a job of several ranks, by the all-ranks
    report, and the file to read it again from (``replaced``: it held an earlier run, now overwritten)."""
    if gathered is not None and gathered.world_size > 1:
        text += "\n" + gathered.render()
        written = all_ranks_path(out)
    note = " (it replaced the run saved there before)" if replaced else ""
    return text + f"stepwatch: run saved to {os.path.relpath(written)}{note}\n"


def load(path: str | os.PathLike[str]) -> Summary | AllRanks:
    """``stepwatch.load``: what ``save`` wrote: a saved run as a :class:`Summary`, an all-ranks file (``save(...,
    ranks="all")``, ``stepwatch merge``) as :class:`~stepwatch.distributed.AllRanks`. Errors as
    :func:`load_summary`'s."""
    raw, document = read_document(path)
    return parse_summary(raw, path) if document is None else _ranks_of(document, path)


def load_ranks(path: str | os.PathLike[str]) -> AllRanks:
    """Reads an all-ranks file (or one saved run, as a job of its own); errors as :func:`load_summary`'s."""
    raw, document = read_document(path)
    if document is None:
        return AllRanks((parse_summary(raw, path),), 1)
    return _ranks_of(document, path)


def load_runs(path: str | os.PathLike[str]) -> list[Summary]:
    """Reads a saved run, or the runs of an all-ranks file; errors as :func:`load_summary`'s."""
    return list(load_ranks(path).runs)


def _ranks_of(document: dict[str, Any], path: str | os.PathLike[str]) -> AllRanks:
    """The runs of an all-ranks file's document, each checked as a saved run is."""
    schema = document.get("schema")
    if isinstance(schema, bool) or not isinstance(schema, int) or not 1 <= schema <= SCHEMA:
        raise FormatError(path, f"corrupt all-ranks file: schema {schema!r} is not one this stepwatch reads")
    ranks = document.get("ranks")
    if not isinstance(ranks, list) or not ranks:
        raise FormatError(path, 'corrupt all-ranks file: "ranks" must be a non-empty list of runs')
    runs = []
    for index, run in enumerate(ranks):
        try:
            text = json.dumps(run).encode("utf-8")
        except (TypeError, ValueError, RecursionError):
            raise FormatError(path, f"corrupt all-ranks file: run {index} cannot be read") from None
        runs.append(parse_summary(text, f"{os.fspath(path)} (run {index})"))
    missing = document.get("missing", [])
    if not isinstance(missing, list) or not all(type(rank) is int and rank >= 0 for rank in missing):
        raise FormatError(path, 'corrupt all-ranks file: "missing" must be a list of ranks')
    world = document.get("world_size", len(runs) + len(missing))
    if type(world) is not int or world < len(runs) + len(missing):
        raise FormatError(path, f"corrupt all-ranks file: world_size {world!r} is fewer than its ranks")
    return AllRanks(tuple(runs), world, tuple(missing))
