from __future__ import annotations

import subprocess

import pytest

from stepwatch._autostart import _main_program, run_file
from stepwatch._config import ConfigError, auto_from_env, enabled_from_env, out_from_env

from .conftest import PYTHON, subprocess_env


@pytest.mark.parametrize("value", ["1", "true", "YES", "On", " 1 "])
def test_true_values_enable(value: str) -> None:
    assert enabled_from_env({"STEPWATCH": value}) is True


@pytest.mark.parametrize("value", ["0", "false", "No", "off", ""])
def test_false_values_disable(value: str) -> None:
    assert enabled_from_env({"STEPWATCH": value}) is False


@pytest.mark.parametrize("value", ["auto", "AUTO", " Auto "])
def test_auto_enables_with_auto_instrumentation(value: str) -> None:
    assert enabled_from_env({"STEPWATCH": value}) is True
    assert auto_from_env({"STEPWATCH": value}) is True
    assert auto_from_env({"STEPWATCH": "1"}) is False and auto_from_env({}) is False


def test_default_run_file_is_named_after_the_program(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(str(tmp_path))
    assert run_file("scripts/train.py") == str(tmp_path) + "/train.stepwatch.json"
    assert run_file("mypkg.train", module=True) == str(tmp_path) + "/mypkg.train.stepwatch.json"
    assert run_file("") == str(tmp_path) + "/stepwatch.stepwatch.json"
    monkeypatch.setattr("sys.orig_argv", ["python", "-X", "dev", "-m", "pkg.mod", "a"])
    assert _main_program() == ("pkg.mod", True)
    monkeypatch.setattr("sys.orig_argv", ["python", "-u", "train.py", "--lr", "1"])
    assert _main_program() == ("train.py", False)
    monkeypatch.setattr("sys.orig_argv", ["python", "-c", "pass"])
    assert _main_program() == ("", False)


def test_unset_is_off() -> None:
    assert enabled_from_env({}) is False


def test_other_value_is_an_error_naming_the_variable() -> None:
    with pytest.raises(ConfigError, match=r"STEPWATCH='maybe'"):
        enabled_from_env({"STEPWATCH": "maybe"})


def test_out_path_from_env() -> None:
    assert out_from_env({"STEPWATCH_OUT": "run.json"}) == "run.json"
    assert out_from_env({"STEPWATCH_OUT": ""}) is None
    assert out_from_env({}) is None


def test_env_switch_enables_default_stopwatch_at_import() -> None:
    code = "import stepwatch; print(stepwatch.is_enabled())"
    on = subprocess.run([PYTHON, "-c", code], env=subprocess_env(STEPWATCH="1"), capture_output=True, text=True)
    off = subprocess.run([PYTHON, "-c", code], env=subprocess_env(), capture_output=True, text=True)
    assert (on.stdout.strip(), off.stdout.strip()) == ("True", "False")


def test_bad_env_value_fails_import_clearly() -> None:
    result = subprocess.run(
        [PYTHON, "-c", "import stepwatch"], env=subprocess_env(STEPWATCH="maybe"), capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "ConfigError: STEPWATCH='maybe' is not understood" in result.stderr
