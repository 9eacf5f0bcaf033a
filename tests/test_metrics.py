"""metrics(), log_every() and the TensorBoard writer: figures for any logger, every N training steps."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import stepwatch
from stepwatch import _loops
from stepwatch._periodic import Every, PeriodicCalls
from stepwatch.integrations import tensorboard

from .conftest import FakeClock

MS = 1_000_000


def train(sw: stepwatch.Stopwatch, clock: FakeClock, steps: int, phase: str | None = None) -> None:
    """A loop on the controlled clock: 1 ms of wait, then 2 ms of forward and 1 ms of backward; 4 samples."""

    def data():
        for index in range(steps):
            clock.advance(MS)
            yield index

    for _ in sw.timed_iter(data(), phase=phase):
        with sw.timed("forward"):
            clock.advance(2 * MS)
        with sw.timed("backward"):
            clock.advance(MS)
        sw.count(samples=4)


def test_metrics_keys_and_values(clock: FakeClock) -> None:
    sw = stepwatch.Stopwatch(clock=clock)
    sw.enable()
    train(sw, clock, 6)
    train(sw, clock, 3, phase="val")
    figures = sw.metrics()
    assert figures == pytest.approx(
        {
            "stepwatch/train/steps": 5,  # the first step of the loop is a one-off, kept apart
            "stepwatch/train/time_per_step_ms": 4.0,
            "stepwatch/train/input_share": 0.25,
            "stepwatch/train/samples_per_s": 1000.0,
            "stepwatch/train/loader_ms": 1.0,
            "stepwatch/train/step_ms": 3.0,
            "stepwatch/train/step/forward_ms": 2.0,
            "stepwatch/train/step/backward_ms": 1.0,
            "stepwatch/val/steps": 2,
            "stepwatch/val/time_per_step_ms": 4.0,
            "stepwatch/val/input_share": 0.25,
            "stepwatch/val/samples_per_s": 1000.0,
            "stepwatch/val/loader_ms": 1.0,
            "stepwatch/val/step_ms": 3.0,
            "stepwatch/val/step/forward_ms": 2.0,
            "stepwatch/val/step/backward_ms": 1.0,
        }
    )
    assert set(sw.metrics(prefix="perf")) == {key.replace("stepwatch/", "perf/", 1) for key in figures}
    assert stepwatch.Stopwatch().metrics() == {}


def test_metrics_reads_the_packages_versions_once_a_process(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """A summary names the stepwatch and torch versions that run; reading a package's metadata (an email-format
    file parsed: ~0.5 ms each) at every ``metrics()`` was nine tenths of its cost. Read once, the same values."""
    from stepwatch import _run_file

    sw = stepwatch.Stopwatch(clock=clock)
    sw.enable()
    train(sw, clock, 3)
    _run_file.package_version.cache_clear()
    reads: list[str] = []
    real_version = _run_file.importlib_metadata.version

    def counted_version(name: str) -> str:
        reads.append(name)
        return real_version(name)

    monkeypatch.setattr(_run_file.importlib_metadata, "version", counted_version)
    first = sw.summary().metadata
    for _ in range(5):
        sw.metrics()
    again = sw.summary().metadata
    assert sorted(reads) == ["stepwatch", "torch"]
    assert first["stepwatch"] == again["stepwatch"] == stepwatch.__version__
    assert first["torch"] == again["torch"] and first["torch"] is not None


def test_log_every_calls_between_steps_of_the_training_loop_only(clock: FakeClock) -> None:
    sw = stepwatch.Stopwatch(clock=clock)
    sw.enable()
    seen: list[dict[str, float]] = []

    def log(figures: dict[str, float]) -> None:
        seen.append(figures)
        clock.advance(50 * MS)  # a slow logger: its time is in no step and not in the loop

    stop = sw.log_every(3, log)
    train(sw, clock, 10)
    train(sw, clock, 9, phase="val")  # evaluation loops do not count as training steps
    # after training steps 3, 6 and 9: the figures then, with the one-off first step apart
    assert [figures["stepwatch/train/steps"] for figures in seen] == [2, 5, 8]
    assert all(figures["stepwatch/train/time_per_step_ms"] == pytest.approx(4.0) for figures in seen)
    assert sw.summary().phases["train"].measured == pytest.approx(9 * 0.004)
    stop()
    train(sw, clock, 10)
    assert len(seen) == 3  # stopped


def test_a_call_stopped_during_a_loop_is_not_called_again_and_the_steps_keep_their_numbers(
    clock: FakeClock,
) -> None:
    sw = stepwatch.Stopwatch(clock=clock)
    sw.enable()
    seen: list[int] = []
    stop = sw.periodic.add(1, seen.append, "every step")  # called with the training step's number
    for index in sw.timed_iter(range(10)):
        clock.advance(MS)
        if index == 3:
            stop()  # in the body of the 4th step: not called after it, though this loop read it as it started
    assert seen == [1, 2, 3]
    later: list[int] = []
    sw.periodic.add(5, later.append, "every 5 steps")
    for _ in sw.timed_iter(range(10)):
        clock.advance(MS)
    # the first loop stopped ticking once it had nothing left to call, and still counted its 10 steps
    assert later == [15, 20]


@pytest.mark.parametrize("in_c", [True, False], ids=["steady steps in C", "fast path in Python"])
def test_the_steps_between_two_periodic_calls_stay_on_the_loops_steady_path(
    monkeypatch: pytest.MonkeyPatch, in_c: bool
) -> None:
    """A call every N steps (``log_every``'s, a logger's) has the loop tick only at its first step and at the steps
    the call is due: the steps between run on the steady path (in C where built, else the loop's fast path in
    Python), as with no call at all, rather than each on the general path (a no-op call every 1,000 steps made a
    ``timed_iter`` item cost 3.8x). The calls come at the same steps as before."""
    if not in_c:
        monkeypatch.setattr(_loops, "SteadyLoop", None)  # what runs where the speedups were not built
    sw = stepwatch.Stopwatch()
    sw.enable()
    for _ in sw.timed_iter(range(40)):  # its own cost measured on the first steps: that call removed
        pass
    ticked: list[int] = []
    tick = PeriodicCalls.tick

    def counted(self: PeriodicCalls, every: Every, resumed_ns: int) -> Every:
        ticked.append(self.ticks + 1)
        return tick(self, every, resumed_ns)

    monkeypatch.setattr(PeriodicCalls, "tick", counted)
    called: list[int] = []
    sw.periodic.add(7, called.append, "every 7 steps")
    sw.periodic.add(10, called.append, "every 10 steps")
    before = sw.periodic.ticks
    for _ in sw.timed_iter(range(60)):
        pass
    due = [step for step in range(before + 1, sw.periodic.ticks + 1) for n in (7, 10) if step % n == 0]
    assert called == due and len(due) >= 12
    assert ticked[1:] == sorted(set(due)), ticked  # the loop's first step (the general path's), then the due ones


def test_a_failing_callback_is_reported_once_and_never_stops_the_training(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    sw = stepwatch.Stopwatch(clock=clock)
    sw.enable()
    calls = []

    def broken(figures: dict[str, float]) -> None:
        calls.append(figures)
        raise ConnectionError("the logging service is down")

    sw.log_every(2, broken)
    with caplog.at_level(logging.ERROR, logger="stepwatch"):
        train(sw, clock, 10)
        train(sw, clock, 10)
    assert len(calls) == 1
    assert caplog.text.count("failed at step 2; it is not called again") == 1
    assert "ConnectionError: the logging service is down" in caplog.text
    assert sw.summary().phases["train"].steps == 18


def test_log_every_refuses_bad_arguments() -> None:
    sw = stepwatch.Stopwatch()
    for n in (0, -1, 1.5, True, "3"):
        with pytest.raises((ValueError, TypeError)):
            sw.log_every(n, print)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="callback must be callable, got None"):
        sw.log_every(1, None)  # type: ignore[arg-type]  # refused now, not at step 1
    with pytest.raises(ValueError, match=r"^every must be a positive number"):
        tensorboard.log(type("Writer", (), {"add_scalar": print})(), every=0, stopwatch=sw)


def test_a_validation_loop_in_a_log_every_callback_is_no_abandoned_loop(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A callback that validates runs between two training steps: its loop is its own phase's, and no
    "left but not closed" warning names the training loop."""
    sw = stepwatch.Stopwatch(clock=clock)
    sw.enable()

    def validate(figures: dict[str, float]) -> None:
        for _ in sw.timed_iter(range(2), phase="val"):
            clock.advance(MS)

    sw.log_every(4, validate)
    with caplog.at_level("WARNING", logger="stepwatch"):
        train(sw, clock, 9)
    assert "left (break or return) but not closed" not in caplog.text
    assert sw.summary().phases["val"].steps == 2 * 2 - 2  # two validations of 2, each one's first step apart


def test_tensorboard_writes_the_metrics_as_scalars(tmp_path: Path, clock: FakeClock) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    sw = stepwatch.Stopwatch(clock=clock)
    sw.enable()
    logged: list[dict[str, float]] = []
    sw.log_every(5, logged.append)
    writer = SummaryWriter(str(tmp_path))
    tensorboard.log(writer, every=5, stopwatch=sw)
    train(sw, clock, 11)
    writer.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert set(events.Tags()["scalars"]) == set(logged[0])
    for key in logged[0]:
        scalars = events.Scalars(key)
        assert [scalar.step for scalar in scalars] == [5, 10]
        assert [scalar.value for scalar in scalars] == pytest.approx([figures[key] for figures in logged], rel=1e-6)
    with pytest.raises(TypeError, match="SummaryWriter"):
        tensorboard.log(object(), every=5, stopwatch=sw)
