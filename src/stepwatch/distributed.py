"""Many ranks: which rank of a ``torch.distributed`` job this process is, and the run file of its own.

The rank, local rank and world size come from ``torch.distributed`` when the program has initialized it (torch
is never imported here: only looked up among the loaded modules), else from the ``RANK``, ``LOCAL_RANK`` and
``WORLD_SIZE`` variables that ``torchrun`` and most launchers set. In a job of more than one rank, each rank's
run file gets its own name, so that ranks never write over one another's file.
"""

from __future__ import annotations

import os
import sys
from typing import Any

RANK_FIELD = "{rank}"
"""Placed in ``out`` or ``STEPWATCH_OUT`` (``runs/ddp.{rank}.json``), it is replaced by the rank."""


def rank_info() -> dict[str, int] | None:
    """``{"rank", "local_rank", "world_size"}`` of this process, or None outside a distributed job."""
    dist: Any = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            rank, world = int(dist.get_rank()), int(dist.get_world_size())
            local = _env_int("LOCAL_RANK")
            return {"rank": rank, "local_rank": rank if local is None else local, "world_size": world}
    except Exception:  # a process group being torn down: the environment still tells
        pass
    env_rank, env_world = _env_int("RANK"), _env_int("WORLD_SIZE")
    if env_rank is None or env_world is None:
        return None
    local = _env_int("LOCAL_RANK")
    return {"rank": env_rank, "local_rank": env_rank if local is None else local, "world_size": env_world}


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


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    try:
        value = int(raw) if raw else None
    except ValueError:
        return None
    return value if value is None or value >= 0 else None
