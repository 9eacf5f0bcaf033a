"""The stepwatch command: in-process through main(), plus real subprocesses for both entry points."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from stepwatch import Stopwatch
from stepwatch.cli import main

from .conftest import PYTHON, FakeClock, subprocess_env


@pytest.fixture
def saved(tmp_path: Path, clock: FakeClock) -> Path:
    sw = Stopwatch(clock=clock)
    sw.enable()
    for _ in sw.timed_iter(range(4)):
        with sw.timed("forward"):
            clock.advance(2_000_000)
        sw.count(samples=8)
    path = tmp_path / "run.json"
    sw.save(path)
    return path


def test_report_prints_the_table(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "forward" in out and "samples/s" in out and "% time" in out


@pytest.mark.parametrize(
    ("content", "reason"), [(b"", "empty file"), (b"{", "truncated JSON"), (b'{"a": 1}', "not a stepwatch run")]
)
def test_bad_file_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, reason: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and reason in err and str(path) in err


def test_missing_file_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "nope.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot read" in err


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["frobnicate"]) == 2
    assert main([]) == 2


def test_export_guesses_format_from_extension(saved: Path, tmp_path: Path) -> None:
    out = tmp_path / "steps.tsv"
    assert main(["export", str(saved), "-o", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[0].split("\t")[:3] == ["train:loader", "train:step", "train:step/forward"]
    assert len(lines) == 5


def test_export_explicit_format_to_stdout(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(saved), "--format", "json"]) == 0
    assert '"format": "stepwatch"' in capsys.readouterr().out


@pytest.mark.parametrize("command", [["stepwatch"], [PYTHON, "-m", "stepwatch"]])
def test_real_subprocess_entry_points(saved: Path, tmp_path: Path, command: list[str]) -> None:
    if command == ["stepwatch"]:
        command = [str(Path(PYTHON).parent / "stepwatch")]
    good = subprocess.run([*command, "report", str(saved)], env=subprocess_env(), capture_output=True, text=True)
    assert good.returncode == 0 and "forward" in good.stdout
    bad_path = tmp_path / "bad.json"
    bad_path.write_text("not json at all")
    bad = subprocess.run([*command, "report", str(bad_path)], env=subprocess_env(), capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "not valid JSON" in bad.stderr
    assert "Traceback" not in bad.stderr
