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
from stepwatch._tune import Setting, Tuning

from .conftest import spin

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


class Stream(IterableDataset[int]):
    def __iter__(self) -> Any:
        return iter(range(10))


@pytest.mark.parametrize(
    ("thing", "error"),
    [
        ([1, 2, 3], "tune needs a torch DataLoader, got list"),
        (DataLoader(Stream(), batch_size=2), "cannot rebuild a DataLoader over an IterableDataset"),
        (DataLoader(range(10), batch_size=None), "batch_sampler of its own"),
    ],
)
def test_what_cannot_be_tuned_is_said_in_one_line(thing: Any, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        stepwatch.tune(thing, step=lambda batch: None)
