"""Nothing lost: real subprocesses that exit, crash, or get SIGTERM/SIGINT still leave their saved run."""

from __future__ import annotations

import signal
import subprocess
import textwrap
from pathlib import Path

import stepwatch

from .conftest import PYTHON, subprocess_env

RECORD = """
import stepwatch
for _ in stepwatch.timed_iter(range(3)):
    with stepwatch.timed("forward"):
        pass
    stepwatch.count(samples=2)
"""


def run_script(body: str, out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    code = textwrap.dedent(RECORD) + textwrap.dedent(body)
    return subprocess.run(
        [PYTHON, "-c", code],
        env=subprocess_env(STEPWATCH="1", STEPWATCH_OUT=str(out), **env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def assert_saved(out: Path) -> None:
    summary = stepwatch.load(out)
    assert summary.stages["step/forward"].calls == 2 and summary.stages["first_step/forward"].calls == 1
    assert summary.main_phase.counters["samples"] == 4  # the first step's counts are apart, like its time


def test_saved_at_normal_exit(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    result = run_script("", out)
    assert result.returncode == 0, result.stderr
    assert_saved(out)


def test_saved_on_uncaught_exception_with_report_logged(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    body = """
    import logging
    logging.basicConfig(level=logging.DEBUG)
    raise RuntimeError("training diverged")
    """
    result = run_script(body, out)
    assert result.returncode == 1
    assert "RuntimeError: training diverged" in result.stderr  # the original traceback still shows
    assert "stepwatch report at uncaught RuntimeError" in result.stderr
    assert "forward" in result.stderr
    assert_saved(out)


USUAL_SIGINT = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
"""A shell starting the suite in the background ignores SIGINT, and children inherit that: each child under
test first gives itself Python's usual handling (before stepwatch is imported), whoever started the suite."""


def start_and_signal(
    body: str, out: Path, signum: int, code: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Starts a recording child, waits for its "ready" line, sends ``signum`` and collects the outcome."""
    process = subprocess.Popen(
        [PYTHON, "-c", USUAL_SIGINT + (code or textwrap.dedent(RECORD) + textwrap.dedent(body))],
        env=env or subprocess_env(STEPWATCH="1", STEPWATCH_OUT=str(out)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    process.send_signal(signum)
    try:
        stdout, stderr = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        raise AssertionError(f"the child outlived {signal.Signals(signum).name}: {stdout!r} {stderr!r}") from None
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


WAIT = """
import sys, time
print("ready", flush=True)
time.sleep(60)
print("not interrupted")
"""


def test_sigterm_saves_then_dies_by_the_signal(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    result = start_and_signal(WAIT, out, signal.SIGTERM)
    assert result.returncode == -signal.SIGTERM
    assert "not interrupted" not in result.stdout
    assert_saved(out)


def test_sigterm_calls_the_handler_that_was_there_before(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    code = (
        f"""
import signal, sys
def graceful(signum, frame):
    print("graceful shutdown", flush=True)
    sys.exit(3)
signal.signal(signal.SIGTERM, graceful)
import stepwatch
stepwatch.enable(out={str(out)!r})
"""
        + RECORD
        + WAIT
    )
    result = start_and_signal("", out, signal.SIGTERM, code=code, env=subprocess_env())
    assert result.returncode == 3
    assert "graceful shutdown" in result.stdout
    assert_saved(out)


def test_sigint_saves_then_raises_keyboard_interrupt(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    body = """
import time
try:
    print("ready", flush=True)
    time.sleep(60)
except KeyboardInterrupt:
    print("KeyboardInterrupt as usual", flush=True)
"""
    result = start_and_signal(body, out, signal.SIGINT)
    assert result.returncode == 0, result.stderr
    assert "KeyboardInterrupt as usual" in result.stdout
    assert_saved(out)


def test_uncaught_sigint_still_ends_the_process(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    result = start_and_signal(WAIT, out, signal.SIGINT)
    assert result.returncode in (1, -signal.SIGINT)  # Python exits by the signal since 3.8
    assert "KeyboardInterrupt" in result.stderr
    assert_saved(out)


def test_enable_with_out_argument(tmp_path: Path) -> None:
    out = tmp_path / "explicit.json"
    code = f"""
import stepwatch
sw = stepwatch.Stopwatch()
sw.enable(out={str(out)!r})
with sw.timed("x"):
    pass
"""
    subprocess.run([PYTHON, "-c", code], env=subprocess_env(), check=True, timeout=60)
    assert stepwatch.load(out).stages["x"].calls == 1


def test_children_never_overwrite_the_parent_run_file(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    body = """
import multiprocessing, os, signal, time

def forked_child():
    os.kill(os.getpid(), signal.SIGTERM)  # inherits the parent's handlers and its stale recording

def spawned_child():
    import stepwatch  # STEPWATCH=1 and STEPWATCH_OUT are inherited
    with stepwatch.timed("child_only"):
        pass

if __name__ == "__main__":
    for method, target in (("fork", forked_child), ("spawn", spawned_child)):
        process = multiprocessing.get_context(method).Process(target=target)
        process.start()
        process.join()
    print("file written by a child:", os.path.exists(os.environ["STEPWATCH_OUT"]), flush=True)
    with stepwatch.timed("after_children"):
        pass
"""
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(RECORD) + body)
    result = subprocess.run(
        [PYTHON, str(script)],
        env=subprocess_env(STEPWATCH="1", STEPWATCH_OUT=str(out)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "file written by a child: False" in result.stdout
    stages = stepwatch.load(out).stages
    assert "after_children" in stages and "child_only" not in stages
    assert_saved(out)


def test_stopwatch_made_in_a_function_is_saved_after_it_returns(tmp_path: Path) -> None:
    out = tmp_path / "inner.json"
    code = f"""
import gc
from stepwatch import Stopwatch

def setup():
    sw = Stopwatch()
    sw.enable(out={str(out)!r})
    for _ in sw.timed_iter(range(3)):
        with sw.timed("forward"):
            pass
        sw.count(samples=2)

setup()
gc.collect()
"""
    result = subprocess.run([PYTHON, "-c", code], env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert_saved(out)


def test_relative_out_is_resolved_when_enabled_not_at_exit(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    body = """
    import os
    os.chdir("elsewhere")  # as Hydra does
    """
    result = subprocess.run(
        [PYTHON, "-c", textwrap.dedent(RECORD) + textwrap.dedent(body)],
        env=subprocess_env(STEPWATCH="1", STEPWATCH_OUT="runs.json"),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert_saved(tmp_path / "runs.json")
    assert not (tmp_path / "elsewhere" / "runs.json").exists()


def test_home_is_expanded_in_out(tmp_path: Path) -> None:
    result = subprocess.run(
        [PYTHON, "-c", RECORD],
        env=subprocess_env(STEPWATCH="1", STEPWATCH_OUT="~/run.json", HOME=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert_saved(tmp_path / "run.json")


def test_empty_out_is_refused() -> None:
    import pytest

    sw = stepwatch.Stopwatch()
    for bad in ("", "   ", 5):
        with pytest.raises(ValueError, match="out must be"):
            sw.enable(out=bad)  # type: ignore[arg-type]
    assert not sw.is_enabled()
