"""The measured window's end: the report and the saved run when the last measured step ends, and ``stop``: in
this process on a controlled clock, and through ``stepwatch run`` on unmodified programs in real subprocesses
(DataLoader workers included)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

import stepwatch
from stepwatch import StoppedByStepwatch, Stopwatch

from .conftest import FakeClock, stepwatch_command

PROGRAMS = Path(__file__).parent / "programs"
CNN = str(PROGRAMS / "cnn.py")
MS = 1_000_000
CLOSED = re.compile(r"stepwatch: the measured window closed at step (\d+)")


def test_the_report_and_the_run_come_when_the_window_closes(
    tmp_path: Path, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run.json"
    sw = Stopwatch(warmup=2, active=3, clock=clock)
    sw.enable(out=out)
    seen: list[tuple[int, bool, bool]] = []
    for index in sw.timed_iter(range(10)):
        seen.append((index, "verdict:" in capsys.readouterr().err, out.exists()))
        with sw.timed("forward"):
            clock.advance(MS)
    sw.disable()
    # steps 0-1 warm up, 2-4 are measured: the report comes as the loop asks for step 5, before its body
    assert seen[5] == (5, True, True)
    assert not any(printed or saved for _, printed, saved in seen[:5])
    assert not any(printed for _, printed, _ in seen[6:])  # once
    saved = stepwatch.load(out)
    assert saved.phases["train"].steps == 3 and saved.stages["step/forward"].calls == 3
    assert sw.window_end.reported_at == 5


def test_without_an_output_path_nothing_is_printed_at_the_window(
    clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    sw = Stopwatch(warmup=1, active=2, clock=clock)
    sw.enable()
    for _ in sw.timed_iter(range(5)):
        clock.advance(MS)
    assert capsys.readouterr().err == ""
    assert sw.window_end.reported_at is None and sw.summary().phases["train"].steps == 2


def test_stop_ends_the_loop_as_sys_exit_0_after_the_report(
    tmp_path: Path, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run.json"
    sw = Stopwatch(warmup=1, active=3, stop=True, clock=clock)
    sw.enable(out=out)
    bodies, cleaned_up = 0, False
    with pytest.raises(SystemExit) as stopped:
        try:
            for _ in sw.timed_iter(range(100)):
                bodies += 1
                clock.advance(MS)
        finally:
            cleaned_up = True
    sw.disable()
    assert isinstance(stopped.value, StoppedByStepwatch) and stopped.value.code == 0 and stopped.value.step == 4
    assert bodies == 4 and cleaned_up
    err = capsys.readouterr().err
    assert "the measured window closed at step 4; stopping the program" in err and "verdict:" in err
    assert stepwatch.load(out).phases["train"].steps == 3


def test_stop_without_an_output_path_says_so_in_one_line(clock: FakeClock, capsys: pytest.CaptureFixture[str]) -> None:
    sw = Stopwatch(active=1, stop=True, clock=clock)
    sw.enable()
    with pytest.raises(StoppedByStepwatch):
        for _ in sw.timed_iter(range(100)):
            clock.advance(MS)
    assert capsys.readouterr().err == "stepwatch: stopped the program at step 1: its measured window closed\n"


def test_a_framework_stops_its_own_way(clock: FakeClock) -> None:
    """``stop_with`` (Lightning's and the HF Trainer's graceful stop) replaces the exception."""
    sw = Stopwatch(active=2, stop=True, clock=clock)
    sw.enable()
    asked: list[int] = []
    sw.window_end.stop_with = lambda: asked.append(1)
    steps = sum(1 for _ in sw.timed_iter(range(6)))
    assert steps == 6 and asked == [1]


@pytest.mark.parametrize(
    "options, error",
    [
        ({"stop": True}, "stop needs active"),
        ({"stop": True, "active": 2, "every": 5}, "stop needs active"),
        ({"stop": "yes", "active": 2}, "stop must be True or False"),
    ],
)
def test_stop_needs_a_window_that_closes(options: dict[str, object], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        Stopwatch(**options)  # type: ignore[arg-type]


def test_reset_lets_the_window_close_again(tmp_path: Path, clock: FakeClock) -> None:
    sw = Stopwatch(active=1, clock=clock)
    sw.enable(out=tmp_path / "run.json")
    list(sw.timed_iter(range(3)))
    assert sw.window_end.reported_at == 1
    sw.reset()
    assert sw.window_end.reported_at is None


# -- stepwatch run, in real subprocesses ---------------------------------------------------------------------


def stepwatch_run(options: list[str], program: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return stepwatch_command("run", *options, *program, cwd=cwd, timeout=180)


@pytest.mark.slow
def test_run_active_prints_the_report_when_the_window_closes_and_not_again(tmp_path: Path) -> None:
    done = stepwatch_run(["--warmup", "1", "--active", "4", "-o", "run.json"], [CNN], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "final loss" in done.stdout  # the program went on to its end
    assert CLOSED.search(done.stderr) and CLOSED.search(done.stderr).group(1) == "5"  # type: ignore[union-attr]
    assert done.stderr.count("verdict:") == 1
    assert done.stderr.rstrip().endswith(
        "the report was printed at step 5, when the window closed; the run is saved to run.json"
    )
    assert stepwatch.load(tmp_path / "run.json").phases["train"].steps == 4


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_run_stop_ends_the_program_after_the_window_with_exit_0(tmp_path: Path, workers: int) -> None:
    options = ["--warmup", "1", "--active", "5", "--stop", "-o", "run.json"]
    done = stepwatch_run(options, [CNN, "--workers", str(workers)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "epoch 0" not in done.stdout and "final loss" not in done.stdout  # stopped inside the first epoch
    assert "the measured window closed at step 6; stopping the program" in done.stderr
    assert done.stderr.count("verdict:") == 1 and "Traceback" not in done.stderr
    assert "stopped the program at step 6, after the report above; the run is saved to run.json" in (done.stderr)
    saved = json.loads((tmp_path / "run.json").read_text())
    assert saved["phases"]["train"]["steps"] == 5


@pytest.mark.slow
def test_run_stop_needs_active(tmp_path: Path) -> None:
    done = stepwatch_run(["--stop"], [CNN], tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == "stepwatch run: --stop needs --active N (a window that closes)"


def test_a_dataloader_loop_stopped_by_hand_frees_its_workers(tmp_path: Path) -> None:
    """The stop unwinds the watched loop as Ctrl-C would: the DataLoader's workers end."""
    import torch
    from torch.utils.data import TensorDataset

    sw = Stopwatch(active=2, stop=True)
    sw.enable(out=tmp_path / "run.json")
    loader = DataLoader(TensorDataset(torch.arange(64.0)), batch_size=4, num_workers=2, persistent_workers=False)
    with pytest.raises(StoppedByStepwatch):
        for _ in sw.watch(loader):
            pass
    sw.disable()
    import gc
    import multiprocessing

    gc.collect()
    assert not multiprocessing.active_children()
