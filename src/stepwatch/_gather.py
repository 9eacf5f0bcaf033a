"""The gather: every rank's summary brought to rank 0 through the job's own ``torch.distributed`` store.

It uses the key-value store the job's process group was built on rather than a collective on the group: each
rank posts its summary and goes on without waiting, and rank 0 waits for the others with a deadline. A dead or
hung rank therefore costs rank 0 at most the timeout and a warning, never a hang, on every backend (a collective
left unfinished on NCCL makes its watchdog abort the training), and the gather still works after the program
called ``destroy_process_group`` (the store is kept from when the group was up, by ``_job``).
"""

from __future__ import annotations

import json
import logging
import os
import time
import zlib
from collections.abc import Mapping
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ._all_ranks import AllRanks
from ._job import current_job, rank_info, store_key
from ._summary import Summary

if TYPE_CHECKING:
    from ._figures import StageStats

logger = logging.getLogger("stepwatch")

GATHER_TIMEOUT = 30.0
"""Seconds rank 0 waits in all for the other ranks' summaries (``STEPWATCH_GATHER_TIMEOUT`` replaces it)."""
MAX_GATHER_TIMEOUT = 86_400.0
"""The longest rank 0 waits for the others, in seconds (a day): longer is a hang, and the store's own clock
overflows far before ``1e15``."""

_gathers = 0


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
    job = current_job()
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
            store.set(store_key("run", name, rank), _encode(summary, windows))
        except Exception as error:
            logger.warning("stepwatch: rank %d could not send its summary to rank 0: %s", rank, error)
        return None
    deadline = time.monotonic() + (gather_timeout() if timeout is None else timeout)
    expected = range(1, world) if among is None else [r for r in range(1, world) if _present(store, among, r)]
    runs: dict[int, Summary] = {0: summary}
    missing: list[int] = []
    keys = {other: store_key("run", name, other) for other in expected}
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
    return _has(store, store_key("present", name, rank))


def _has(store: Any, key: str) -> bool:
    try:
        return bool(store.check([key]))
    except Exception:
        return False


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
    try:
        return Summary.from_dict(json.loads(zlib.decompress(payload).decode("utf-8")))
    except Exception as error:
        raise ValueError(f"sent a summary that cannot be read ({error})") from None
