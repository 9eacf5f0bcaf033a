"""Which steps are measured (warm-up, active window, period) and the checks of every configuration value.

Everything a user passes is checked completely when it is given (``Stopwatch(...)``, ``enable(...)``), so a
value that would only fail later, inside the training loop, fails at once with a one-line ``ValueError``.
"""

from __future__ import annotations

import contextlib
import math
import operator
import os
import tempfile
from dataclasses import dataclass

MAX_WINDOW = 1_000_000
"""The most recent measurements a stage may keep for percentiles (each costs a slot in memory and file)."""


def check_steps(value: object, name: str, *, optional: bool) -> int | None:
    """A non-negative integer (or None where ``optional``); anything else is a ``ValueError`` naming it."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        allowed = "a non-negative integer or None" if optional else "a non-negative integer"
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return value


def check_flag(value: object, name: str) -> bool:
    """A switch given as True or False (a truthy string is a mistake, not a yes)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def check_window(window: object) -> int:
    if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= MAX_WINDOW:
        raise ValueError(f"window must be an integer from 1 to {MAX_WINDOW:,}, got {window!r}")
    return window


@dataclass(frozen=True)
class Schedule:
    """Which steps are measured: skip ``warmup`` steps of each timed iterator, then measure ``active`` steps
    in every period of ``every`` steps (``active=None``: measure everything; ``every=None``: one window)."""

    warmup: int = 0
    active: int | None = None
    every: int | None = None

    def __post_init__(self) -> None:
        check_steps(self.warmup, "warmup", optional=False)
        check_steps(self.active, "active", optional=True)
        check_steps(self.every, "every", optional=True)
        if self.every is not None:
            if self.active is None:
                raise ValueError("every needs active: measure `active` steps out of every `every`")
            if self.every < max(self.active, 1):
                raise ValueError(f"every ({self.every}) must be at least active ({self.active}) and positive")

    @property
    def closes(self) -> bool:
        """Whether the measured window closes for good (``active`` steps, no ``every``)."""
        return self.active is not None and self.every is None

    def measures(self, position: int) -> bool:
        """Whether the step at ``position`` (counted after warm-up) is measured."""
        if self.active is None:
            return True
        if self.every is None:
            return position < self.active
        return position % self.every < self.active


def as_count(unit: str, value: object) -> int | float:
    """A count as a Python number: ints, finite floats, numpy and 0-d torch scalars; TypeError otherwise."""
    dtype = getattr(value, "dtype", None)
    if isinstance(value, (bool, str, bytes)) or value is None or "bool" in str(dtype):
        raise TypeError(f"count({unit}=...) needs a finite number, got {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except Exception:
        pass
    try:
        number = float(value)  # type: ignore[arg-type]
    except Exception:
        raise TypeError(f"count({unit}=...) needs a finite number, got {value!r}") from None
    if not math.isfinite(number):
        raise TypeError(f"count({unit}=...) needs a finite number, got {value!r}")
    return number


def out_path(out: str | os.PathLike[str]) -> str:
    """An autosave path, resolved now (``~`` expanded; relative to the current folder, before any chdir)."""
    try:
        path = os.fspath(out)
    except TypeError:
        raise ValueError(f"out must be a path, got {out!r}") from None
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"out must be a non-empty path, got {out!r}")
    resolved = os.path.abspath(os.path.expanduser(path))
    check_writable(resolved)
    return resolved


def check_writable(path: str) -> None:
    """Refuses, now rather than at the end of a long run, a path the run cannot be saved to: a folder, or a
    place where no file can be made (a read-only or missing device, ``/proc``). A missing folder is fine:
    saving makes it. Probed by making, and removing, a file beside it."""
    if os.path.isdir(path):
        raise ValueError(f"out {path} is a folder: give a file name, e.g. {os.path.join(path, 'run.json')}")
    existing = os.path.dirname(path)
    while existing and not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing or "."):
        raise ValueError(f"cannot save to {path}: {existing} is not a folder")
    try:
        handle, probe = tempfile.mkstemp(prefix=".stepwatch-probe-", dir=existing or ".")
    except OSError as error:
        raise ValueError(f"cannot save to {path}: {error.strerror or error}") from None
    os.close(handle)
    with contextlib.suppress(OSError):
        os.unlink(probe)
