"""Saved runs: round trip, metadata, atomic writes, every kind of bad file, TSV export."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import socket
import subprocess
from pathlib import Path

import pytest

import stepwatch
from stepwatch import FormatError, Stopwatch

from .conftest import PYTHON, FakeClock, subprocess_env


def recorded(clock: FakeClock) -> Stopwatch:
    sw = Stopwatch(clock=clock, warmup=1)
    sw.enable()
    for i in sw.timed_iter(range(6)):
        with sw.timed("forward"):
            clock.advance(100 + i)
        sw.count(samples=4)
    for _ in sw.timed_iter(range(3), phase="val"):
        clock.advance(7)
    return sw


def test_round_trip_keeps_every_figure(tmp_path: Path, clock: FakeClock) -> None:
    sw = recorded(clock)
    path = tmp_path / "run.json"
    sw.save(path)
    loaded = stepwatch.load(path)
    original = sw.summary()
    assert loaded.phases.keys() == original.phases.keys()
    for name, phase in original.phases.items():
        assert dict(loaded.phases[name].stages) == dict(phase.stages)
        assert dict(loaded.phases[name].counters) == dict(phase.counters)
        assert loaded.phases[name].loop_ns == phase.loop_ns
    assert loaded.throughput == original.throughput
    assert stepwatch.render(loaded) == stepwatch.render(original).replace(
        f"{original.elapsed:.2f}", f"{loaded.elapsed:.2f}"
    )


def test_file_has_schema_and_metadata(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "run.json"
    recorded(clock).save(path)
    document = json.loads(path.read_text())
    assert document["format"] == "stepwatch" and document["schema"] == 1
    meta = document["metadata"]
    assert meta["python"] == platform.python_version()
    assert meta["host"] == socket.gethostname()
    assert meta["torch"]  # installed in the test environment, read without importing it
    assert meta["stepwatch"] == stepwatch.__version__
    assert meta["started_at"] and meta["devices"]
    assert meta["config"] == {
        "warmup": 1,
        "active": None,
        "every": None,
        "window": 1024,
        "device": None,
        "sync": False,
        "nvtx": False,
        "memory": "step",
        "trace_steps": None,
    }


def test_save_is_atomic_and_leaves_no_temporary_file(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "run.json"
    path.write_text("previous content")
    recorded(clock).save(path)
    assert os.listdir(tmp_path) == ["run.json"]
    stepwatch.load(path)


def test_failed_save_keeps_the_previous_file(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "run.json"
    sw = recorded(clock)
    sw.save(path)
    good = path.read_text()
    with pytest.raises(OSError):
        sw.save(path / "run.json")  # a file where its folder should be
    assert path.read_text() == good
    assert sorted(os.listdir(tmp_path)) == ["run.json"]


def test_save_makes_a_missing_folder(tmp_path: Path, clock: FakeClock) -> None:
    recorded(clock).save(tmp_path / "runs" / "today" / "run.json")
    assert stepwatch.load(tmp_path / "runs" / "today" / "run.json").main_phase.steps > 0


BAD_FILES = {
    "empty": (b"", "empty file"),
    "whitespace": (b"  \n", "empty file"),
    "not json": (b"hello world", "not valid JSON"),
    "truncated": (b'{"format": "stepwatch", "schema": 1, "phases": {', "truncated JSON"),
    "binary": (b"\x89PNG\r\n\x1a\n\x00\xff", "not a JSON text file"),
    "foreign json": (b'{"traceEvents": []}', "not a stepwatch run"),
    "json list": (b"[1, 2]", "not a stepwatch run"),
    "newer schema": (b'{"format": "stepwatch", "schema": 99}', "newer stepwatch (schema 99"),
    "bad schema": (b'{"format": "stepwatch", "schema": "1"}', "invalid schema version"),
    "missing field": (b'{"format": "stepwatch", "schema": 1, "elapsed": 1, "metadata": {}}', "missing field 'phases'"),
    "wrong type": (
        b'{"format": "stepwatch", "schema": 1, "elapsed": 1, "metadata": {}, "phases": {"train": {"stages": '
        b'{"x": {"calls": "many", "total_ns": 1, "sumsq_ns": 1, "min_ns": 1, "max_ns": 1, "window": 4, '
        b'"recent_ns": []}}, "counters": {}, "loop_ns": 0, "steps": 0}}}',
        "calls: must be an integer",
    ),
}


@pytest.mark.parametrize("kind", sorted(BAD_FILES))
def test_bad_files_raise_format_error_naming_file_and_reason(tmp_path: Path, kind: str) -> None:
    content, reason = BAD_FILES[kind]
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(FormatError) as raised:
        stepwatch.load(path)
    assert str(path) in str(raised.value)
    assert reason in str(raised.value)
    assert raised.value.path == str(path)


def test_truncated_real_file_is_a_format_error(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "run.json"
    recorded(clock).save(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(FormatError, match="truncated JSON"):
        stepwatch.load(path)


def test_tsv_has_a_row_per_measurement_and_a_column_per_stage(clock: FakeClock) -> None:
    summary = recorded(clock).summary()
    lines = stepwatch.render(summary, "tsv").splitlines()
    header = lines[0].split("\t")
    assert header[:3] == ["train:loader", "train:step", "train:step/forward"]
    assert "val:step" in header
    rows = [line.split("\t") for line in lines[1:]]
    assert len(rows) == 5  # 6 steps, 1 warm-up
    forward = [float(row[header.index("train:step/forward")]) for row in rows]
    assert forward == [pytest.approx((100 + i) / 1e9) for i in range(1, 6)]
    val = [row[header.index("val:step")] for row in rows]
    assert val[2:] == ["", "", ""] and all(val[:2])  # 3 validation steps, 1 warm-up


def test_report_of_empty_recording_says_so() -> None:
    assert "nothing recorded" in Stopwatch().report()


@pytest.mark.parametrize("fraction", [0.1, 0.33, 0.5, 0.77, 0.99])
def test_file_cut_anywhere_is_a_format_error(tmp_path: Path, clock: FakeClock, fraction: float) -> None:
    path = tmp_path / "run.json"
    recorded(clock).save(path)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(FormatError, match="truncated JSON"):
        stepwatch.load(path)


def test_saved_file_states_figures_in_seconds_beside_exact_nanoseconds(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "run.json"
    recorded(clock).save(path)
    stage = json.loads(path.read_text())["phases"]["train"]["stages"]["step/forward"]
    assert stage["seconds"]["mean"] == pytest.approx(stage["total_ns"] / stage["calls"] / 1e9)
    assert stage["seconds"]["p50"] == pytest.approx(103e-9)
    other = json.loads(path.read_text())["phases"]["train"]["stages"]["step/other"]
    assert other["seconds"]["std"] is None and other["seconds"]["total"] == other["total_ns"] / 1e9


# -- files and permissions ------------------------------------------------------------------------------------


def test_new_file_honours_the_umask(tmp_path: Path, clock: FakeClock) -> None:
    previous = os.umask(0o002)
    try:
        recorded(clock).save(tmp_path / "run.json")
    finally:
        os.umask(previous)
    assert (tmp_path / "run.json").stat().st_mode & 0o777 == 0o664


def test_existing_file_keeps_its_mode(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "run.json"
    path.write_text("old")
    path.chmod(0o640)
    recorded(clock).save(path)
    assert path.stat().st_mode & 0o777 == 0o640
    assert stepwatch.load(path).stages


def test_saving_to_a_symlink_writes_its_target(tmp_path: Path, clock: FakeClock) -> None:
    target = tmp_path / "runs" / "latest-target.json"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "latest.json"
    link.symlink_to(target)
    recorded(clock).save(link)
    assert link.is_symlink()
    assert stepwatch.load(target).stages
    assert not [p for p in target.parent.iterdir() if p.name.startswith(".stepwatch-")]


def test_what_save_writes_load_reads(tmp_path: Path) -> None:
    """A rank from the environment beyond what a run may hold is not a rank (the run was saved, then refused by
    load); and save checks the same schema load does, refusing before it writes."""
    result = subprocess.run(
        [PYTHON, "-c", "import stepwatch\nfor _ in stepwatch.timed_iter(range(3)):\n    pass\n"],
        env=subprocess_env(
            STEPWATCH="1", STEPWATCH_OUT=str(tmp_path / "r.json"), RANK="3000000000", WORLD_SIZE="4000000000"
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    loaded = stepwatch.load(tmp_path / "r.json")
    assert loaded.metadata["rank"] is None and loaded.main_phase.steps == 2
    sw = stepwatch.Stopwatch()
    sw.enable()
    for _ in sw.timed_iter(range(3)):
        pass
    bad = dataclasses.replace(sw.summary(), metadata={**sw.summary().metadata, "world_size": 2**40})
    with pytest.raises(ValueError, match=r"metadata\.world_size"):
        stepwatch._run_file.save_summary(bad, tmp_path / "bad.json")
    assert not (tmp_path / "bad.json").exists()
