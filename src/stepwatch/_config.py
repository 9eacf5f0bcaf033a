"""The environment switches: ``STEPWATCH`` turns recording on (``auto``: with auto-instrumentation),
``STEPWATCH_OUT`` names the autosave file."""

from __future__ import annotations

import os
from collections.abc import Mapping

ENABLE_VARIABLE = "STEPWATCH"
OUT_VARIABLE = "STEPWATCH_OUT"

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})


class ConfigError(ValueError):
    """An environment variable of stepwatch holds a value it does not understand."""


def auto_from_env(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``STEPWATCH=auto`` asks for recording with auto-instrumentation."""
    return environ.get(ENABLE_VARIABLE, "").strip().lower() == "auto"


def enabled_from_env(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``STEPWATCH`` asks for recording (``auto`` does too); raises :class:`ConfigError` for a value
    that is none of these."""
    raw = environ.get(ENABLE_VARIABLE)
    if raw is None:
        return False
    value = raw.strip().lower()
    if value in _TRUE or value == "auto":
        return True
    if value in _FALSE:
        return False
    raise ConfigError(
        f"{ENABLE_VARIABLE}={raw!r} is not understood: use 1/true/yes/on to enable, auto to enable with"
        " auto-instrumentation, or 0/false/no/off to disable"
    )


LIVE_VARIABLE = "STEPWATCH_LIVE"


def live_from_env(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``STEPWATCH_LIVE`` asks for the live view (1, true, yes, on)."""
    return environ.get(LIVE_VARIABLE, "").strip().lower() in _TRUE


def out_from_env(environ: Mapping[str, str] = os.environ) -> str | None:
    """The autosave path from ``STEPWATCH_OUT``, or None when unset or empty."""
    return environ.get(OUT_VARIABLE) or None
