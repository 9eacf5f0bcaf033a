"""The timeline of recent steps (Stopwatch(trace_steps=N)) and its Chrome / Perfetto trace export."""

from __future__ import annotations

import collections
import gzip
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import stepwatch
from stepwatch._render.trace import trace_events

from .conftest import PYTHON, FakeClock, rank_runs, spin, subprocess_env

augment = stepwatch.timed_transform(lambda x: x * 2, "augment")


class Busy(Dataset[tuple[torch.Tensor, int]]):
    def __len__(self) -> int:
        return 48

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        spin(0.0002)
        return augment(torch.full((4,), float(index))), index % 2


def traced_run(steps: int) -> stepwatch.Summary:
    """Two epochs over a DataLoader with 2 forked workers, then validation: 12 steps a loop."""
    sw = stepwatch.Stopwatch(trace_steps=steps)
    sw.enable()
    for _ in range(2):
        for x, _y in sw.watch(DataLoader(Busy(), batch_size=4, num_workers=2, multiprocessing_context="fork")):
            with sw.timed("forward"):
                spin(0.0005)
            with sw.timed("backward"):
                spin(0.0002)
            sw.count(samples=len(x))
    for _ in sw.watch(DataLoader(Busy(), batch_size=4, num_workers=2, multiprocessing_context="fork"), phase="val"):
        with sw.timed("forward"):
            spin(0.0002)
    return sw.summary()


def test_the_timeline_holds_every_block_of_the_kept_steps_exactly() -> None:
    run = traced_run(1000)  # more than the run's steps: every block is kept
    sums: dict[tuple[str, str], int] = collections.Counter()
    for event in run.trace:
        sums[event.phase, event.path] += event.duration_ns
    for phase in run.phases.values():
        for path, stage in phase.stages.items():
            if path.rsplit("/", 1)[-1] == "other":
                continue  # not a block: what its parent's blocks do not cover
            assert sums[phase.name, path] == stage.total_ns, (phase.name, path)
    lanes = {event.lane for event in run.trace}
    assert lanes == {"thread MainThread", "worker 0", "worker 1"}
    assert all(e.lane.startswith("worker") for e in run.trace if e.path.startswith(("loader/", "first_batch/")))
    assert {e.path for e in run.trace if e.lane == "worker 0"} >= {"loader/dataset", "loader/dataset/augment"}


def test_the_ring_keeps_only_the_last_steps() -> None:
    run = traced_run(3)
    steps = [e for e in run.trace if e.path == "step" and e.lane == "thread MainThread"]
    assert len(steps) == 3 and {e.phase for e in steps} == {"val"}  # the validation loop's last 3 steps
    ends = sorted(e.start_ns + e.duration_ns for e in run.trace if e.lane == "thread MainThread")
    assert all(e.start_ns >= ends[0] - 10**9 for e in run.trace)  # nothing from the first epoch's start


def test_trace_steps_is_checked() -> None:
    for steps in (0, -1, 1.5, True, 10**6):
        with pytest.raises((ValueError, TypeError)):
            stepwatch.Stopwatch(trace_steps=steps)  # type: ignore[arg-type]


def test_enable_keeps_the_timeline_from_then_on_and_checks_it_first(clock: FakeClock) -> None:
    sw = stepwatch.Stopwatch(clock=clock)
    for steps in (0, -1, 1.5, True, 10**6):
        with pytest.raises((ValueError, TypeError)):
            sw.enable(trace_steps=steps)  # type: ignore[arg-type]
        assert not sw.is_enabled() and sw.timeline is None  # refused before anything changed
    sw.enable(trace_steps=2)
    for _ in sw.timed_iter(range(5)):
        with sw.timed("forward"):
            clock.advance(1000)
    steps = [event for event in sw.summary().trace if event.path == "step"]
    assert len(steps) == 2  # the ring of the last two steps
    assert all(event.duration_ns == 1000 for event in steps)
    assert sum(1 for event in sw.summary().trace if event.path == "step/forward") == 2
    sw.enable()  # trace_steps not given: the timeline stays
    assert sw.timeline is not None and sw.timeline.steps == 2


def check_trace_format(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The trace event format as Chrome and Perfetto read it: complete events in microseconds, every lane
    named by metadata. Returns the complete events."""
    events = document["traceEvents"]
    assert isinstance(events, list) and events
    named = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    processes = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    complete = [e for e in events if e["ph"] == "X"]
    for event in complete:
        assert set(event) >= {"name", "ph", "ts", "dur", "pid", "tid", "cat"}
        assert isinstance(event["ts"], float) and event["ts"] >= 0 and event["dur"] >= 0
        assert (event["pid"], event["tid"]) in named and event["pid"] in processes
    assert {e["ph"] for e in events} <= {"X", "M", "C"}
    for counter in (e for e in events if e["ph"] == "C"):
        assert counter["args"] and all(isinstance(v, float) for v in counter["args"].values())
    return complete


def test_export_writes_a_chrome_trace_that_sums_to_the_summary(tmp_path: Path) -> None:
    run = traced_run(200)
    stepwatch._run_file.save_summary(run, tmp_path / "run.json")
    for name in ("trace.json", "run.trace.json.gz"):
        result = subprocess.run(
            [PYTHON, "-m", "stepwatch", "export", "run.json", "-o", name],
            cwd=tmp_path,
            env=subprocess_env(),
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, result.stderr
    document = json.loads((tmp_path / "trace.json").read_text())
    assert json.loads(gzip.decompress((tmp_path / "run.trace.json.gz").read_bytes())) == document
    complete = check_trace_format(document)
    lanes = {e["args"]["name"] for e in document["traceEvents"] if e["name"] == "thread_name"}
    assert lanes == {"thread MainThread", "worker 0", "worker 1"}
    for path, stage in run.phases["train"].stages.items():
        if path.rsplit("/", 1)[-1] != "other":
            total = sum(e["dur"] for e in complete if e["args"] == {"path": path, "phase": "train"})
            assert total * 1e3 == pytest.approx(stage.total_ns, abs=stage.calls)  # to the nanosecond per event
    assert (tmp_path / "trace.json").stat().st_size < 300_000  # this run's 36 steps; 200 such steps: under 2 MB

    # a run that kept no timeline is told, in one line
    stepwatch.Stopwatch().save(tmp_path / "plain.json")
    result = subprocess.run(
        [PYTHON, "-m", "stepwatch", "export", "plain.json", "-o", "t.trace.json"],
        cwd=tmp_path,
        env=subprocess_env(),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "trace_steps" in result.stderr and result.stderr.count("\n") == 1


def test_an_all_ranks_trace_has_one_process_per_rank(clock: FakeClock) -> None:
    events = trace_events(rank_runs(clock, (1, 2), steps=4, trace_steps=10))
    complete = check_trace_format({"traceEvents": events})
    assert {e["pid"] for e in complete} == {0, 1}
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names[0].startswith("rank 0") and names[1].startswith("rank 1")
    forward = {pid: sum(e["dur"] for e in complete if e["pid"] == pid and e["name"] == "forward") for pid in (0, 1)}
    assert forward == {0: pytest.approx(4000.0), 1: pytest.approx(8000.0)}  # 4 blocks of 1 ms, of 2 ms


@pytest.mark.slow
def test_stepwatch_run_keeps_the_timeline_with_trace_steps(tmp_path: Path) -> None:
    programs = Path(__file__).parent / "programs"
    result = subprocess.run(
        [PYTHON, "-m", "stepwatch", "run", "--trace-steps", "5", "-o", "auto.json", str(programs / "cnn.py")],
        cwd=tmp_path,
        env=subprocess_env(PYTHONPATH=str(programs)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    run = stepwatch.load(tmp_path / "auto.json")
    bodies = [e for e in run.trace if e.path in ("step", "first_step") and e.lane == "thread MainThread"]
    assert len(bodies) == 5 and {"step/forward", "step/backward"} <= {e.path for e in run.trace}


def test_the_device_lane_holds_each_stages_device_time(clock: FakeClock) -> None:
    """With a device (the test double of the device interface): every stage's device time is on a device lane,
    placed by the clock anchor at the time the device ran it."""
    from .fake_device import FakeDevice

    device = FakeDevice(clock)
    sw = stepwatch.Stopwatch(clock=clock, device=device, trace_steps=100)  # type: ignore[arg-type]
    sw.enable()
    for index in sw.timed_iter(range(6)):
        with sw.timed("forward"):
            device.launch(3_000_000)
            device.allocate((index + 1) * 2**20)  # the step's peak: index + 1 MiB
            clock.advance(100_000)
        with sw.timed("backward"):
            device.launch(5_000_000)
            device.free((index + 1) * 2**20)
            clock.advance(100_000)
    run = sw.summary()
    memory = [e for e in run.trace if e.lane == "counter device memory" and e.path == "allocated"]
    # each steady-state step's peak, in order (the one-off first step is apart, as in the device figures)
    assert [e.value for e in memory] == [(index + 1) * 2**20 for index in range(1, 6)]
    counters = [e for e in trace_events([run]) if e["ph"] == "C"]
    assert [c["args"]["allocated MiB"] for c in counters] == [2.0, 3.0, 4.0, 5.0, 6.0]
    check_trace_format({"traceEvents": trace_events([run])})
    on_device = [e for e in run.trace if e.lane == f"device {device.name}"]
    for path in ("step/forward", "step/backward"):
        events = [e for e in on_device if e.path == path]
        assert len(events) == 5 and sum(e.duration_ns for e in events) == run.stages[path].device.total_ns
    forward = sorted((e for e in on_device if e.path == "step/forward"), key=lambda e: e.start_ns)
    backward = sorted((e for e in on_device if e.path == "step/backward"), key=lambda e: e.start_ns)
    for first, second in zip(forward, backward, strict=True):  # the device ran backward after forward
        assert second.start_ns >= first.start_ns + first.duration_ns
    cpu_forward = [e for e in run.trace if e.path == "step/forward" and e.lane.startswith("thread")]
    cpu_forward.sort(key=lambda e: e.start_ns)
    assert all(d.start_ns >= c.start_ns for d, c in zip(forward, cpu_forward, strict=True))  # never before
    names = [e["args"]["name"] for e in trace_events([run]) if e["name"] == "thread_name"]
    assert names == ["thread MainThread", f"device {device.name}"]


def test_a_trace_of_200_steps_stays_small(tmp_path: Path) -> None:
    """200 kept steps of a pipeline with 2 workers (4 samples a batch, each read and augmented, a collate) and
    a step of 2 blocks: the trace stays under 1.5 MB."""
    sw = stepwatch.Stopwatch(trace_steps=200)
    sw.enable()
    loader = DataLoader(Busy(), batch_size=4, num_workers=2, multiprocessing_context="fork", persistent_workers=True)
    steps = 0
    while steps < 260:
        for _ in sw.watch(loader):
            with sw.timed("forward"):
                pass
            with sw.timed("backward"):
                pass
            steps += 1
    run = sw.summary()
    bodies = [e for e in run.trace if e.path in ("step", "first_step") and e.lane == "thread MainThread"]
    assert len(bodies) == 200
    stepwatch._run_file.save_summary(run, tmp_path / "run.json")
    result = subprocess.run(
        [PYTHON, "-m", "stepwatch", "export", "run.json", "-o", "trace.json"],
        cwd=tmp_path,
        env=subprocess_env(),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    size = (tmp_path / "trace.json").stat().st_size
    assert 100_000 < size < 1_500_000, size
