"""The Lightning integration against the real Trainer (CPU, synthetic data, nothing downloaded)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import stepwatch
from stepwatch import Summary
from stepwatch.integrations.lightning import StepwatchProfiler

from .conftest import PYTHON, subprocess_env

sys.path.insert(0, str(Path(__file__).parent / "programs"))
import lightning_train

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def leave_the_default_stopwatch_clean() -> Iterator[None]:
    yield
    stepwatch.disable()
    stepwatch.reset()


def children_fit_in(phase: stepwatch.PhaseSummary, parent: str) -> None:
    """A parent's direct children never add up to more than the parent: its ``other`` is never negative."""
    stage = phase.stages[parent]
    direct = [s for path, s in phase.stages.items() if path.rsplit("/", 1)[0] == parent and path != parent]
    assert sum(s.total for s in direct if not s.in_workers and s.name != "other") <= stage.total * 1.0001, parent


@pytest.mark.parametrize("workers", [0, 2])
def test_training_and_validation_get_the_full_breakdown(tmp_path: Path, workers: int) -> None:
    plain, _ = lightning_train.train(workers=workers, busy_s=0.0005)
    profiler = StepwatchProfiler(out=tmp_path / "pl.json")
    model, _ = lightning_train.train(profiler, workers=workers, busy_s=0.0005)
    assert torch.equal(model.last_loss, plain.last_loss)  # the same training, bit for bit
    for a, b in zip(model.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a, b)

    summary = profiler.summary()
    assert isinstance(summary, Summary)
    train = summary.phases["train"]
    # 20 optimizer steps of 2 batches: 40 batches over 3 epochs (16, 16, 8), each epoch's first step apart
    assert train.steps == 37
    for path in ("loader", "step", "step/h2d", "step/forward", "step/backward"):
        assert train.stages[path].calls == 37, path
    # the optimizer runs every second batch: 20 times, never in an epoch's one-off first step (its first batch)
    assert train.stages["step/optimizer"].calls == 20 and "first_step/optimizer" not in train.stages
    assert train.stages["step/zero_grad"].calls + train.stages["first_step/zero_grad"].calls == 20
    assert train.counters["samples"] == 37 * 8
    for parent in ("step", "step/backward", "loader"):
        children_fit_in(train, parent)
    # the optimizer's row is its own time: the closure's stages are the step's, not nested in it
    assert not any(path.startswith("step/optimizer/") for path in train.stages)
    assert "step/callbacks" not in train.stages or train.stages["step/callbacks"].calls > 0
    assert train.stages["step/hooks/on_train_batch_start"].calls == 37

    val = summary.phases["val"]
    assert val.stages["step/forward"].calls == val.steps > 0
    assert not any("backward" in path for path in val.stages)
    # the sanity check, then a validation inside the step of the 10th batch of epochs 1 and 2 (the third has 8):
    # each is its own phase's loop (taken out of the enclosing step, as any nested loop of another phase is)
    assert val.steps == 3
    assert train.stages["step/hooks/on_validation_model_eval"].calls == 2

    dataset = train.stages["loader/dataset"]
    assert dataset.in_workers == (workers > 0)
    assert dataset.calls == 37 * 8
    assert dataset.mean >= 0.0005  # the busy-wait, read in the main process or in the workers
    if workers:
        assert sorted(train.workers) == [0, 1]
    else:
        truth = lightning_train.BUSY_NS[0] * 1e-9  # every training sample read, first batches included
        reads = dataset.total + train.stages["first_batch/dataset"].total
        assert truth <= reads <= truth + 320 * 0.0005
        assert train.share("loader") >= dataset.total / train.measured  # the reads are inside the wait

    saved = stepwatch.load(tmp_path / "pl.json")
    assert saved.phases["train"].steps == 37
    report = subprocess.run(
        [PYTHON, "-m", "stepwatch", "report", str(tmp_path / "pl.json")],
        env=subprocess_env(),
        capture_output=True,
        text=True,
    )
    assert report.returncode == 0 and "stepwatch · train · 37 steps" in report.stdout


def test_manual_optimization_with_two_optimizers(tmp_path: Path) -> None:
    plain, _ = lightning_train.train(manual=True, max_steps=10)
    profiler = StepwatchProfiler(out=tmp_path / "manual.json")
    model, _ = lightning_train.train(profiler, manual=True, max_steps=10)
    assert torch.equal(model.last_loss, plain.last_loss)
    train = profiler.summary().phases["train"]
    # Lightning's global step counts every optimizer's steps: 10 of them are 5 batches, the first apart
    assert train.steps == 4
    # manual optimization: backward and both optimizers' steps run inside training_step
    assert train.stages["step/forward/backward"].calls == 4
    assert train.stages["step/forward/optimizer"].calls == 8
    children_fit_in(train, "step/forward")


def test_the_report_is_written_at_the_end_of_fit(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    profiler = StepwatchProfiler(warmup=2)
    lightning_train.train(profiler, max_steps=4)
    text = "\n".join(record.getMessage() for record in caplog.records)
    assert "stepwatch · train" in text and "verdict:" in text
    assert profiler.out is not None and Path(profiler.out).name == "stepwatch.json"
    assert stepwatch.load(profiler.out).metadata["config"]["warmup"] == 2
    assert not stepwatch.is_enabled()  # the profiler switched it on, and off again
    assert stepwatch._default.schedule.warmup == 0  # with its own window, then the default's again
    assert not hasattr(torch.utils.data.DataLoader.__iter__, "__wrapped__")  # its patch is gone
    Path(profiler.out).unlink()


def test_importing_stepwatch_never_imports_lightning() -> None:
    code = "import sys, stepwatch; print('lightning' in sys.modules or 'pytorch_lightning' in sys.modules)"
    result = subprocess.run([PYTHON, "-c", code], env=subprocess_env(), capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr


@pytest.mark.slow
def test_on_two_ddp_ranks_rank_0_gathers_and_reports_all_ranks(tmp_path: Path) -> None:
    """Lightning's own DDP launcher starts rank 1; at the end of fit each rank saves, rank 0 gathers."""
    programs = Path(__file__).parent / "programs"
    result = subprocess.run(
        [PYTHON, str(programs / "lightning_ddp.py"), "runs/l.json"],
        cwd=tmp_path,
        env=subprocess_env(PYTHONPATH=str(programs), OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert output.count("stepwatch · all ranks · train · 2 ranks") == 1  # on rank 0 only
    assert "run saved to runs/l.json" in output
    assert sorted(path.name for path in (tmp_path / "runs").iterdir()) == ["l.json", "l.rank0.json", "l.rank1.json"]
    gathered = stepwatch._all_ranks.load_ranks(tmp_path / "runs" / "l.json")
    assert [run.metadata["rank"] for run in gathered.runs] == [0, 1] and not gathered.missing
    own = [stepwatch.load(tmp_path / "runs" / f"l.rank{rank}.json") for rank in (0, 1)]
    for run, alone in zip(gathered.runs, own, strict=True):
        assert {p: s.total_ns for p, s in run.stages.items()} == {p: s.total_ns for p, s in alone.stages.items()}
        assert run.main_phase.steps == alone.main_phase.steps > 0


@pytest.mark.parametrize("kind", ["test", "predict"])
def test_test_and_predict_are_phases_of_their_own(tmp_path: Path, kind: str) -> None:
    """``trainer.test`` and ``trainer.predict`` are mapped as validation is: each its own phase, its fetches
    the ``loader`` wait, its ``test_step`` / ``predict_step`` the ``forward``, its workers' pipeline brought
    back; the results are the trainer's own."""
    _, plain = lightning_train.evaluate(kind, workers=2, busy_s=0.0005)
    profiler = StepwatchProfiler(out=tmp_path / f"{kind}.json")
    _, result = lightning_train.evaluate(kind, profiler, workers=2, busy_s=0.0005)
    if kind == "predict":
        assert all(torch.equal(a, b) for a, b in zip(result, plain, strict=True))
    else:
        assert result == plain
    summary = profiler.summary()
    assert list(summary.phases) == [kind]
    phase = summary.phases[kind]
    assert phase.steps == 5  # 6 batches, the first apart
    assert phase.stages["loader"].calls == phase.stages["step/forward"].calls == 5
    assert phase.stages["loader/dataset"].in_workers and phase.stages["loader/dataset"].mean >= 0.0005
    assert summary.metadata["loaders"][kind]["num_workers"] == 2
    assert stepwatch.load(tmp_path / f"{kind}.json").phases[kind].steps == 5


def test_every_run_is_saved_and_undone_whether_it_fails_or_the_profiler_is_reused(tmp_path: Path) -> None:
    """A training_step that raises mid-fit (Lightning then calls no teardown): the part recorded is saved and
    stepwatch is left as found. The same profiler for fit then test, and for a second Trainer: each run is
    saved (the later ones beside the first, named by their stage), ``summary()`` is the latest run, and
    stepwatch is off and torch unpatched after each."""
    original_iter = torch.utils.data.DataLoader.__iter__
    failing = StepwatchProfiler(out=tmp_path / "failed.json")
    with pytest.raises(RuntimeError, match="diverged"):
        lightning_train.train(failing, fail_at=7)
    assert not stepwatch.is_enabled() and torch.utils.data.DataLoader.__iter__ is original_iter
    partial = stepwatch.load(tmp_path / "failed.json")
    assert partial.phases["train"].steps == 7  # batches 1..7 (the first apart), the 7th's step ended by its error
    assert not any("OnException" in path for path in partial.stages)  # stepwatch's own callback is no stage

    reused = StepwatchProfiler(out=tmp_path / "pl.json")
    lightning_train.train(reused, max_steps=4)
    assert reused.summary().phases["train"].steps == 7  # 8 batches (4 optimizer steps of 2), the first apart
    lightning_train.evaluate("test", reused)
    assert list(reused.summary().phases) == ["test"]
    assert not stepwatch.is_enabled() and torch.utils.data.DataLoader.__iter__ is original_iter
    assert stepwatch.load(tmp_path / "pl.json").phases["train"].steps == 7
    assert list(stepwatch.load(tmp_path / "pl.test2.json").phases) == ["test"]
    lightning_train.train(reused, max_steps=2)  # a second Trainer
    assert stepwatch.load(tmp_path / "pl.fit3.json").phases["train"].steps == 3
    assert not stepwatch.is_enabled() and torch.utils.data.DataLoader.__iter__ is original_iter


def test_stop_ends_the_fit_once_the_window_is_measured(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``StepwatchProfiler(active=N, stop=True)``: Lightning's own ``should_stop`` ends the fit after the window;
    the fit ends as usual (its report and saved run), long before ``max_steps``."""
    profiler = StepwatchProfiler(out=tmp_path / "pl.json", warmup=1, active=5, stop=True)
    _, trainer = lightning_train.train(profiler, max_steps=20)
    assert trainer.should_stop and trainer.global_step < 20
    summary = stepwatch.load(tmp_path / "pl.json")
    assert isinstance(summary, Summary) and summary.phases["train"].steps == 5
    assert "the measured window closed at step 6: ending the training" in capsys.readouterr().err
    assert stepwatch._default.window_end.stop_with is None  # left as it was found


def test_stop_needs_a_window_that_closes() -> None:
    with pytest.raises(ValueError, match="stop needs active"):
        StepwatchProfiler(stop=True)


def test_flops_of_a_step_are_counted_and_reported(tmp_path: Path) -> None:
    """``StepwatchProfiler(flops=True)``: the FLOPs of one batch of the tests' model (Linear 8->16, 16->2 and a
    2->2 head on 8 samples: forward 2,624; backward 3,200, the input needing no gradient), in the report and the
    saved run, with MFU against a given peak."""
    profiler = StepwatchProfiler(out=tmp_path / "pl.json", flops=True, peak_flops=1e9)
    lightning_train.train(profiler, max_steps=6)
    run = stepwatch.load(tmp_path / "pl.json")
    record = run.metadata["flops"]["train"]
    assert (record["forward"], record["backward"], record["at_step"]) == (2624, 3200, 2)
    assert run.metadata["peak_flops"] == 1e9
    text = stepwatch.render(run)
    assert "FLOPs: 5.82 kFLOP a step, counted on step 2 (kept out of the timing)" in text
    assert "MFU (the given peak, fp32)" in text
