"""The Hugging Face Trainer integration against the real Trainer (a tiny BERT from a config: nothing downloaded)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import stepwatch
from stepwatch._dataloader.in_workers import TimedCollate
from stepwatch._schedule import Schedule
from stepwatch.integrations.transformers import attach

from .conftest import PYTHON, subprocess_env

sys.path.insert(0, str(Path(__file__).parent / "programs"))
import hf_train
from transformers import TrainerCallback

pytestmark = pytest.mark.slow
KEYS = ("stepwatch/loader_ms", "stepwatch/input_share", "stepwatch/samples_per_s", "stepwatch/forward_ms")


@pytest.fixture(autouse=True)
def leave_the_default_stopwatch_clean() -> Iterator[None]:
    yield
    stepwatch.disable()
    stepwatch.reset()


class SeesLogs(TrainerCallback):  # type: ignore[misc]
    """A callback standing for report_to's integrations: what on_log receives."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        self.seen.append(dict(logs or {}))


def test_training_gets_the_breakdown_and_the_logs_carry_it(tmp_path: Path) -> None:
    plain = hf_train.make_trainer(tmp_path / "plain")
    plain.train()
    sees = SeesLogs()
    trainer = hf_train.make_trainer(tmp_path / "out", busy_s=0.0005, callbacks=[sees])
    attachment = attach(trainer)
    trainer.train()
    assert trainer.state.log_history[-1]["train_loss"] == plain.state.log_history[-1]["train_loss"]

    summary = attachment.summary
    assert summary is not None
    train = summary.phases["train"]
    # 12 optimizer steps of 2 micro-batches of 8; the first step apart
    assert train.steps == 11
    assert train.stages["loader"].calls == train.stages["step/optimizer"].calls == 11
    for path in ("step/h2d", "step/forward", "step/backward"):
        assert train.stages[path].calls == 22, path
    assert train.counters["samples"] == 11 * 16
    direct = [s for p, s in train.stages.items() if p.count("/") == 1 and p.startswith("step/") and s.name != "other"]
    assert sum(s.total for s in direct) <= train.stages["step"].total  # the stages add up to the step
    # evaluations at steps 5 and 10, and at the last step (12)
    assert train.stages["step/log"].calls >= 6 and train.stages["step/eval"].calls == 3

    # a busy-wait in the dataset: every sample is read inside the wait (no workers)
    truth = hf_train.BUSY_NS[0] * 1e-9
    waits = train.stages["loader"].total + train.stages["first_batch"].total
    assert truth <= waits
    assert train.share("loader") >= (truth - train.stages["first_batch"].total) / train.measured

    val = summary.phases["val"]  # three evaluations of 2 batches: prediction steps, the first of each apart
    assert val.steps == 3 and val.stages["step/forward"].calls == 3

    # stepwatch's figures reach log_history and every callback's on_log
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert all(key in logged[-1] for key in KEYS)
    assert all(key in sees.seen[-1] for key in KEYS)
    assert 0 < logged[-1]["stepwatch/input_share"] < 1

    out = tmp_path / "out" / "stepwatch.json"
    assert stepwatch.load(out).phases["train"].steps == 11
    report = subprocess.run(
        [PYTHON, "-m", "stepwatch", "report", str(out)], env=subprocess_env(), capture_output=True, text=True
    )
    assert report.returncode == 0 and "stepwatch · train · 11 steps" in report.stdout
    attachment.detach()
    assert "get_batch_samples" not in vars(trainer) and "log" not in vars(trainer)
    assert "backward" not in vars(trainer.accelerator)
    assert not any(type(cb).__name__ == "StepwatchCallback" for cb in trainer.callback_handler.callbacks)


def test_with_workers_the_pipeline_comes_back_from_inside_them_and_the_advice_reads_the_loader(
    tmp_path: Path,
) -> None:
    """``dataloader_num_workers=2``: Accelerate wraps the DataLoader; the configuration is read through the
    wrapper and the workers' dataset and collate rows come back."""
    busy_s = 0.002
    trainer = hf_train.make_trainer(tmp_path / "out", busy_s=busy_s, num_workers=2)
    attachment = attach(trainer)
    trainer.train()
    attachment.detach()
    summary = attachment.summary
    assert summary is not None
    train = summary.phases["train"]
    assert summary.metadata["loaders"]["train"]["num_workers"] == 2
    dataset = train.stages["loader/dataset"]
    assert dataset.in_workers and train.stages["loader/collate"].in_workers
    assert dataset.mean >= busy_s  # each read busy-waits 2 ms in a worker (a lower bound: preemption)
    # busy-waits: on the CPU, or waiting for a core when the machine is busy (never waiting on I/O)
    assert sorted(train.workers) == [0, 1] and all(w.needs_core_share > 0.8 for w in train.workers.values())
    assert summary.metadata["loaders"]["val"]["num_workers"] == 2
    assert not any("(now 0)" in advice for advice in summary.verdict.advice), summary.verdict.advice
    loader = attachment.loader_of["train"]  # the torch DataLoader inside Accelerate's wrapper, put back
    assert type(loader).__name__ == "DataLoader" and not isinstance(loader.collate_fn, TimedCollate)
    assert "_get_iterator" not in vars(loader) and not attachment.loaders


def test_a_trainer_without_the_expected_methods_is_refused_by_name(tmp_path: Path) -> None:
    trainer = hf_train.make_trainer(tmp_path)
    trainer.get_batch_samples = None
    with pytest.raises(RuntimeError, match=r"transformers \d+\.\d+.* has no get_batch_samples"):
        attach(trainer)


def test_importing_stepwatch_never_imports_transformers() -> None:
    code = "import sys, stepwatch; print('transformers' in sys.modules)"
    result = subprocess.run([PYTHON, "-c", code], env=subprocess_env(), capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr


@pytest.mark.slow
def test_under_torchrun_rank_0_gathers_and_reports_all_ranks(tmp_path: Path) -> None:
    programs = Path(__file__).parent / "programs"
    command = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    result = subprocess.run(
        [*command, str(programs / "hf_ddp.py"), "outdir", "runs/h.json"],
        cwd=tmp_path,
        env=subprocess_env(PYTHONPATH=str(programs), OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("stepwatch · all ranks · train · 2 ranks") == 1  # on rank 0 only
    assert result.stderr.count("stepwatch · train ·") == 1 and "run saved to runs/h.json" in result.stderr
    assert sorted(path.name for path in (tmp_path / "runs").iterdir()) == ["h.json", "h.rank0.json", "h.rank1.json"]
    gathered = stepwatch._all_ranks.load_ranks(tmp_path / "runs" / "h.json")
    assert [run.metadata["rank"] for run in gathered.runs] == [0, 1] and not gathered.missing
    assert all(run.main_phase.steps == 5 and "step/backward" in run.stages for run in gathered.runs)


class FailsAt(TrainerCallback):  # type: ignore[misc]
    """Raises at the end of optimizer step ``step``: a training that fails midway."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            raise RuntimeError("diverged")


def test_a_failing_train_saves_its_part_and_attach_twice_or_train_twice_count_once(tmp_path: Path) -> None:
    """``train()`` that raises at step 6 saves the 6 steps recorded and leaves stepwatch off; attaching twice is
    attaching once (no ``step/forward/forward``, samples not counted twice); a second ``train()`` is a run of
    its own."""
    trainer = hf_train.make_trainer(tmp_path / "out", max_steps=12, callbacks=[FailsAt(6)])
    attachment = attach(trainer)
    assert attach(trainer) is attachment
    with pytest.raises(RuntimeError, match="diverged"):
        trainer.train()
    assert not stepwatch.is_enabled()
    saved = stepwatch.load(tmp_path / "out" / "stepwatch.json")
    train = saved.phases["train"]
    assert train.steps == 5  # 6 optimizer steps, the first apart
    assert not any(path.endswith("forward/forward") for path in train.stages)
    assert train.counters["samples"] == 5 * 16  # 2 micro-batches of 8 a step, counted once
    attachment.detach()
    assert "_stepwatch_attachment" not in vars(trainer) and "train" not in vars(trainer)

    again = hf_train.make_trainer(tmp_path / "twice", max_steps=6)
    twice = attach(again)
    again.train()
    assert stepwatch.load(tmp_path / "twice" / "stepwatch.json").phases["train"].steps == 5  # not the failed run's
    again.train()  # resumes nothing: a second run of 6 optimizer steps
    assert twice.summary is not None and twice.summary.phases["train"].steps == 5
    assert stepwatch.load(tmp_path / "twice" / "stepwatch.json").phases["train"].steps == 5
    twice.detach()
    twice.detach()  # twice is harmless
    assert not stepwatch.is_enabled()


def test_stop_ends_train_once_the_window_is_measured(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``stepwatch.enable(active=N, stop=True)`` before ``attach``: the Trainer's own control ends ``train``
    after the window; the run is saved and reported as at any end of ``train``."""
    stepwatch.enable(warmup=1, active=4, stop=True)
    trainer = hf_train.make_trainer(tmp_path / "out", max_steps=12)
    attachment = attach(trainer)
    try:
        trainer.train()
    finally:  # the default stopwatch's schedule as every other test finds it
        stepwatch.disable()
        stepwatch._default.schedule = Schedule()
        stepwatch._default.window_end.stop = False
    assert trainer.state.global_step < 12
    assert attachment.summary is not None and attachment.summary.phases["train"].steps == 4
    assert "the measured window closed at step 5: ending the training" in capsys.readouterr().err
    assert stepwatch._default.window_end.stop_with is None


def test_with_flops_the_logs_carry_flop_s_and_mfu(tmp_path: Path) -> None:
    """``stepwatch.enable(flops=True, peak_flops=...)`` before ``train()``: the FLOPs of one optimizer step of the
    tests' BERT, and FLOP/s and MFU in what the Trainer logs."""
    stepwatch.enable(flops=True, peak_flops=1e12)
    trainer = hf_train.make_trainer(tmp_path / "out")
    attach(trainer)
    try:
        trainer.train()
    finally:
        stepwatch.disable()
    logged = [entry for entry in trainer.state.log_history if "stepwatch/flops_per_s" in entry]
    assert logged and logged[-1]["stepwatch/flops_per_s"] > 0 and 0 < logged[-1]["stepwatch/mfu"] < 1
    run = stepwatch.load(tmp_path / "out" / "stepwatch.json")
    record = run.metadata["flops"]["train"]
    assert record["backward"] > record["forward"] > 0
    stepwatch.reset()
