"""``stepwatch.tune(loader, step=fn)`` on real DataLoaders with real worker processes: a dataset whose reads sleep
(I/O-like) gets more workers than cores and a measured gain; a program whose reads cost nothing keeps its
settings; what cannot be rebuilt is refused in one line."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

import stepwatch
from stepwatch._tuning import Setting, Trial, Tuning, load_tuning

from .conftest import spin, stepwatch_command

pytestmark = pytest.mark.slow


class SleepingReads(Dataset[torch.Tensor]):
    """Each sample waits ``read_s`` as a read from a slow disk or the network would: a worker waits, it does
    not compute, so more workers than cores still help."""

    def __init__(self, size: int, read_s: float) -> None:
        self.size, self.read_s = size, read_s

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.read_s)
        return torch.full((4,), float(index))


def busy_step(seconds: float) -> Any:
    def step(batch: torch.Tensor) -> None:
        spin(seconds)

    return step


def test_io_bound_reads_get_more_workers_than_cores_and_a_measured_gain(tmp_path: Path) -> None:
    cores = os.cpu_count() or 1
    # a batch of 4 reads of 8 ms: 32 ms of waiting a batch, against a 4 ms step
    loader = DataLoader(SleepingReads(4000, 0.008), batch_size=4, num_workers=0)
    tuning = stepwatch.tune(loader, step=busy_step(0.004), steps=12)
    assert isinstance(tuning, Tuning) and tuning.original == Setting(0)
    assert tuning.best.num_workers > cores, tuning.render()
    assert tuning.gain < -0.5, tuning.render()  # well more than twice as fast: the reads overlap
    text = tuning.render()
    assert text.startswith("stepwatch tune: the DataLoader settings measured on your own training step")
    assert "num_workers=0 (yours)" in text and "(best)" in text
    assert text.rstrip().splitlines()[-1].startswith(f"recommended: DataLoader(num_workers={tuning.best.num_workers}")
    tuning.save(tmp_path / "tune.json")
    saved = json.loads((tmp_path / "tune.json").read_text())
    assert saved["best"]["num_workers"] == tuning.best.num_workers and len(saved["trials"]) == len(tuning.trials)


def test_free_reads_and_a_cpu_bound_step_keep_the_settings_they_have() -> None:
    """Reads that cost nothing: workers can only add the cost of moving batches between processes."""
    loader = DataLoader(torch.arange(4000.0), batch_size=8, num_workers=0)
    tuning = stepwatch.tune(loader, step=busy_step(0.003), steps=12, max_workers=2)
    assert tuning.best == tuning.original == Setting(0), tuning.render()
    assert tuning.recommendation() == "your settings are already the fastest measured (num_workers=0)"
    assert {trial.setting.num_workers for trial in tuning.trials} <= {0, 1, 2}  # max_workers holds


class BusyReads(Dataset[torch.Tensor]):
    """Each sample computes for ``read_s`` (decoding, augmenting): a worker needs a core for it."""

    def __init__(self, size: int, read_s: float) -> None:
        self.size, self.read_s = size, read_s

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        spin(self.read_s)
        return torch.full((4,), float(index))


def test_cpu_bound_reads_and_step_are_not_sent_past_the_point_where_the_step_stops_improving() -> None:
    """On 2 cores, reads that compute (4 x 1 ms a batch) beside a 4 ms step: workers help until they compete with
    the step for the cores; the search stops two settings past its best, and the best is never slower than
    anything measured beyond the noise."""
    cores = os.cpu_count() or 1
    loader = DataLoader(BusyReads(4000, 0.001), batch_size=4, num_workers=0)
    tuning = stepwatch.tune(loader, step=busy_step(0.004), steps=15)
    tried = sorted({trial.setting.num_workers for trial in tuning.trials})
    assert max(tried) <= max(cores, tuning.best.num_workers + 2) + 1, (tried, tuning.render())
    best = tuning.of(tuning.best)
    for setting in {trial.setting for trial in tuning.trials}:
        other = tuning.of(setting)
        assert best.per_step <= other.per_step + max(best.noise, other.noise), tuning.render()


def test_spawned_workers_and_a_batch_sampler_of_its_own_are_kept() -> None:
    from torch.utils.data import BatchSampler, SequentialSampler

    batches = BatchSampler(SequentialSampler(range(400)), batch_size=4, drop_last=False)
    loader = DataLoader(
        SleepingReads(400, 0.004), batch_sampler=batches, num_workers=1, multiprocessing_context="spawn"
    )
    tuning = stepwatch.tune(loader, step=busy_step(0.002), steps=8, max_workers=2)
    assert tuning.original == Setting(1) and {t.setting.num_workers for t in tuning.trials} >= {0, 1, 2}
    assert "the batch sampler (BatchSampler) is reused as it is" in tuning.render()


class Stream(IterableDataset[int]):
    def __iter__(self) -> Any:
        return iter(range(10))


@pytest.mark.parametrize(
    ("thing", "error"),
    [
        ([1, 2, 3], "tune needs a torch DataLoader, got list"),
        (DataLoader(Stream(), batch_size=2), "cannot rebuild a DataLoader over an IterableDataset"),
        (DataLoader(range(10), batch_size=None), "does not batch"),
    ],
)
def test_what_cannot_be_tuned_is_said_in_one_line(thing: Any, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        stepwatch.tune(thing, step=lambda batch: None)


# -- stepwatch tune train.py, in real subprocesses ------------------------------------------------------------

PROGRAMS = Path(__file__).parent / "programs"


def test_tune_runs_the_programs_own_loop_recommends_and_stops_it(tmp_path: Path) -> None:
    """The reads of io_train.py sleep 6 ms a sample: more workers than cores help. The program is stopped once the
    search is done (it never reaches its own end, nor writes its checkpoint); the table is saved and printed
    again by stepwatch report; the recommendation, applied by hand and timed by stepwatch run, holds."""
    cores = os.cpu_count() or 1
    done = stepwatch_command("tune", "-o", "tune.json", str(PROGRAMS / "io_train.py"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "training done" not in done.stdout and not (tmp_path / "checkpoint.pt").exists()
    last = done.stderr.rstrip().splitlines()[-1]
    assert last.startswith("stepwatch tune: stopped the program at step ") and "for measuring only" in last
    tuning = load_tuning(tmp_path / "tune.json")
    assert tuning is not None and tuning.original == Setting(0)
    assert tuning.best.num_workers > cores and tuning.gain < -0.5, done.stderr
    assert f"recommended: DataLoader({tuning.best.describe()})" in done.stderr
    report = stepwatch_command("report", "tune.json", cwd=tmp_path)
    assert report.returncode == 0 and report.stdout == tuning.render()

    options = ["--workers", str(tuning.best.num_workers)]
    if tuning.best.prefetch_factor:
        options += ["--prefetch", str(tuning.best.prefetch_factor)]
    timed = stepwatch_command(
        "run", "-q", "--warmup", "5", "--active", "100", "--stop", "-o", "run.json",
        str(PROGRAMS / "io_train.py"), *options, cwd=tmp_path,
    )  # fmt: skip
    assert timed.returncode == 0, timed.stderr
    train = stepwatch.load(tmp_path / "run.json").phases["train"]
    promised = tuning.of(tuning.best)
    by_hand = train.measured / train.steps
    # two measurements of one setting, each noisy: the table's figure and the by-hand run's agree within the spread
    # of the time per step each states (the loader's and the step's rows add up in the by-hand run)
    by_hand_spread = (train.stages["loader"].std ** 2 + train.stages["step"].std ** 2) ** 0.5
    tolerance = promised.spread + by_hand_spread
    assert abs(by_hand - promised.per_step) <= tolerance, (by_hand, promised.per_step, promised.spread, by_hand_spread)


def test_tune_says_when_the_program_has_no_dataloader_loop(tmp_path: Path) -> None:
    done = stepwatch_command("tune", str(PROGRAMS / "nanogpt_like.py"), cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "stepwatch tune: 20 optimizer steps and no loop over a DataLoader: the program makes its batches itself"
        " (nanoGPT-style slicing), there is no DataLoader to tune"
    )


def test_tune_refuses_bad_options_in_one_line(tmp_path: Path) -> None:
    done = stepwatch_command("tune", "--steps", "1", str(PROGRAMS / "io_train.py"), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == "stepwatch tune: --steps must be at least 2 and --max-workers at least 0"
    assert (
        stepwatch_command("tune", "missing.py", cwd=tmp_path).stderr.strip()
        == "stepwatch tune: missing.py: no such file"
    )


def test_with_an_accelerator_the_other_pinning_is_tried_for_the_best() -> None:
    """The search itself (``plan``), driven with trials of known times: workers help up to 2, prefetching does
    not, and pinning (tried only with an accelerator in use) does."""
    from stepwatch._tune import plan

    def trial(setting: Setting, ms: float) -> Trial:
        return Trial(setting, (ms / 1e3,) * 10, (0.0,) * 10, 0.01)

    times = {0: 30.0, 1: 16.0, 2: 9.0}
    search = plan(Setting(0), max_workers=2, pin_memory=False)
    asked = [next(search)]
    chosen = None
    while chosen is None:
        setting = asked[-1]
        ms = times.get(setting.num_workers, 9.0)
        if setting.pin_memory:
            ms = 7.0
        try:
            asked.append(search.send(trial(setting, ms)))
        except StopIteration as done:
            chosen = done.value
    assert asked == [
        Setting(0),
        Setting(1),
        Setting(2),
        Setting(2, 4),
        Setting(2, 8),
        Setting(2, None, True),
        Setting(0),
        Setting(2, None, True),
    ]
    assert chosen == Setting(2, None, True) and chosen.describe() == "num_workers=2, pin_memory=True"
