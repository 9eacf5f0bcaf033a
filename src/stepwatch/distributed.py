"""Many ranks: which rank of a ``torch.distributed`` job this process is, its own run file, and the gather.

The rank, local rank and world size come from ``torch.distributed`` when the program has initialized it (torch
is never imported here: only looked up among the loaded modules), else from the ``RANK``, ``LOCAL_RANK`` and
``WORLD_SIZE`` variables that ``torchrun`` and most launchers set. In a job of more than one rank, each rank's
run file gets its own name, so that ranks never write over one another's file.

The gather brings every rank's summary to rank 0 through the job's own ``torch.distributed`` store (the
key-value store its process group was built on) rather than a collective on the group: each rank posts its
summary and goes on without waiting, and rank 0 waits for the others with a deadline. A dead or hung rank
therefore costs rank 0 at most the timeout and a warning, never a hang, on every backend (a collective left
unfinished on NCCL makes its watchdog abort the training), and the gather still works after the program
called ``destroy_process_group`` (the store is kept from when the group was up).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ._schema import MAX_RANKS

if TYPE_CHECKING:
    from ._ranks import RanksReport
    from ._summary import StageStats, Summary

logger = logging.getLogger("stepwatch")

RANK_FIELD = "{rank}"
"""Placed in ``out`` or ``STEPWATCH_OUT`` (``runs/ddp.{rank}.json``), it is replaced by the rank."""
GATHER_TIMEOUT = 30.0
"""Seconds rank 0 waits in all for the other ranks' summaries (``STEPWATCH_GATHER_TIMEOUT`` replaces it)."""
_PREFIX = "stepwatch"
MAX_GATHER_TIMEOUT = 86_400.0
"""The longest rank 0 waits for the others, in seconds (a day): longer is a hang, and the store's own clock
overflows far before ``1e15``."""


def missing_line(missing: Sequence[int]) -> str:
    """The line naming the ranks of a job that did not answer the gather."""
    return (
        f"missing: rank {', '.join(map(str, missing))}: no answer in time, or not among the files given (a rank's"
        " own run file, if it wrote one, has its figures)"
    )


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
            text += missing_line(self.missing) + "\n"
        return text

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the all-ranks file that ``stepwatch report`` and ``stepwatch compare`` read."""
        from ._saved import save_ranks

        save_ranks(list(self.runs), path, self.world_size, self.missing)


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


def is_rank_zero() -> bool:
    """Whether this process reports for its job: rank 0, or a process outside a job of several ranks."""
    info = rank_info()
    return info is None or info["world_size"] <= 1 or info["rank"] == 0


@dataclass
class _Job:
    pid: int
    info: dict[str, int]
    store: Any
    announced: set[str]


_job: _Job | None = None
_gathers = 0


def rank_info() -> dict[str, int] | None:
    """``{"rank", "local_rank", "world_size"}`` of this process, or None outside a distributed job. After
    ``destroy_process_group`` the job seen while the group was up still tells."""
    dist: Any = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            rank, world = int(dist.get_rank()), int(dist.get_world_size())
            local = _env_int("LOCAL_RANK")
            info = {"rank": rank, "local_rank": rank if local is None else local, "world_size": world}
            _remember(dist, info)
            return info
    except Exception:  # a process group being torn down: what was seen, or the environment, still tells
        pass
    if _job is not None and _job.pid == os.getpid():
        return dict(_job.info)
    env_rank, env_world = _env_int("RANK"), _env_int("WORLD_SIZE")
    if env_rank is None or env_world is None or env_rank >= env_world:
        return None
    local = _env_int("LOCAL_RANK")
    return {"rank": env_rank, "local_rank": env_rank if local is None else local, "world_size": env_world}


def _remember(dist: Any, info: dict[str, int]) -> None:
    """Keeps the job and its store, so that the gather at exit works after ``destroy_process_group``."""
    global _job
    if _job is not None and _job.pid == os.getpid() and _job.info == info:
        return
    store = None
    if info["world_size"] > 1:
        try:
            store = dist.distributed_c10d._get_default_store()
        except Exception as error:  # an older or unusual torch: each rank keeps its own file
            logger.warning("stepwatch: no gather of the ranks (the job's store cannot be read: %s)", error)
    _job = _Job(os.getpid(), info, store, set())


def rank_path(path: str | os.PathLike[str], info: dict[str, int] | None = None) -> str:
    """This rank's run file: ``{rank}`` in ``path`` replaced by the rank (0 outside a job), else, in a job of
    more than one rank, ``.rank<N>`` put before the extension (``runs/ddp.json`` -> ``runs/ddp.rank3.json``)."""
    path = os.fspath(path)
    info = rank_info() if info is None else info
    if RANK_FIELD in path:
        return path.replace(RANK_FIELD, str(info["rank"] if info else 0))
    if info is None or info["world_size"] <= 1:
        return path
    root, extension = os.path.splitext(path)
    return f"{root}.rank{info['rank']}{extension}"


def all_ranks_path(path: str | os.PathLike[str]) -> str:
    """Where rank 0 writes the all-ranks file: ``path`` itself (``runs/ddp.json``, beside the ranks'
    ``runs/ddp.rank<N>.json``), or with ``{rank}`` replaced by ``all``."""
    return os.fspath(path).replace(RANK_FIELD, "all")


def in_job() -> bool:
    """Whether this process is one rank of a job of several that the gather can reach."""
    info = rank_info()
    return info is not None and info["world_size"] > 1 and _job is not None and _job.store is not None


def seen_by(out: str | None) -> None:
    """Called as a training loop starts: keeps the job (rank, store) while its process group is up, for the
    gather at the end, and announces ``out``, when given."""
    rank_info()
    if out is not None:
        announce(out)


def announce(out: str) -> None:
    """Tells rank 0, once per run file, that this rank records into ``out`` and will post its summary at exit:
    rank 0 waits at exit only for the ranks that announced (a rank that records nothing is not waited for)."""
    if not in_job() or _job is None or out in _job.announced:
        return
    _job.announced.add(out)
    try:
        _job.store.set(_key("present", out, _job.info["rank"]), b"1")
    except Exception as error:
        logger.warning("stepwatch: rank %d cannot reach the job's store: %s", _job.info["rank"], error)


def gather(
    summary: Summary,
    *,
    timeout: float | None = None,
    tag: str | None = None,
    among: str | None = None,
    windows: bool = False,
) -> AllRanks | None:
    """Brings every rank's ``summary`` to rank 0: rank 0 gets :class:`AllRanks`, the other ranks None (at once:
    they post theirs and go on). Call it on every rank, as a collective. Outside a job of several ranks, the
    one summary. Rank 0 waits ``timeout`` seconds in all (default :data:`GATHER_TIMEOUT`); the ranks that did
    not answer by then are warned about and listed in ``missing``. ``tag`` names the gather (the same on every
    rank; default: a count of the gathers). With ``among``, only the ranks that announced it
    (:func:`announce`) are waited for: the gather at exit, which a rank that records nothing never reaches.
    ``windows`` also sends each stage's recent measurements (for per-rank percentiles) and the timeline of
    recent steps when kept, which the figures of the all-ranks report do not need."""
    global _gathers
    if timeout is not None and not (
        isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and 0 <= timeout <= MAX_GATHER_TIMEOUT
    ):
        raise ValueError(f"timeout must be a number of seconds from 0 to {MAX_GATHER_TIMEOUT:g}, got {timeout!r}")
    info = rank_info()
    if info is None or info["world_size"] <= 1:
        return AllRanks((summary,), 1)
    job = _job
    rank, world = info["rank"], info["world_size"]
    if job is None or job.store is None:
        logger.warning("stepwatch: rank %d cannot gather (no store of the job): its own file is all there is", rank)
        return None if rank else AllRanks((summary,), world, tuple(range(1, world)))
    if tag is None:
        _gathers += 1
        name = f"gather{_gathers}"
    else:
        name = tag
    store = job.store
    if rank != 0:
        try:
            store.set(_key("run", name, rank), _encode(summary, windows))
        except Exception as error:
            logger.warning("stepwatch: rank %d could not send its summary to rank 0: %s", rank, error)
        return None
    deadline = time.monotonic() + (gather_timeout() if timeout is None else timeout)
    expected = range(1, world) if among is None else [r for r in range(1, world) if _present(store, among, r)]
    runs: dict[int, Summary] = {0: summary}
    missing: list[int] = []
    keys = {other: _key("run", name, other) for other in expected}
    try:  # one wait for them all; only when it times out is each rank looked at
        store.wait(list(keys.values()), timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
    except Exception:
        for other, key in list(keys.items()):
            if not _has(store, key):
                missing.append(other)
                del keys[other]
                logger.warning(
                    "stepwatch: rank %d did not answer within %g s; the all-ranks report has the others, its own"
                    " run file has its figures",
                    other,
                    gather_timeout() if timeout is None else timeout,
                )
    for other, key in keys.items():
        try:
            runs[other] = _decode(store.get(key))
            store.delete_key(key)
        except Exception as error:
            missing.append(other)
            logger.warning("stepwatch: rank %d %s", other, error)
    return AllRanks(tuple(runs[r] for r in sorted(runs)), world, tuple(sorted(missing)))


def gather_timeout() -> float:
    """``STEPWATCH_GATHER_TIMEOUT``, else :data:`GATHER_TIMEOUT`; a value that is not a number of seconds is
    warned about and replaced by the default (it is read at the end of a run, which it must not break)."""
    raw = os.environ.get("STEPWATCH_GATHER_TIMEOUT", "").strip()
    try:
        value = float(raw) if raw else GATHER_TIMEOUT
    except ValueError:
        value = -1.0
    if 0 <= value <= MAX_GATHER_TIMEOUT:
        return value
    if MAX_GATHER_TIMEOUT < value < float("inf") or value == float("inf"):
        logger.warning(
            "stepwatch: STEPWATCH_GATHER_TIMEOUT=%r is more than a day; waiting at most %g s", raw, MAX_GATHER_TIMEOUT
        )
        return MAX_GATHER_TIMEOUT
    logger.warning("stepwatch: STEPWATCH_GATHER_TIMEOUT=%r is not a number of seconds; using %g", raw, GATHER_TIMEOUT)
    return GATHER_TIMEOUT


def _present(store: Any, name: str, rank: int) -> bool:
    return _has(store, _key("present", name, rank))


def _has(store: Any, key: str) -> bool:
    try:
        return bool(store.check([key]))
    except Exception:
        return False


def _key(kind: str, name: str, rank: int) -> str:
    return f"{_PREFIX}/{kind}/{name}/{rank}"


def _encode(summary: Summary, windows: bool) -> bytes:
    """The summary's exact integer statistics as compressed JSON, without the recent measurements unless
    ``windows``: a kilobyte or two per rank."""
    if not windows:  # nor the timeline's events: per-rank files keep them (stepwatch merge gathers them)
        phases = summary.phases
        summary = replace(
            summary,
            phases={name: replace(p, stages=_without_windows(p.stages)) for name, p in phases.items()},
            trace=(),
        )
    data = summary.to_dict()
    for phase in data["phases"].values():
        for stage in phase["stages"].values():
            stage.pop("seconds", None)  # figures for people, derived from the integers sent
            if stage.get("device") is not None:
                stage["device"].pop("seconds", None)
    return zlib.compress(json.dumps(data, separators=(",", ":"), allow_nan=False).encode("utf-8"))


def _without_windows(stages: Mapping[str, StageStats]) -> dict[str, StageStats]:
    return {
        path: replace(
            stage,
            recent_ns=(),
            device=None if stage.device is None else replace(stage.device, recent_ns=()),
        )
        for path, stage in stages.items()
    }


def _decode(payload: bytes) -> Summary:
    from ._summary import Summary

    try:
        return Summary.from_dict(json.loads(zlib.decompress(payload).decode("utf-8")))
    except Exception as error:
        raise ValueError(f"sent a summary that cannot be read ({error})") from None


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    try:
        value = int(raw) if raw else None
    except ValueError:
        return None
    return value if value is None or 0 <= value <= MAX_RANKS else None  # else not understood: not a rank
