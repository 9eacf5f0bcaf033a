"""The live view: its panel on a terminal (a pseudo-terminal here, then a real program in tmux), the program's
output kept intact around it, the plain line off a terminal, and its switches."""

from __future__ import annotations

import fcntl
import io
import os
import re
import shutil
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import stepwatch
from stepwatch import Stopwatch
from stepwatch._live import LiveView

from .conftest import PYTHON, FakeClock, subprocess_env

MS = 1_000_000
S = 1_000_000_000


class Terminal:
    """A pseudo-terminal: what is written to ``stream`` is read back from the other side."""

    def __init__(self) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))  # 40 rows, 160 columns
        self.stream = os.fdopen(slave, "w", buffering=1)
        os.set_blocking(self.master, False)
        self.seen = b""

    def read(self) -> str:
        while True:
            try:
                chunk = os.read(self.master, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                break
            self.seen += chunk
        return self.seen.decode()

    def close(self) -> None:
        self.stream.close()
        os.close(self.master)


@pytest.fixture
def terminal() -> Iterator[Terminal]:
    made = Terminal()
    yield made
    made.close()


def train(sw: Stopwatch, clock: FakeClock, steps: int, step_ms: int = 100, say: int | None = None) -> None:
    for index in sw.timed_iter(range(steps)):
        clock.advance(10 * MS)
        with sw.timed("forward"):
            clock.advance((step_ms - 10) * MS)
        sw.count(samples=8)
        if say is not None and index % say == 0:
            print(f"iter {index}")


def test_the_panel_is_drawn_between_steps_about_once_a_second(terminal: Terminal, clock: FakeClock) -> None:
    sw = Stopwatch(warmup=2, active=40, clock=clock)
    sw.enable()
    view = sw.live = LiveView(sw, stream=terminal.stream)
    assert view.tty
    draws: list[int] = []
    original = view.draw
    view.draw = lambda now, phase, step: (draws.append(step), original(now, phase, step))[-1]  # type: ignore[method-assign]
    train(sw, clock, steps=30)  # 100 ms a step: a redraw every 10 steps
    assert draws[:3] == [1, 11, 21]
    shown = terminal.read()
    assert "stepwatch · train · step 21 · 100.00 ms/step · 80.0 samples/s · measuring steps 3-42" in shown
    assert re.search(r"  step +█{20} +100\.0%  +100\.000 ms/step", shown)  # the step's share of the loop, as a bar
    assert re.search(r"    forward +█{18}░{2} +90\.0%  +90\.000 ms/step", shown)
    assert "verdict: compute-bound" in shown
    view.close()


def test_the_programs_lines_stay_intact_above_the_panel(
    terminal: Terminal, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the panel is shown, a line the program prints erases the panel, is written whole, and the panel comes
    back below it; the streams are given back when the view closes."""
    monkeypatch.setattr(sys, "stdout", terminal.stream)
    monkeypatch.setattr(sys, "stderr", terminal.stream)
    sw = Stopwatch(clock=clock)
    sw.enable()
    view = sw.live = LiveView(sw, stream=terminal.stream)
    train(sw, clock, steps=25, say=12)  # the panel is up from step 1 on: iter 12 and 24 print under it
    assert sys.stdout is not terminal.stream  # passed through, around the panel
    view.close()
    assert sys.stdout is terminal.stream and sys.stderr is terminal.stream
    shown = terminal.read().replace("\r\n", "\n")  # (the terminal's own line endings)
    for line in ("iter 12", "iter 24"):
        before, after = shown.split(line, 1)
        height = before.rsplit("stepwatch · train · step", 1)[1].count("\n")  # the panel shown then
        assert before.endswith(f"\x1b[{height}F\x1b[J")  # the panel erased first
        assert after.startswith("\nstepwatch · train · step")  # the line whole, then the panel again
    assert "  verdict: compute-bound" in shown.rsplit("stepwatch · train · step", 1)[1]  # the last panel


def test_off_a_terminal_a_plain_line_every_30_seconds(clock: FakeClock) -> None:
    log = io.StringIO()
    sw = Stopwatch(clock=clock)
    sw.enable()
    view = sw.live = LiveView(sw, stream=log)
    assert not view.tty
    train(sw, clock, steps=700)  # 70 s
    lines = log.getvalue().splitlines()
    assert len(lines) == 2 and all(line.startswith("stepwatch · train · step ") for line in lines)
    assert " · step 300 · " in lines[0] and " · step 600 · " in lines[1] and "· verdict: compute-bound" in lines[1]
    view.close()


def test_the_switches(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    assert Stopwatch(live=True).live is not None and Stopwatch().live is None
    with pytest.raises(ValueError, match="live must be True or False"):
        Stopwatch(live="yes")  # type: ignore[arg-type]
    sw = Stopwatch(clock=clock)
    sw.enable(live=True)
    assert isinstance(sw.live, LiveView)
    sw.enable(live=False)
    assert sw.live is None
    from stepwatch._config import live_from_env

    assert (
        live_from_env({"STEPWATCH_LIVE": "1"}) and not live_from_env({}) and not live_from_env({"STEPWATCH_LIVE": "0"})
    )


def test_a_failing_view_stops_once_and_the_training_goes_on(
    terminal: Terminal, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    sw = Stopwatch(clock=clock)
    sw.enable()
    view = sw.live = LiveView(sw, stream=terminal.stream)
    view.lines = lambda phase, step: 1 / 0  # type: ignore[assignment, method-assign]
    train(sw, clock, steps=50)
    assert sw.summary().phases["train"].steps == 49
    assert [record.message for record in caplog.records] == ["stepwatch: the live view stopped: division by zero"]


# -- a real program in a real terminal ----------------------------------------------------------------------

PROGRAM = """
import time
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(160, 8), torch.randn(160, 1)), batch_size=4)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(2):
    for index, (x, y) in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        time.sleep(0.03)
        if index % 10 == 0:
            print(f"epoch {epoch} iter {index}: loss {loss.item():.4f}", flush=True)
print("training done", flush=True)
"""


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed here (apt-get install tmux)")
def test_in_tmux_the_panel_updates_and_the_output_and_report_follow(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(PROGRAM)
    env = subprocess_env()
    command = (
        f"cd {tmp_path} && env PYTHONPATH={env['PYTHONPATH']} {PYTHON} -m stepwatch run --live --warmup 2"
        " --active 30 -o run.json train.py; echo EXITED $?"
    )
    session = f"stepwatch-live-{os.getpid()}"
    tmux("new-session", "-d", "-s", session, "-x", "150", "-y", "60")
    try:
        tmux("send-keys", "-t", session, command, "Enter")
        panels = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            screen = tmux("capture-pane", "-t", session, "-p")
            panels += re.findall(r"stepwatch · train · step (\d+)", screen)
            if re.search(r"^EXITED \d+", screen, re.M):  # (the command typed holds "echo EXITED $?")
                break
            time.sleep(0.3)
        screen = tmux("capture-pane", "-t", session, "-p", "-S", "-200")
    finally:
        tmux("kill-session", "-t", session)
    assert re.search(r"^EXITED 0$", screen, re.M), screen
    assert len(set(panels)) >= 2, panels  # the panel was drawn again while it trained
    printed = [f"epoch {epoch} iter {index}: loss " for epoch in range(2) for index in range(0, 40, 10)]
    positions = [screen.index(line) for line in printed]
    assert positions == sorted(positions)  # every line of the program, whole, in order
    assert "training done" in screen
    # the report came when the window closed, the last panel stays, the end line is after it
    report = screen.index("stepwatch: the measured window closed at step 32")
    last_panel = screen.rindex("stepwatch · train · step 80 ·")
    end = screen.index("stepwatch: the report was printed at step 32, when the window closed")
    assert report < last_panel < end
    assert "window closed at step 32" in screen[last_panel:end]
    assert stepwatch.load(tmp_path / "run.json").phases["train"].steps == 30


def test_in_a_job_only_rank_0_shows_it(terminal: Terminal, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ranks of a torchrun job share one terminal: the other ranks draw nothing."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    sw = Stopwatch(clock=clock)
    sw.enable()
    view = sw.live = LiveView(sw, stream=terminal.stream)
    train(sw, clock, steps=30)
    view.close()
    assert terminal.read() == ""
    monkeypatch.setenv("RANK", "0")
    other = sw.live = LiveView(sw, stream=terminal.stream)
    train(sw, clock, steps=3)
    other.close()
    assert "stepwatch · train · step" in terminal.read()
