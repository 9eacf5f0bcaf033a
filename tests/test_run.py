"""Zero code: unmodified training programs (tests/programs, which never import stepwatch) run by ``stepwatch run``
and by ``STEPWATCH=auto python``, in real subprocesses, against the same programs run by plain ``python``."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

import stepwatch

from .conftest import OVERHEAD_S, PYTHON, subprocess_env

PROGRAMS = Path(__file__).parent / "programs"
CNN = str(PROGRAMS / "cnn.py")
LM = str(PROGRAMS / "lm.py")
TRAIN_STAGES = ("loader", "step", "step/forward", "step/loss", "step/backward", "step/optimizer", "step/zero_grad")

pytestmark = pytest.mark.slow


def run(args: list[str], cwd: Path, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, *args], cwd=cwd, env=subprocess_env(**env), capture_output=True, text=True, timeout=timeout
    )


def stepwatch_run(program: list[str], cwd: Path, out: Path | None = None) -> subprocess.CompletedProcess[str]:
    options = ["-o", str(out)] if out is not None else []
    return run(["-m", "stepwatch", "run", *options, *program], cwd)


def final_loss(stdout: str) -> str:
    found = re.search(r"final loss (\S+)", stdout)
    assert found, stdout
    return found.group(1)


def check_train(summary: stepwatch.Summary, epochs: int, batches: int) -> stepwatch.PhaseSummary:
    """The training phase has every stage, once per measured step (an epoch's first step is apart)."""
    train = summary.phases["train"]
    steps = epochs * (batches - 1)
    assert train.steps == steps
    for path in TRAIN_STAGES:
        assert train.stages[path].calls == steps, (path, train.stages[path].calls)
    assert train.counters["samples"] == 16 * steps  # counted from the batches, first steps apart
    return train


@pytest.mark.parametrize("workers", [0, 2])
def test_cnn_gets_the_full_breakdown_and_the_same_loss(tmp_path: Path, workers: int) -> None:
    program = [CNN, "--workers", str(workers), "--samples", "96"]
    plain = run(program, tmp_path)
    assert plain.returncode == 0, plain.stderr
    watched = stepwatch_run(program, tmp_path)
    assert watched.returncode == 0, watched.stderr
    assert final_loss(watched.stdout) == final_loss(plain.stdout)  # bit-identical

    out = tmp_path / "cnn.stepwatch.json"  # the default: named after the script, in the current directory
    assert f"run saved to {out.name}" in watched.stderr
    summary = stepwatch.load(out)
    check_train(summary, epochs=2, batches=6)
    val = summary.phases["val"]  # the loop under no_grad, without backward
    assert val.steps == 2 * 1 and val.stages["step/forward"].calls == 2
    assert not any(path.endswith("backward") for path in val.stages)
    assert summary.metadata["auto"] == (
        f"auto: 2 DataLoaders (0/{workers} workers), forward: SmallCNN, loss: CrossEntropyLoss, backward,"
        " optimizer: SGD, zero_grad"
        if workers
        else "auto: 2 DataLoaders (0 workers), forward: SmallCNN, loss: CrossEntropyLoss, backward,"
        " optimizer: SGD, zero_grad"
    )
    assert watched.stderr.startswith(summary.metadata["auto"] + "\n")  # the report's first line
    assert "verdict:" in watched.stderr
    if workers:
        train = summary.phases["train"]
        assert train.stages["loader/dataset"].in_workers and train.stages["loader/collate"].in_workers
        assert train.stages["loader/dataset"].calls == 16 * 5 * 2
        assert sorted(train.workers) == [0, 1]
        assert sum(worker.batches for worker in train.workers.values()) == 6 * 2  # the first batches too


def test_gradient_accumulation_counts_optimizer_steps_apart(tmp_path: Path) -> None:
    program = [CNN, "--accum", "2", "--samples", "160", "--epochs", "1"]
    plain = run(program, tmp_path)
    watched = stepwatch_run(program, tmp_path, tmp_path / "run.json")
    assert watched.returncode == 0, watched.stderr
    assert final_loss(watched.stdout) == final_loss(plain.stdout)
    train = stepwatch.load(tmp_path / "run.json").phases["train"]
    assert train.steps == 9
    assert train.stages["step/forward"].calls == train.stages["step/backward"].calls == 9
    # 10 batches, an optimizer step after every second one: steps 2, 4, ... 10, the first batch's step apart
    assert train.stages["step/optimizer"].calls == train.stages["step/zero_grad"].calls == 5


def test_amp_grad_scaler_backward_is_seen(tmp_path: Path) -> None:
    program = [CNN, "--amp", "--samples", "64", "--epochs", "1"]
    plain = run(program, tmp_path)
    watched = stepwatch_run(program, tmp_path, tmp_path / "run.json")
    assert watched.returncode == 0, watched.stderr
    assert final_loss(watched.stdout) == final_loss(plain.stdout)
    check_train(stepwatch.load(tmp_path / "run.json"), epochs=1, batches=4)


def test_a_busy_dataset_shows_as_loader_time(tmp_path: Path) -> None:
    watched = stepwatch_run([CNN, "--busy-ms", "2", "--samples", "64", "--epochs", "1"], tmp_path, tmp_path / "r.json")
    assert watched.returncode == 0, watched.stderr
    truth = int(re.search(r"busy ns (\d+)", watched.stdout).group(1)) * 1e-9  # type: ignore[union-attr]
    assert truth >= 64 * 0.002
    train = stepwatch.load(tmp_path / "r.json").phases["train"]
    reads = train.stages["loader/dataset"].total + train.stages["first_batch/dataset"].total
    assert truth <= reads <= truth + 64 * OVERHEAD_S  # every read, first batch included
    # a steady wait holds its reads and its collate; the rest of it (loader/other: the sampler, the fetcher,
    # indexing the tensors) is the DataLoader's own work, which the same loop shows without stepwatch too
    loader, inside = train.stages["loader"], train.stages["loader/dataset"].total + train.stages["loader/collate"].total
    assert loader.calls == 3
    assert inside <= loader.total
    assert train.share("loader") >= train.stages["loader/dataset"].total / train.measured > 0.5
    assert "input-bound" in watched.stderr


def test_loop_without_dataloader_has_steps_ended_by_optimizer_steps(tmp_path: Path) -> None:
    plain = run([LM, "30"], tmp_path)
    watched = stepwatch_run([LM, "30"], tmp_path)
    assert watched.returncode == 0, watched.stderr
    assert final_loss(watched.stdout) == final_loss(plain.stdout)
    summary = stepwatch.load(tmp_path / "lm.stepwatch.json")
    assert "each step ends at an optimizer step" in summary.metadata["auto"]
    assert "each step ends at an optimizer step" in watched.stderr
    train = summary.phases["train"]
    # the first optimizer step starts the loop, the second ends its one-off first step: 28 measured steps
    assert train.steps == 28
    for path in ("step/zero_grad", "step/backward", "step/optimizer"):
        assert train.stages[path].calls == 28
    # the loss estimates under no_grad (at steps 10 and 20) run inside measured steps, 3 forwards each: val
    assert train.stages["step/forward"].calls == 28 and "loader" not in train.stages
    assert summary.phases["val"].steps == summary.phases["val"].stages["step/forward"].calls == 2 * 3


def test_exit_codes_and_tracebacks_are_the_programs(tmp_path: Path) -> None:
    failed = stepwatch_run([CNN, "--epochs", "1", "--samples", "32", "--fail"], tmp_path, tmp_path / "f.json")
    plain = run([CNN, "--epochs", "1", "--samples", "32", "--fail"], tmp_path)
    assert failed.returncode == plain.returncode == 1
    traceback = failed.stderr[failed.stderr.index("Traceback") : failed.stderr.index("RuntimeError: diverged")]
    assert traceback == plain.stderr[plain.stderr.index("Traceback") : plain.stderr.index("RuntimeError: diverged")]
    assert "stepwatch" not in traceback and "runpy" not in traceback
    assert failed.stderr.index("RuntimeError: diverged") < failed.stderr.index("verdict:")  # report below it
    assert stepwatch.load(tmp_path / "f.json").phases["train"].steps == 1

    exited = stepwatch_run([CNN, "--epochs", "1", "--samples", "32", "--exit", "3"], tmp_path, tmp_path / "e.json")
    assert exited.returncode == 3
    assert stepwatch.load(tmp_path / "e.json").phases["train"].steps == 1
    assert "verdict:" in exited.stderr


def _wait_and_signal(command: list[str], cwd: Path, signum: int, **env: str) -> subprocess.CompletedProcess[str]:
    def default_sigint() -> None:  # a shell that starts the suite in the background leaves SIGINT ignored
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    process = subprocess.Popen(
        [PYTHON, *command],
        cwd=cwd,
        env=subprocess_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )
    assert process.stdout is not None
    try:
        for line in process.stdout:
            if line.startswith("waiting"):
                break
        process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_saves_the_run_and_reports(tmp_path: Path, signum: int) -> None:
    out = tmp_path / "s.json"
    result = _wait_and_signal(
        ["-m", "stepwatch", "run", "-o", str(out), CNN, "--epochs", "1", "--samples", "32", "--wait"],
        tmp_path,
        signum,
    )
    assert result.returncode == -signum  # died of the signal, as python would
    assert "verdict:" in result.stderr
    if signum == signal.SIGINT:
        assert "KeyboardInterrupt" in result.stderr
    assert stepwatch.load(out).phases["train"].steps == 1


def test_window_and_device_options(tmp_path: Path) -> None:
    out = tmp_path / "w.json"
    program = [CNN, "--epochs", "1", "--samples", "96"]
    result = run(["-m", "stepwatch", "run", "--warmup", "1", "--active", "2", "-o", str(out), *program], tmp_path)
    assert result.returncode == 0, result.stderr
    summary = stepwatch.load(out)
    assert summary.phases["train"].steps == 2 and summary.phases["train"].stages["step/forward"].calls == 2
    assert summary.metadata["config"]["warmup"] == 1 and summary.metadata["config"]["active"] == 2
    # a device this machine lacks: one warning, and the program runs on, uninstrumented on the device side
    cuda = run(["-m", "stepwatch", "run", "--device", "cuda", "-o", str(out), *program], tmp_path)
    assert cuda.returncode == 0, cuda.stderr
    assert "no device timing on cuda" in cuda.stderr
    assert final_loss(cuda.stdout) == final_loss(result.stdout)
    after = stepwatch.load(out)
    assert after.phases["train"].stages["step/forward"].calls == 5  # every step, timed on the CPU
    assert after.metadata["config"]["device"] is None and "device timing" not in after.metadata["auto"]


@pytest.mark.parametrize("ending", ["SIGTERM", "SIGINT", "exception"])
def test_stepwatch_auto_environment_reports_however_the_program_ends(tmp_path: Path, ending: str) -> None:
    out = tmp_path / "e.json"
    program = [CNN, "--epochs", "1", "--samples", "32"]
    if ending == "exception":
        result = run([*program, "--fail"], tmp_path, STEPWATCH="auto", STEPWATCH_OUT=str(out))
        assert result.returncode == 1
        assert result.stderr.index("RuntimeError: diverged") < result.stderr.index("verdict:")
    else:
        signum = getattr(signal, ending)
        result = _wait_and_signal([*program, "--wait"], tmp_path, signum, STEPWATCH="auto", STEPWATCH_OUT=str(out))
        plain = _wait_and_signal([*program, "--wait"], tmp_path, signum)
        assert result.returncode == plain.returncode  # python's own ending, whatever it is for this program
        assert "KeyboardInterrupt" in result.stderr or signum == signal.SIGTERM
    assert result.stderr.count("verdict:") == 1
    assert stepwatch.load(out).phases["train"].steps == 1


def test_module_runs_like_python_dash_m(tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(PROGRAMS)}
    plain = run(["-m", "cnn", "--epochs", "1", "--samples", "32"], tmp_path, **env)
    watched = run(["-m", "stepwatch", "run", "-m", "cnn", "--epochs", "1", "--samples", "32"], tmp_path, **env)
    assert watched.returncode == 0, watched.stderr
    assert final_loss(watched.stdout) == final_loss(plain.stdout)
    assert stepwatch.load(tmp_path / "cnn.stepwatch.json").phases["train"].steps == 1


def test_the_program_sees_what_python_gives_it(tmp_path: Path) -> None:
    script = tmp_path / "sub" / "show.py"
    script.parent.mkdir()
    script.write_text(
        "import sys\nprint(repr(sys.argv), repr(sys.path[0]), repr(__file__), __name__)\n"
        "import pickle\nclass Thing: pass\nprint(pickle.loads(pickle.dumps(Thing())).__class__.__module__)\n"
    )
    plain = run([str(script.relative_to(tmp_path)), "a", "--b"], tmp_path)
    watched = run(["-m", "stepwatch", "run", "-q", str(script.relative_to(tmp_path)), "a", "--b"], tmp_path)
    assert watched.returncode == plain.returncode == 0, watched.stderr
    assert watched.stdout == plain.stdout
    assert "'sub/show.py', 'a', '--b'" in plain.stdout and "__main__" in plain.stdout
    assert watched.stderr == ""  # --quiet: no report


def test_bad_invocations_exit_2_with_one_line(tmp_path: Path) -> None:
    for args, message in (
        ([], "give a script to run"),
        (["missing.py"], "missing.py: no such file"),
        (["--warmup", "-1", CNN], "warmup"),
        (["--val-phase", "a/b", CNN], "must not contain '/'"),
    ):
        result = run(["-m", "stepwatch", "run", *args], tmp_path)
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr, (args, result.stderr)


def test_stepwatch_auto_environment_instruments_an_unchanged_program(tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    plain = run([CNN, "--epochs", "1", "--samples", "48", "--workers", "2"], tmp_path)
    watched = run(
        [CNN, "--epochs", "1", "--samples", "48", "--workers", "2"], tmp_path, STEPWATCH="auto", STEPWATCH_OUT=str(out)
    )
    assert watched.returncode == 0, watched.stderr
    assert final_loss(watched.stdout) == final_loss(plain.stdout)
    summary = stepwatch.load(out)
    check_train(summary, epochs=1, batches=3)
    assert summary.phases["train"].stages["loader/dataset"].in_workers
    assert watched.stderr.startswith("auto: 2 DataLoaders")
    assert not list(tmp_path.glob("*.stepwatch.json"))  # the workers wrote nothing of their own


@pytest.mark.parametrize("how", ["run", "environment"])
def test_spawned_workers_are_timed_inside_and_time_nothing_of_their_own(tmp_path: Path, how: str) -> None:
    program = [CNN, "--epochs", "1", "--samples", "48", "--workers", "2", "--spawn"]
    out = tmp_path / "spawn.json"
    plain = run(program, tmp_path)
    if how == "run":
        watched = stepwatch_run(program, tmp_path, out)  # the workers import the script as __mp_main__
    else:
        watched = run(program, tmp_path, STEPWATCH="auto", STEPWATCH_OUT=str(out))  # they inherit it
    assert watched.returncode == 0, watched.stderr
    assert final_loss(watched.stdout) == final_loss(plain.stdout)
    train = check_train(stepwatch.load(out), epochs=1, batches=3)
    assert train.stages["loader/dataset"].calls == 32 and train.stages["loader/dataset"].in_workers
    assert train.stages["first_batch/dataset"].calls == 16
    assert watched.stderr.count("verdict:") == 1  # one report: the workers print none
    assert sorted(path.name for path in tmp_path.iterdir()) == ["spawn.json"]


def test_stepwatch_auto_in_a_process_that_records_nothing_writes_nothing(tmp_path: Path) -> None:
    result = run(["-c", "import torch; print(torch.ones(2).sum().item())"], tmp_path, STEPWATCH="auto")
    assert result.returncode == 0 and result.stdout == "2.0\n" and result.stderr == ""
    assert os.listdir(tmp_path) == []


def test_a_mingpt_shaped_trainer_with_waiting_workers_is_advised_more_workers(tmp_path: Path) -> None:
    """``next(iter(loader))`` over one endless epoch, 2 workers whose reads sleep (a remote read): each
    worker's CPU share is measured low, so the advice is more workers than cores (not "no core to spare"), and
    persistent_workers is not advised (the workers start once). 4 workers then shorten the iteration, by the
    program's own clock."""
    program = str(PROGRAMS / "mingpt_like.py")
    result = stepwatch_run([program, str(tmp_path / "own2.json"), "2"], tmp_path, tmp_path / "two.json")
    assert result.returncode == 0, result.stderr
    summary = stepwatch.load(tmp_path / "two.json")
    train = summary.phases["train"]
    own = json.loads((tmp_path / "own2.json").read_text())
    assert train.steps == len(own["iterations"]) - 1 and summary.stages["first_batch"].calls == 1
    assert sorted(train.workers) == [0, 1]
    assert all(worker.cpu_share < 0.5 for worker in train.workers.values())  # they sleep
    assert train.stages["loader/dataset"].mean >= own["read_s"]
    verdict = summary.verdict
    assert verdict.kind == "input-bound" and verdict.figures["worker_cpu_share"] < 0.5
    advised = verdict.figures["workers_needed"]
    assert advised > 2 and any(f"use DataLoader(num_workers={advised}) (now 2)" in a for a in verdict.advice)
    assert not any("no core to spare" in a or "persistent_workers" in a for a in verdict.advice), verdict.advice
    assert "1 workers" not in result.stderr and "% of it on the CPU" in result.stderr

    four = run([program, str(tmp_path / "own4.json"), "4"], tmp_path)
    assert four.returncode == 0, four.stderr
    faster = json.loads((tmp_path / "own4.json").read_text())["iterations"][5:]
    slower = own["iterations"][5:]
    assert sum(faster) / len(faster) < 0.75 * sum(slower) / len(slower)


@pytest.mark.parametrize("out", ["folder", "/proc/stepwatch-x.json", ""])
def test_an_output_path_that_cannot_be_written_is_refused_before_the_program_runs(tmp_path: Path, out: str) -> None:
    """A folder, a place where no file can be made, or an empty path: one line and exit 2 before the program
    starts (it used to run whole, then lose its run at exit with exit code 0)."""
    (tmp_path / "folder").mkdir()
    script = tmp_path / "train.py"
    script.write_text("print('the program ran')\n")
    result = run(["-m", "stepwatch", "run", "-o", out, str(script)], tmp_path)
    assert result.returncode == 2 and "the program ran" not in result.stdout
    assert result.stderr.startswith("stepwatch run: ") and len(result.stderr.strip().splitlines()) == 1
    plain = run(["-c", "import stepwatch"], tmp_path, STEPWATCH="1", STEPWATCH_OUT=out or "folder")
    assert plain.returncode == 1 and "ConfigError: STEPWATCH_OUT=" in plain.stderr
    auto = run([str(script)], tmp_path, STEPWATCH="auto", STEPWATCH_OUT=out or "folder")
    assert auto.returncode == 0 and "the program ran" in auto.stdout  # the program runs, unrecorded: said once
    assert auto.stderr.count("not recording") == 1 and len(auto.stderr.strip().splitlines()) == 1


def test_a_module_that_cannot_be_found_and_an_unknown_option_are_one_line(tmp_path: Path) -> None:
    """``stepwatch run -m script.py`` answers as ``python -m`` does, in one line and exit 1, and saves no
    run; ``--bogus`` is an unknown option (exit 2), not a missing script."""
    plain = run(["-m", "nosuch.py"], tmp_path)
    watched = run(["-m", "stepwatch", "run", "-m", "nosuch.py"], tmp_path)
    assert watched.returncode == plain.returncode == 1
    assert len(watched.stderr.strip().splitlines()) == 1
    assert "No module named 'nosuch'" in watched.stderr and "Try using 'nosuch'" in watched.stderr
    assert not list(tmp_path.glob("*.json"))
    bogus = run(["-m", "stepwatch", "run", "--bogus", "x.py"], tmp_path)
    assert bogus.returncode == 2 and "unrecognized arguments: --bogus" in bogus.stderr
    assert "no such file" not in bogus.stderr


def test_stepwatch_auto_says_when_it_replaces_an_earlier_run(tmp_path: Path) -> None:
    first = run([LM, "12"], tmp_path, STEPWATCH="auto")
    assert first.returncode == 0 and "run saved to lm.stepwatch.json\n" in first.stderr, first.stderr
    second = run([LM, "12"], tmp_path, STEPWATCH="auto")
    assert "run saved to lm.stepwatch.json (it replaced the run saved there before)" in second.stderr


def test_a_program_ending_with_os_exit_keeps_its_code_and_its_run(tmp_path: Path) -> None:
    """``os._exit(3)`` skips atexit: the run is saved (and reported) first, then the process ends with 3."""
    script = tmp_path / "train.py"
    script.write_text(
        "import os, stepwatch\n"
        "for _ in stepwatch.timed_iter(range(4)):\n"
        "    with stepwatch.timed('forward'):\n"
        "        pass\n"
        "os._exit(3)\n"
    )
    watched = run(["-m", "stepwatch", "run", "-o", "run.json", str(script)], tmp_path)
    assert watched.returncode == 3, watched.stderr
    assert "run saved to run.json" in watched.stderr and "stepwatch · train · 3 steps" in watched.stderr
    assert stepwatch.load(tmp_path / "run.json").stages["step/forward"].calls == 3
    plain = run([str(script)], tmp_path, STEPWATCH="1", STEPWATCH_OUT=str(tmp_path / "env.json"))
    assert plain.returncode == 3 and stepwatch.load(tmp_path / "env.json").main_phase.steps == 3
