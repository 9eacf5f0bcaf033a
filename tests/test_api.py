from __future__ import annotations

import subprocess
import sys

import pytest

import stepwatch

from .conftest import PYTHON, subprocess_env

PUBLIC = {
    "AllRanks",  # what load() returns for an all-ranks file, and summary(ranks="all") on rank 0
    "Compared",  # what compare() returns: two runs side by side, displayed as a table in a notebook
    "ConfigError",
    "FormatError",
    "PhaseSummary",
    "StageStats",
    "StoppedByStepwatch",  # what the training loop raises when stop=True ends the program (a SystemExit, code 0)
    "Stopwatch",
    "Summary",
    "__version__",
    "auto",
    "compare",
    "count",
    "disable",
    "enable",
    "is_enabled",
    "load",
    "load_state_dict",
    "log_every",
    "metrics",
    "render",
    "report",
    "reset",
    "save",
    "state_dict",
    "summary",
    "timed",
    "timed_iter",
    "timed_transform",
    "tune",  # the DataLoader settings that make the program's own step fastest, measured
    "watch",
}


def test_public_surface_is_exactly_the_intended_list() -> None:
    assert set(stepwatch.__all__) == PUBLIC
    for name in PUBLIC:
        assert hasattr(stepwatch, name), name


def test_stopwatch_instances_have_the_module_functions() -> None:
    for name in ("enable", "disable", "is_enabled", "timed", "timed_iter", "count", "report", "summary", "save"):
        assert callable(getattr(stepwatch.Stopwatch(), name))
    for name in ("load", "reset", "state_dict", "load_state_dict"):
        assert callable(getattr(stepwatch.Stopwatch(), name))


def test_import_pulls_in_nothing_outside_the_standard_library() -> None:
    code = (
        "import sys, stepwatch\n"
        "sw = stepwatch.Stopwatch(); sw.enable()\n"
        "with sw.timed('x'): pass\n"
        "sw.report(); sw.summary()\n"
        "print(sorted(m for m in ('torch', 'numpy', 'matplotlib', 'pandas', 'lightning') if m in sys.modules))"
    )
    result = subprocess.run([PYTHON, "-c", code], env=subprocess_env(), capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_render_rejects_unknown_format() -> None:
    with pytest.raises(ValueError, match="text, tsv, csv, trace, json, html"):
        stepwatch.render(stepwatch.Stopwatch().summary(), "xml")


def test_missing_extras_name_what_to_install() -> None:
    from unittest.mock import patch

    import numpy  # noqa: F401  imported before patch.dict, whose restore would drop it: numpy cannot load twice
    import torch  # noqa: F401

    from stepwatch import demo
    from stepwatch._device import TorchDevice

    with patch.dict(sys.modules, {"sklearn": None, "sklearn.datasets": None}), pytest.raises(SystemExit) as raised:
        demo._require()
    assert "pip install 'stepwatch[demo]'" in str(raised.value)
    with patch.dict(sys.modules, {"torch": None}), pytest.raises(ImportError, match=r"stepwatch\[torch\]"):
        TorchDevice("cuda")
