"""Resume through a real checkpoint: state_dict -> torch.save -> torch.load(weights_only=True)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from stepwatch import FormatError, Stopwatch

from .conftest import FakeClock


def train(sw: Stopwatch, clock: FakeClock, steps: int, ms_per_step: int = 2) -> None:
    for _ in sw.timed_iter(range(steps)):
        with sw.timed("forward"):
            clock.advance(ms_per_step * 1_000_000)
        sw.count(samples=10)


def checkpoint_round_trip(state: dict[str, Any], path: Path) -> dict[str, Any]:
    torch.save({"model": {"w": torch.zeros(2)}, "stepwatch": state}, path)
    loaded = torch.load(path, weights_only=True)
    return loaded["stepwatch"]  # type: ignore[no-any-return]


def test_totals_counters_schedule_and_elapsed_carry_on(tmp_path: Path, clock: FakeClock) -> None:
    first = Stopwatch(clock=clock, active=8)
    first.enable()
    train(first, clock, 5)
    clock.advance(3_000_000_000)  # time outside loops still counts in the run's elapsed time
    state = checkpoint_round_trip(first.state_dict(), tmp_path / "ckpt.pt")
    elapsed_at_save = first.summary().elapsed

    clock.advance(60_000_000_000)  # the job is down for a minute: not part of the run
    second = Stopwatch(clock=clock, active=8)
    second.enable()
    second.load_state_dict(state)
    train(second, clock, 5)  # only 3 more steps are inside the 8-step window
    summary = second.summary()
    # 8 measured steps, of which each epoch's first (one per run) is reported apart
    assert summary.stages["step/forward"].calls == 6 and summary.stages["first_step/forward"].calls == 2
    assert summary.main_phase.steps == 6
    assert summary.main_phase.counters["samples"] == 60
    assert summary.throughput["samples"] == pytest.approx(60 / 0.012)  # counts and time both carried
    assert summary.elapsed == pytest.approx(elapsed_at_save + 0.010)


def test_resumed_run_equals_an_uninterrupted_one(tmp_path: Path, clock: FakeClock) -> None:
    whole = Stopwatch(clock=clock)
    whole.enable()
    train(whole, clock, 3)
    train(whole, clock, 3)  # the resumed run below starts a new epoch too

    part = Stopwatch(clock=clock)
    part.enable()
    train(part, clock, 3)
    resumed = Stopwatch(clock=clock)
    resumed.enable()
    resumed.load_state_dict(checkpoint_round_trip(part.state_dict(), tmp_path / "c.pt"))
    train(resumed, clock, 3)
    assert dict(resumed.summary().stages) == dict(whole.summary().stages)
    assert resumed.summary().throughput == whole.summary().throughput


def test_a_program_that_counts_its_own_samples_still_does_after_a_resume(tmp_path: Path) -> None:
    """Once a program counts its samples itself, watch() stops counting them from the batches, for the rest of the
    run: a resumed run keeps that (a run whose validation loop counted its samples once, then ran a loop that
    counts none, counted the same after a checkpoint between the two as without one; before, the resumed one counted
    the second loop's batches too). Found by running random programs whole and split by a checkpoint."""
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(8, 1)), batch_size=2)

    def validate(sw: Stopwatch, counts: bool) -> None:
        for (batch,) in sw.watch(loader, phase="val"):
            if counts:
                sw.count(samples=len(batch))

    whole, part, resumed = Stopwatch(), Stopwatch(), Stopwatch()
    for sw in (whole, part, resumed):
        sw.enable()
    validate(whole, True)
    validate(whole, False)
    validate(part, True)
    state = checkpoint_round_trip(part.state_dict(), tmp_path / "c.pt")
    assert state["batch_samples"]["val"] is None
    resumed.load_state_dict(state)
    validate(resumed, False)
    assert resumed.summary().phases["val"].counters == whole.summary().phases["val"].counters == {"samples": 6}
    older = {key: value for key, value in state.items() if key != "batch_samples"}  # a state saved before it
    from_older = Stopwatch()
    from_older.enable()
    from_older.load_state_dict(older)
    validate(from_older, False)
    assert from_older.summary().phases["val"].counters == {"samples": 12}  # loads, and counts the batches


def test_the_batches_count_is_dropped_when_the_program_starts_counting_after_a_resume(tmp_path: Path) -> None:
    """watch() counts a loop's samples from its batches until the program counts samples itself, whose count then
    replaces the batches' (what they counted is dropped). A checkpoint in between keeps the two apart: the resumed
    run drops the batches' count as the uninterrupted one does (before, the batches' samples were saved among the
    program's and kept)."""
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(8, 1)), batch_size=2)

    def train(sw: Stopwatch, counts: bool) -> None:
        for (batch,) in sw.watch(loader):
            if counts:
                sw.count(samples=10 * len(batch))

    whole, part, resumed = Stopwatch(), Stopwatch(), Stopwatch()
    for sw in (whole, part, resumed):
        sw.enable()
    train(whole, False)
    train(whole, True)
    train(part, False)
    state = checkpoint_round_trip(part.state_dict(), tmp_path / "c.pt")
    assert state["batch_samples"]["train"] == 6 and state["summary"]["phases"]["train"]["counters"] == {"samples": 6}
    resumed.load_state_dict(state)
    assert resumed.summary().phases["train"].counters == {"samples": 6}  # as saved, before the program counts
    train(resumed, True)
    assert resumed.summary().phases["train"].counters == whole.summary().phases["train"].counters == {"samples": 60}


def test_state_dict_is_plain_python(clock: FakeClock) -> None:
    sw = Stopwatch(clock=clock)
    sw.enable()
    train(sw, clock, 3)

    def check(value: object) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                assert isinstance(key, str)
                check(item)
        elif isinstance(value, list):
            for item in value:
                check(item)
        else:
            assert value is None or type(value) in (str, int, float, bool), type(value)

    check(sw.state_dict())


def test_devices_are_appended_not_replaced(tmp_path: Path, clock: FakeClock) -> None:
    first = Stopwatch(clock=clock)
    first.enable()
    state = first.state_dict()
    state["devices"] = ["cuda:0 NVIDIA A100"]  # as written by an earlier run on another machine
    second = Stopwatch(clock=clock)
    second.load_state_dict(checkpoint_round_trip(state, tmp_path / "c.pt"))
    devices = second.summary().metadata["devices"]
    assert devices[0] == "cuda:0 NVIDIA A100"
    assert devices[1:] == first.devices()


def test_load_state_dict_rejects_foreign_data() -> None:
    sw = Stopwatch()
    with pytest.raises(FormatError, match="not a stepwatch state_dict"):
        sw.load_state_dict({"weights": [1, 2]})
    with pytest.raises(FormatError, match="corrupt state_dict"):
        sw.load_state_dict({"stepwatch_state": 1, "summary": {}})
