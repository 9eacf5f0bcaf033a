"""The one schema of a recorded run, checked in one place before anything is built from it.

A saved file (``stepwatch.load``, every CLI command) and a checkpointed ``state_dict`` both carry a run as
plain data. :func:`check_run` walks all of it and raises ``ValueError`` naming the first field that is wrong
(its type, its range, or its agreement with the fields beside it), so that what loads can always be reported,
compared, exported and saved again.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from ._schedule import MAX_WINDOW

NS_MAX = 2**63 - 1
"""Largest duration, count or byte figure accepted (what a signed 64-bit counter holds)."""
ELAPSED_MAX = 1e12
"""Largest wall-clock span of a run in seconds (tens of thousands of years)."""
NUMBER_MAX = sys.float_info.max
OTHER = "other"


MAX_RANKS = 2**31
"""The largest rank or world size a run may name (what the environment says beyond it is not a rank)."""


class SchemaError(ValueError):
    """Where a run's data breaks the schema: ``str()`` is ``<field path>: <what is wrong>``."""


MISSING: Any = object()


def _fail(where: str, what: str) -> SchemaError:
    """One line: a key from the file (a phase's name) may hold a newline."""
    return SchemaError(printable(f"{where}: {what}"))


def _missing(value: Any, where: str) -> None:
    if value is MISSING:
        field = where.rsplit(".", 1)[-1]
        raise SchemaError(f"missing field {field!r}" + (f" in {where.rsplit('.', 1)[0]}" if "." in where else ""))


def _dict(value: Any, where: str) -> Mapping[str, Any]:
    _missing(value, where)
    if not isinstance(value, dict):
        raise _fail(where, f"must be an object, got {type(value).__name__}")
    return value


def _int(value: Any, where: str, low: int = 0, high: int = NS_MAX) -> int:
    _missing(value, where)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(where, f"must be an integer, got {type(value).__name__}")
    if not low <= value <= high:
        raise _fail(where, f"must be between {low} and {high}, got {value}")
    return value


def _optional_int(value: Any, where: str, low: int = 0, high: int = NS_MAX) -> int | None:
    return None if value is None else _int(value, where, low, high)


def _number(value: Any, where: str, low: float = -NUMBER_MAX, high: float = NUMBER_MAX) -> float:
    _missing(value, where)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(where, f"must be a number, got {type(value).__name__}")
    if not low <= value <= high:  # also false for NaN
        raise _fail(where, f"must be a finite number between {low:g} and {high:g}, got {value!r}")
    return float(value)


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on (escapes, newlines, other controls) replaced by
    ``?``: what stepwatch records from outside (devices, errors, what auto-instrumentation found) before it is
    saved, so that no report can be made to clear a screen or forge a line."""
    return text if text.isprintable() else "".join(c if c.isprintable() else "?" for c in text)


def _str(value: Any, where: str, optional: bool = True) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise _fail(where, f"must be a string, got {type(value).__name__}")
    if not value.isprintable():  # a terminal escape or a newline would act on, or forge, the report's lines
        raise _fail(where, f"must not contain control characters, got {value[:60]!r}")


def _name(value: Any, where: str) -> None:
    if not isinstance(value, str) or not value or "/" in value or not value.isprintable():
        raise _fail(where, f"is not a valid name: {value!r}")


def check_stats(data: Any, where: str) -> None:
    """One stage's statistics (wall or device): integer figures that agree with each other."""
    data = _dict(data, where)
    window = _int(data.get("window", MISSING), f"{where}.window", 1, MAX_WINDOW)
    calls = _int(data.get("calls", MISSING), f"{where}.calls")
    _int(data.get("total_ns", MISSING), f"{where}.total_ns")
    if data.get("spread", True) is False:
        return
    if "spread" in data and data["spread"] is not True:
        raise _fail(f"{where}.spread", "must be true or false")
    _int(data.get("sumsq_ns", MISSING), f"{where}.sumsq_ns", 0, NS_MAX * NS_MAX)
    _missing(data.get("min_ns", MISSING), f"{where}.min_ns")
    _missing(data.get("max_ns", MISSING), f"{where}.max_ns")
    low = _optional_int(data["min_ns"], f"{where}.min_ns")
    high = _optional_int(data["max_ns"], f"{where}.max_ns")
    if (calls == 0) != (low is None) or (low is None) != (high is None):
        raise _fail(where, "calls, min_ns and max_ns disagree")
    if low is not None and high is not None and low > high:
        raise _fail(where, "min_ns is above max_ns")
    recent = data.get("recent_ns", MISSING)
    _missing(recent, f"{where}.recent_ns")
    if not isinstance(recent, list):
        raise _fail(f"{where}.recent_ns", "must be a list")
    if len(recent) > min(window, calls):
        raise _fail(f"{where}.recent_ns", "holds more measurements than the window or the calls")
    for index, value in enumerate(recent):
        _int(value, f"{where}.recent_ns[{index}]")


def check_stage(path: Any, data: Any, where: str) -> None:
    if not isinstance(path, str) or not path:
        raise _fail(where, f"invalid stage path {path!r}")
    for part in path.split("/"):
        _name(part, f"{where} (stage path {path!r})")
    check_stats(data, where)
    if (data.get("spread", True) is False) != (path.rsplit("/", 1)[-1] == OTHER):
        raise _fail(where, "only an 'other' row is derived (spread false), and it always is")
    if data.get("device") is not None:
        check_stats(data["device"], f"{where}.device")
    for key in ("peak_allocated", "peak_reserved"):
        _optional_int(data.get(key), f"{where}.{key}")
    if not isinstance(data.get("in_workers", False), bool):
        raise _fail(f"{where}.in_workers", "must be true or false")


def check_phase(name: Any, data: Any, where: str) -> None:
    _name(name, where)
    data = _dict(data, where)
    stages = _dict(data.get("stages", MISSING), f"{where}.stages")
    for path, stage in stages.items():
        check_stage(path, stage, f"{where}.stages.{path}")
        if "/" in path and path.rsplit("/", 1)[0] not in stages:
            raise _fail(f"{where}.stages.{path}", "its parent stage is missing")
    for unit, value in _dict(data.get("counters", MISSING), f"{where}.counters").items():
        _name(unit, f"{where}.counters")
        _number(value, f"{where}.counters.{unit}")
    _int(data.get("loop_ns", MISSING), f"{where}.loop_ns")
    _int(data.get("steps", MISSING), f"{where}.steps")
    _int(data.get("count_calls", 0), f"{where}.count_calls")
    if data.get("device") is not None:
        device = _dict(data["device"], f"{where}.device")
        for key in ("busy_ns", "idle_ns", "steps"):
            _int(device.get(key, MISSING), f"{where}.device.{key}")
        _int(device.get("caught_up", 0), f"{where}.device.caught_up")
    for worker_id, worker in _dict(data.get("workers") or {}, f"{where}.workers").items():
        if not (isinstance(worker_id, str) and worker_id.isdigit() and len(worker_id) < 10):
            raise _fail(f"{where}.workers", f"invalid worker id {worker_id!r}")
        worker = _dict(worker, f"{where}.workers.{worker_id}")
        for key in ("batches", "busy_ns", "wall_ns", "wait_ns"):
            _int(worker.get(key, MISSING), f"{where}.workers.{worker_id}.{key}")
        for key in ("cpu_ns", "queued_ns"):  # absent: not measured
            _int(worker.get(key, 0), f"{where}.workers.{worker_id}.{key}")


_METADATA_STRINGS = ("stepwatch", "python", "torch", "host", "started_at", "device_error", "job", "flops_note")
_CONFIG_STEPS = ("active", "every")


def check_metadata(data: Any) -> None:
    data = _dict(data, "metadata")
    for key in _METADATA_STRINGS:
        _str(data.get(key), f"metadata.{key}")
    for key in ("pid", "cpu_count"):
        _optional_int(data.get(key), f"metadata.{key}", 0, 2**31)
    devices = data.get("devices", [])
    if not isinstance(devices, list) or not all(isinstance(device, str) for device in devices):
        raise _fail("metadata.devices", "must be a list of strings")
    for index, device in enumerate(devices):
        _str(device, f"metadata.devices[{index}]")
    _optional_int(data.get("dropped_blocks"), "metadata.dropped_blocks")
    _str(data.get("auto"), "metadata.auto")
    for phase, record in _dict(data.get("flops") or {}, "metadata.flops").items():
        where = f"metadata.flops.{phase}"
        _name(phase, where)
        record = _dict(record, where)
        for key in ("step", "forward", "backward", "at_step"):
            _int(record.get(key, MISSING), f"{where}.{key}", 0, 2**126)
        for key in ("dtype", "device"):
            _str(record.get(key), f"{where}.{key}")
    compiles = data.get("compiles") or []
    if not isinstance(compiles, list) or len(compiles) > 100_000:
        raise _fail("metadata.compiles", "must be a list of at most 100,000 compilations")
    for index, event in enumerate(compiles):
        where = f"metadata.compiles[{index}]"
        if not isinstance(event, list) or len(event) != 4 or not isinstance(event[3], bool):
            raise _fail(where, "must be [step, compile id, seconds, recompilation]")
        _int(event[0], f"{where}[0]", 0, 2**62)
        _str(event[1], f"{where}[1]", optional=False)
        _number(event[2], f"{where}[2]", 0.0)
    windows = data.get("windows") or []
    if not isinstance(windows, list) or len(windows) > 100_000:
        raise _fail("metadata.windows", "must be a list of at most 100,000 numbers")
    for index, value in enumerate(windows):
        _number(value, f"metadata.windows[{index}]", 0.0)
    for key in ("auto_in_c", "blocks_in_c", "reads_in_c"):
        if data.get(key) is not None and not isinstance(data[key], bool):
            raise _fail(f"metadata.{key}", "must be true, false or null")
    if data.get("block_ns") is not None:
        _number(data["block_ns"], "metadata.block_ns", 0.0, 1e9)
    if data.get("peak_flops") is not None:
        _number(data["peak_flops"], "metadata.peak_flops", 1.0)
    for key in ("rank", "local_rank", "world_size"):
        _optional_int(data.get(key), f"metadata.{key}", 0, MAX_RANKS)
    for phase, config in _dict(data.get("loaders") or {}, "metadata.loaders").items():
        for key, value in _dict(config, f"metadata.loaders.{phase}").items():
            if value is not None and not isinstance(value, (bool, int, str)):
                raise _fail(f"metadata.loaders.{phase}.{key}", "must be a number, a string, true/false or null")
            if isinstance(value, int) and not isinstance(value, bool):
                _int(value, f"metadata.loaders.{phase}.{key}", 0, 2**31)
    config = data.get("config")
    if config is None:
        return
    config = _dict(config, "metadata.config")
    _optional_int(config.get("warmup"), "metadata.config.warmup")
    for key in _CONFIG_STEPS:
        _optional_int(config.get(key), f"metadata.config.{key}")
    _optional_int(config.get("window"), "metadata.config.window", 1, MAX_WINDOW)
    _str(config.get("device"), "metadata.config.device")
    _str(config.get("memory"), "metadata.config.memory")
    for key in ("sync", "nvtx"):
        if not isinstance(config.get(key, False), bool):
            raise _fail(f"metadata.config.{key}", "must be true or false")


def check_trace(events: Any) -> None:
    """The timeline: a list of [phase, lane, path, start_ns, duration_ns(, value for a counter)]."""
    if not isinstance(events, list):
        raise _fail("trace", "must be a list of events")
    for index, event in enumerate(events):
        where = f"trace[{index}]"
        if not isinstance(event, list) or len(event) not in (5, 6):
            raise _fail(where, "must be [phase, lane, path, start_ns, duration_ns] and, for a counter, its value")
        for position, key in enumerate(("phase", "lane", "path")):
            _str(event[position], f"{where}.{key}", optional=False)
        _int(event[3], f"{where}.start_ns")
        _int(event[4], f"{where}.duration_ns")
        if len(event) == 6:
            _int(event[5], f"{where}.value")


def check_run(data: Any) -> None:
    """The whole run: phases, elapsed time, metadata and out-of-memory records."""
    data = _dict(data, "run")
    for name, phase in _dict(data.get("phases", MISSING), "phases").items():
        check_phase(name, phase, f"phases.{name}")
    _number(data.get("elapsed", MISSING), "elapsed", 0, ELAPSED_MAX)
    check_metadata(data.get("metadata", MISSING))
    check_trace(data.get("trace", []))
    events = data.get("out_of_memory", [])
    if not isinstance(events, list):
        raise _fail("out_of_memory", "must be a list")
    for index, event in enumerate(events):
        where = f"out_of_memory[{index}]"
        event = _dict(event, where)
        if set(event) != {"phase", "stage", "allocated", "reserved", "message"}:
            raise _fail(where, "needs exactly phase, stage, allocated, reserved and message")
        for key in ("phase", "stage", "message"):
            _str(event[key], f"{where}.{key}", optional=False)
        for key in ("allocated", "reserved"):
            _int(event[key], f"{where}.{key}")
