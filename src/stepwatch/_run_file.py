"""Saved runs: JSON with a schema version and metadata, written atomically, read back with clear errors."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from importlib import metadata as importlib_metadata
from typing import TYPE_CHECKING, Any

from . import _block_base, _default_instance
from ._dataloader.find import cores
from ._schema import check_run, printable
from ._self_cost import block_ns
from ._summary import Summary

if TYPE_CHECKING:
    from ._recorder import Stopwatch

FORMAT = "stepwatch"
RANKS_FORMAT = "stepwatch-ranks"
"""An all-ranks file: the runs of every rank of one job (``stepwatch merge``)."""
SCHEMA = 1


class FormatError(ValueError):
    """A file (or state_dict) that is not a readable stepwatch run: corrupt, truncated, empty, not JSON,
    foreign, or written by a newer stepwatch. ``str()`` names the file and the reason."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = os.fspath(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


@functools.cache
def package_version(name: str) -> str | None:
    """Installed version of a distribution, without importing it; read once a process (the version of what runs:
    parsing a package's metadata took ~0.5 ms, twice in every summary, ``metrics()``'s cost)."""
    try:
        return importlib_metadata.version(name)
    except importlib_metadata.PackageNotFoundError:
        return None


def detect_devices() -> list[str]:
    """Devices this process computes on: CUDA devices when torch has initialized CUDA, else the CPU.

    Never imports torch nor initializes CUDA itself.
    """
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_initialized():
        return [f"cuda:{i} {cuda.get_device_name(i)}" for i in range(cuda.device_count())]
    return [f"cpu {platform.machine()}".strip()]


def build_metadata(stopwatch: Stopwatch) -> dict[str, Any]:
    """The run's metadata; every string from outside stepwatch made printable (see ``_schema.printable``)."""
    started = stopwatch.span.started_wall
    schedule = stopwatch.schedule
    metadata: dict[str, Any] = {
        "stepwatch": package_version("stepwatch"),
        "python": platform.python_version(),
        "torch": package_version("torch"),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "cpu_count": cores(),
        "started_at": None if started is None else _iso(started),
        "devices": stopwatch.devices(),
        "config": {
            "warmup": schedule.warmup,
            "active": schedule.active,
            "every": schedule.every,
            "window": stopwatch.window,
            "device": None if stopwatch.device_timer is None else stopwatch.device_timer.backend.name,
            "sync": stopwatch.sync,
            "nvtx": stopwatch.nvtx,
            "memory": stopwatch.memory,
            "trace_steps": None if stopwatch.timeline is None else stopwatch.timeline.steps,
        },
        "device_error": None if stopwatch.device_timer is None else stopwatch.device_timer.error,
        "dropped_blocks": stopwatch.span.dropped_blocks,
        "loaders": {phase: dict(config) for phase, config in stopwatch.tree.loader_configs.items()},
        "auto": None if stopwatch.auto_hooks.describe is None else stopwatch.auto_hooks.describe(),
        "auto_in_c": None if stopwatch.auto_hooks.describe is None else _block_base.AutoCall is not None,
        "blocks_in_c": _block_base.COMPILED,
        "reads_in_c": _block_base.COMPILED and stopwatch is _default_instance.stopwatch,  # (single_process.py)
        "flops": _flops(stopwatch),
        "flops_note": None if stopwatch.flop_count is None else stopwatch.flop_count.skipped,
        "peak_flops": stopwatch.peak_flops,
        "block_ns": (stopwatch.in_situ.value if stopwatch.in_situ is not None else None) or block_ns(),
        "windows": list(stopwatch.windows.per_step),
        "compiles": [list(event) for event in stopwatch.compiles.events],
        **_ranks(),
    }
    metadata["job"] = _job_id() if metadata["rank"] is not None else None
    for key, value in metadata.items():
        if isinstance(value, str):
            metadata[key] = printable(value)
    metadata["devices"] = [printable(str(device)) for device in metadata["devices"]]
    return metadata


def _flops(stopwatch: Stopwatch) -> dict[str, dict[str, Any]]:
    """The FLOPs counted per phase (``_flops``), their texts made printable."""
    counted = {} if stopwatch.flop_count is None else stopwatch.flop_count.counted
    return {
        printable(phase): {key: printable(value) if isinstance(value, str) else value for key, value in record.items()}
        for phase, record in counted.items()
    }


def _ranks() -> dict[str, int | None]:
    from ._job import rank_info

    info = rank_info()
    return {"rank": None, "local_rank": None, "world_size": None} if info is None else dict(info)


def _job_id() -> str | None:
    """What tells this job's runs from another job's: torchrun's rendezvous id (``TORCHELASTIC_RUN_ID``, unique
    per job) with its store's address; None when the launcher gives neither (``mp.spawn``)."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "").strip()
    address = os.environ.get("MASTER_ADDR", "").strip()
    port = os.environ.get("MASTER_PORT", "").strip()
    parts = [
        part for part in (run_id if run_id and run_id != "none" else "", f"{address}:{port}" if port else "") if part
    ]
    return " ".join(parts)[:200] or None


def _iso(epoch_seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(epoch_seconds))


def summary_to_json(summary: Summary) -> str:
    from ._analysis import analyze

    document = {"format": FORMAT, "schema": SCHEMA, **summary.to_dict(), "verdict": analyze(summary).to_dict()}
    check_run(document)  # what is saved is what load reads: the same schema, checked before writing
    return json.dumps(document, indent=1, allow_nan=False)


def save_summary(summary: Summary, path: str | os.PathLike[str]) -> None:
    """Writes ``summary`` to ``path`` via a temporary file in the same folder and an atomic rename. The file
    gets the mode an ordinary ``open()`` would give it (the umask applied), an existing file keeps its mode,
    a symlink is written through to its target, and a missing folder is made."""
    _write(summary_to_json(summary), path)


def save_ranks(
    summaries: list[Summary], path: str | os.PathLike[str], world_size: int | None = None, missing: Sequence[int] = ()
) -> None:
    """Writes the runs of several ranks as one all-ranks file (the gather, ``stepwatch merge``), as
    :func:`save_summary` writes one run; ``missing``: the ranks of the job that did not answer."""
    _write(ranks_to_json(summaries, world_size, missing), path)


def ranks_to_json(summaries: Sequence[Summary], world_size: int | None = None, missing: Sequence[int] = ()) -> str:
    """The all-ranks file's text: each rank's run as saved, the job's world size and the ranks missing."""
    documents = [json.loads(summary_to_json(summary)) for summary in summaries]
    document = {
        "format": RANKS_FORMAT,
        "schema": SCHEMA,
        "world_size": len(summaries) + len(missing) if world_size is None else world_size,
        "missing": list(missing),
        "ranks": documents,
    }
    return json.dumps(document, indent=1)


def _write(text: str, path: str | os.PathLike[str]) -> None:
    write_atomically(text.encode("utf-8"), path)


def write_atomically(data: bytes, path: str | os.PathLike[str]) -> None:
    """Writes ``data`` to ``path`` through a temporary file in the same folder, renamed over it once complete
    and synced: a failed write (a full disk, ``ulimit -f``) leaves the old file as it was, never a cut one.
    Every file stepwatch writes goes through here (runs, all-ranks files, exports, pictures)."""
    target = os.path.realpath(os.fspath(path))
    try:
        mode = os.stat(target).st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    folder = os.path.dirname(target)
    os.makedirs(folder, exist_ok=True)  # out="runs/ddp.json" before runs/ exists
    handle, temporary = tempfile.mkstemp(prefix=".stepwatch-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(handle, "wb") as file:
            if hasattr(os, "fchmod"):
                os.fchmod(file.fileno(), mode)
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _umask() -> int:
    """The process's umask, read without changing it where the system tells it (Linux), else set back at once."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    current = os.umask(0o022)
    os.umask(current)
    return current


def read_document(path: str | os.PathLike[str]) -> tuple[bytes, dict[str, Any] | None]:
    """The file's bytes, and its document when it is an all-ranks file (else None: ``parse_summary`` reads
    a run, or says why the bytes are none)."""
    with open(path, "rb") as file:
        raw = file.read()
    try:
        document = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return raw, None
    return raw, document if isinstance(document, dict) and document.get("format") == RANKS_FORMAT else None


def load_summary(path: str | os.PathLike[str]) -> Summary:
    """Reads a saved run. Raises :class:`FormatError` naming the file and the reason for any bad content,
    and ``OSError`` when the file cannot be read at all."""
    with open(path, "rb") as file:
        raw = file.read()
    return parse_summary(raw, path)


class _NonFinite(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    raise _NonFinite(name)


def parse_summary(raw: bytes, path: str | os.PathLike[str] = "<bytes>") -> Summary:
    if not raw.strip():
        raise FormatError(path, "empty file")
    try:
        document = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except RecursionError:
        raise FormatError(path, "not a stepwatch run (JSON nested too deep)") from None
    except _NonFinite as error:
        raise FormatError(path, f"corrupt run: {error} is not a number JSON allows") from None
    except UnicodeDecodeError:
        raise FormatError(path, "not a JSON text file (invalid UTF-8)") from None
    except json.JSONDecodeError as error:
        rest = error.doc[error.pos :].strip()  # a literal cut short (``nu`` of ``null``) is a truncation too
        cut_literal = bool(rest) and any(word.startswith(rest) for word in ("null", "true", "false"))
        at_end = error.pos >= len(raw.rstrip()) - 1 or error.msg.startswith("Unterminated string") or cut_literal
        reason = "truncated JSON" if at_end else "not valid JSON"
        raise FormatError(path, f"{reason} ({error.msg} at line {error.lineno}, column {error.colno})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise FormatError(path, 'not a stepwatch run (no "format": "stepwatch" field)')
    schema = document.get("schema")
    if isinstance(schema, bool) or not isinstance(schema, int) or schema < 1:
        raise FormatError(path, f"invalid schema version {schema!r}")
    if schema > SCHEMA:
        raise FormatError(path, f"written by a newer stepwatch (schema {schema}, this one reads {SCHEMA}); upgrade")
    try:
        return Summary.from_dict(document)
    except KeyError as error:
        raise FormatError(path, f"corrupt run: missing field {error.args[0]!r}") from None
    except (TypeError, ValueError, AttributeError, RecursionError) as error:
        raise FormatError(path, f"corrupt run: {error}") from None
