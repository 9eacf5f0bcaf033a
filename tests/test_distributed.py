"""Many ranks: each rank knows who it is and writes its own run file (real processes, gloo on CPU)."""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.multiprocessing as mp

import stepwatch
from stepwatch._all_ranks import load_ranks
from stepwatch._ranks import RanksReport, ranks_report
from stepwatch._render import render_ranks
from stepwatch._run_file import save_ranks
from stepwatch.distributed import gather_timeout, rank_info, rank_path

from .conftest import PYTHON, FakeClock, rank_runs, subprocess_env

sys.path.insert(0, str(Path(__file__).parent / "programs"))
import ranks

PROGRAMS = Path(__file__).parent / "programs"

RECORD = "import stepwatch\nfor _ in stepwatch.timed_iter(range(3)):\n    pass\n"


def test_rank_path_places_the_rank() -> None:
    job = {"rank": 3, "local_rank": 1, "world_size": 4}
    assert rank_path("runs/ddp.json", job) == "runs/ddp.rank3.json"
    assert rank_path("runs/ddp.{rank}.json", job) == "runs/ddp.3.json"
    assert rank_path("runs/run", job) == "runs/run.rank3"
    single = {"rank": 0, "local_rank": 0, "world_size": 1}
    assert rank_path("runs/ddp.json", single) == "runs/ddp.json"
    assert rank_path("r{rank}.json", single) == "r0.json"


def test_rank_info_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert rank_info() is None
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert rank_info() == {"rank": 5, "local_rank": 1, "world_size": 8}
    monkeypatch.setenv("RANK", "x")
    assert rank_info() is None  # not understood: not a rank


@pytest.mark.parametrize("out", ["run.json", "run.{rank}.json"])
def test_ranks_launched_with_one_stepwatch_out_write_their_own_files(tmp_path: Path, out: str) -> None:
    """As torchrun launches them: the same STEPWATCH_OUT inherited, RANK and WORLD_SIZE set for each."""
    for rank in (0, 1):
        env = subprocess_env(
            STEPWATCH="1", STEPWATCH_OUT=str(tmp_path / out), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2"
        )
        result = subprocess.run([PYTHON, "-c", RECORD], env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
    expected = ["run.0.json", "run.1.json"] if "{rank}" in out else ["run.rank0.json", "run.rank1.json"]
    assert sorted(path.name for path in tmp_path.iterdir()) == expected
    for rank, name in enumerate(expected):
        metadata = stepwatch.load(tmp_path / name).metadata
        assert (metadata["rank"], metadata["local_rank"], metadata["world_size"]) == (rank, rank, 2)


@pytest.mark.slow
def test_ranks_of_a_real_process_group_know_their_rank_without_the_environment(tmp_path: Path) -> None:
    mp.spawn(ranks.record_and_save, args=(2, str(tmp_path / "init"), str(tmp_path / "ddp.json")), nprocs=2)
    for rank in (0, 1):
        summary = stepwatch.load(tmp_path / f"ddp.rank{rank}.json")
        assert summary.metadata["rank"] == rank and summary.metadata["world_size"] == 2
        assert summary.stages["step/forward"].calls == 3
    assert not (tmp_path / "ddp.json").exists()


def test_a_single_process_keeps_its_file_name(tmp_path: Path) -> None:
    result = subprocess.run(
        [PYTHON, "-c", RECORD],
        env=subprocess_env(STEPWATCH="1", STEPWATCH_OUT=str(tmp_path / "run.json")),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert [path.name for path in tmp_path.iterdir()] == ["run.json"]
    assert stepwatch.load(tmp_path / "run.json").metadata["rank"] is None


def ddp_runs(
    tmp_path: Path, busy_s: tuple[float, ...], slow_forward_rank: int = -1, sleeps: bool = False
) -> list[stepwatch.Summary]:
    """A real DDP job of ``len(busy_s)`` ranks (their datasets busy-wait, or sleep, ``busy_s[rank]`` per read);
    its per-rank files, checked to hold the same figures as the all-ranks file rank 0 gathered live."""
    world = len(busy_s)
    out = tmp_path / "ddp.json"
    args = (world, str(tmp_path / "init"), str(out), busy_s, slow_forward_rank, sleeps)
    mp.spawn(ranks.ddp_train, args=args, nprocs=world)
    per_rank = [stepwatch.load(tmp_path / f"ddp.rank{rank}.json") for rank in range(world)]
    gathered = load_ranks(out)
    assert gathered.world_size == world and not gathered.missing
    assert figures(ranks_report(gathered.runs)) == figures(ranks_report(per_rank))
    return per_rank


def figures(report: RanksReport) -> tuple[object, ...]:
    """What the all-ranks report says, exactly: each stage per rank, each rank's figures, the straggler."""
    return tuple((s.path, dict(s.per_rank)) for s in report.stages), tuple(report.ranks), report.straggler


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_a_rank_with_a_slow_dataset_is_the_straggler_though_backward_hides_it(tmp_path: Path, world: int) -> None:
    slow = world - 1  # reads each sample 3x slower than the others
    runs = ddp_runs(tmp_path, tuple(0.0015 if rank == slow else 0.0005 for rank in range(world)))
    report = ranks_report(runs)
    assert report.straggler is not None
    assert report.straggler.rank == slow and report.straggler.stage.startswith("loader")
    backward = next(s for s in report.stages if s.path == "step/backward")
    assert backward.equalized and backward.low[1] == slow  # the others wait for it inside the all-reduce
    assert report.job_throughput["samples"] == pytest.approx(sum(r.throughput["samples"] for r in report.ranks))
    per_rank = [str(tmp_path / f"ddp.rank{rank}.json") for rank in range(world)]
    result = subprocess.run(
        [PYTHON, "-m", "stepwatch", "report", *per_rank],
        env=subprocess_env(),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert f"stepwatch · all ranks · train · {world} ranks" in result.stdout
    assert f"straggler: rank {slow}, loader" in result.stdout
    report_text = result.stdout

    # the all-ranks file gathered live, and the per-rank files merged offline, report the same
    merged = tmp_path / "all.json"
    result = subprocess.run(
        [PYTHON, "-m", "stepwatch", "merge", *per_rank, "-o", str(merged)],
        env=subprocess_env(),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0 and f"{world} ranks merged" in result.stderr, result.stderr
    for all_ranks in (merged, tmp_path / "ddp.json"):
        again = subprocess.run(
            [PYTHON, "-m", "stepwatch", "report", str(all_ranks)], env=subprocess_env(), capture_output=True, text=True
        )
        assert again.returncode == 0 and again.stdout == report_text

    # the exporters on a real all-ranks file: the trace has one process per rank, the page and the plot each rank
    for name in ("ddp.trace.json", "ddp.html", "ddp.png"):
        command = "plot" if name.endswith(".png") else "export"
        result = subprocess.run(
            [PYTHON, "-m", "stepwatch", command, str(merged), "-o", str(tmp_path / name)],
            env=subprocess_env(),
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, result.stderr
    trace = json.loads((tmp_path / "ddp.trace.json").read_text())["traceEvents"]
    assert {e["pid"] for e in trace if e["ph"] == "X"} == set(range(world))
    assert f"{world} of {world} ranks" in (tmp_path / "ddp.html").read_text()


def own_step_s(tmp_path: Path, world: int) -> float:
    """The job's time per step by the program's own clock: each rank's median iteration after the first (the
    first batch is a one-off; a median, so that one iteration the machine delayed, as a busy CI machine does,
    does not stand for the job's steady step), the median over ranks (DDP makes them equal)."""
    medians = []
    for rank in range(world):
        steps = json.loads((tmp_path / f"ddp.json.own{rank}.json").read_text())[1:]
        medians.append(statistics.median(steps))
    return statistics.median(medians)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3, 4])
def test_what_the_job_loses_to_its_straggler_is_what_a_control_run_shows(tmp_path: Path, world: int) -> None:
    """One rank reads each sample 5x slower: what stepwatch says the job loses per step is what the same job
    with equal ranks measures by the program's own clock, within 25% (a median over ranks that includes the
    straggler would halve it with 2 ranks). The reads sleep, so that 4 ranks on 2 cores do not slow each other
    down through the machine rather than through the straggler. (With 8 ms more a read, a machine under two CPU
    hogs took 9 ms off the 32 ms the control showed; 16 ms more a read leaves that a smaller part.)"""
    slow_dir, control_dir = tmp_path / "slow", tmp_path / "control"
    slow_dir.mkdir()
    control_dir.mkdir()
    report = ranks_report(
        ddp_runs(slow_dir, tuple(0.020 if rank == 1 else 0.004 for rank in range(world)), sleeps=True)
    )
    ddp_runs(control_dir, (0.004,) * world, sleeps=True)
    lost = own_step_s(slow_dir, world) - own_step_s(control_dir, world)
    assert report.straggler is not None and report.straggler.rank == 1
    assert report.straggler.stage.startswith("loader")
    assert lost > 0.048  # 4 samples x 16 ms more per batch (64 ms): the control run shows 3/4 of it at least
    assert report.straggler.excess_s == pytest.approx(lost, rel=0.25)
    text = render_ranks(report)  # no "slowest rank" beside the straggler (DDP equalizes the step times)
    assert "slowest rank" not in text and "every rank waits for the straggler" in text
    assert "over the median of the other ranks" in text


@pytest.mark.slow
def test_a_rank_with_a_slow_forward_is_the_straggler(tmp_path: Path) -> None:
    report = ranks_report(ddp_runs(tmp_path, (0.0005, 0.0005), slow_forward_rank=0))
    assert report.straggler is not None
    assert (report.straggler.rank, report.straggler.stage) == (0, "step/forward")


@pytest.mark.slow
def test_equal_ranks_have_no_straggler(tmp_path: Path) -> None:
    """(Reads that sleep, as the control-run test's: a busy-waited read overshoots wherever the machine deschedules
    its rank mid-read, so that on a busy machine one rank's reads can really take longer, and be named.)"""
    report = ranks_report(ddp_runs(tmp_path, (0.001, 0.001), sleeps=True))
    assert report.straggler is None
    assert [r.rank for r in report.ranks] == [0, 1] and all(r.steps == 11 for r in report.ranks)


def test_ranks_with_different_stages_and_bad_sets_of_files(tmp_path: Path) -> None:
    first, second = stepwatch.Stopwatch(), stepwatch.Stopwatch()
    for sw, stage in ((first, "forward"), (second, "decode")):
        sw.enable()
        for _ in sw.timed_iter(range(3)):
            with sw.timed(stage):
                pass
    report = ranks_report([first.summary(), second.summary()])
    forward = next(s for s in report.stages if s.path == "step/forward")
    assert forward.per_rank[1] == 0.0 and forward.per_rank[0] > 0  # a stage one rank lacks counts as 0 there
    assert any(s.path == "step/decode" for s in report.stages)
    with pytest.raises(ValueError, match="no rank measured a step"):
        ranks_report([stepwatch.Stopwatch().summary()])
    as_rank_0 = [
        dataclasses.replace(s, metadata={**s.metadata, "rank": 0}) for s in (first.summary(), second.summary())
    ]
    with pytest.raises(ValueError, match="two runs are rank 0"):
        ranks_report(as_rank_0)
    (tmp_path / "broken.json").write_text("{")
    first.save(tmp_path / "a.json")
    result = subprocess.run(
        [PYTHON, "-m", "stepwatch", "report", str(tmp_path / "a.json"), str(tmp_path / "broken.json")],
        env=subprocess_env(),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "broken.json" in result.stderr and result.stdout == ""


def test_merge_refuses_what_is_not_one_run_per_rank(tmp_path: Path) -> None:
    sw = stepwatch.Stopwatch()
    sw.enable()
    for _ in sw.timed_iter(range(3)):
        pass
    sw.save(tmp_path / "a.json")
    (tmp_path / "ranks.json").write_text('{"format": "stepwatch-ranks", "schema": 1, "ranks": []}')
    for files, message in (
        (["a.json", "a.json", "-o", "m.json"], "a run of no rank"),  # not ranks 0 and 1 by position
        (["ranks.json", "-o", "m.json"], "non-empty list"),
        (["missing.json", "-o", "m.json"], "cannot read"),
    ):
        result = subprocess.run(
            [PYTHON, "-m", "stepwatch", "merge", *files],
            cwd=tmp_path,
            env=subprocess_env(),
            capture_output=True,
            text=True,
        )
        assert result.returncode == 2 and message in result.stderr and "\n" not in result.stderr.strip()


@pytest.mark.slow
def test_ranks_with_different_stages_gather_live_and_a_rank_that_left_costs_only_the_timeout(tmp_path: Path) -> None:
    out = tmp_path / "live.json"
    mp.spawn(ranks.gather_live, args=(4, str(tmp_path / "init"), str(out), -1, 60.0), nprocs=4)
    gathered = load_ranks(out)
    assert gathered.world_size == 4 and not gathered.missing
    assert [run.metadata["rank"] for run in gathered.runs] == [0, 1, 2, 3]
    report = ranks_report(gathered.runs)
    for rank in range(4):  # each rank's own stage came back, and counts as 0 on the others
        only = next(s for s in report.stages if s.path == f"step/only{rank}")
        assert only.per_rank[rank] > 0 and all(only.per_rank[r] == 0 for r in range(4) if r != rank)
    own = [stepwatch.load(tmp_path / f"live.own{rank}.rank{rank}.json") for rank in range(4)]
    assert figures(report) == figures(ranks_report(own))  # the gather changes no figure
    assert all(stage.recent_ns == () for run in gathered.runs[1:] for stage in run.stages.values())  # kept small

    # rank 2 returns before the gather, as a rank that died would: rank 0 waits its timeout, then goes on
    out = tmp_path / "left.json"
    mp.spawn(ranks.gather_live, args=(3, str(tmp_path / "init2"), str(out), 2, 2.0), nprocs=3)
    gathered = load_ranks(out)
    assert gathered.missing == (2,) and gathered.world_size == 3
    assert [run.metadata["rank"] for run in gathered.runs] == [0, 1]
    waited = json.loads((tmp_path / "left.json.waited").read_text())
    assert waited["missing"] == [2] and 2.0 <= waited["waited"] < 30  # the timeout, not a hang
    assert "missing: rank 2" in gathered.render() and "2 of 3 ranks" in gathered.render()


@pytest.mark.slow
def test_gather_every_n_steps_leaves_an_all_ranks_file_during_the_run(tmp_path: Path) -> None:
    out = tmp_path / "every.json"
    mp.spawn(ranks.gather_every, args=(2, str(tmp_path / "init"), str(out)), nprocs=2)
    # read at steps 5 and 9: saved after 4 and 8 loop items (the first is the one-off first step)
    assert json.loads((tmp_path / "every.json.seen").read_text()) == [[3, 3], [7, 7]]
    assert stepwatch.load(tmp_path / "every.rank1.json").main_phase.steps == 7


def torchrun(tmp_path: Path, nprocs: int, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    command = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nprocs), *args]
    return subprocess.run(
        command,
        cwd=tmp_path,
        env=subprocess_env(PYTHONPATH=str(PROGRAMS), OMP_NUM_THREADS="1", **env),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_torchrun_ranks_save_at_exit_and_rank_0_writes_the_all_ranks_file(tmp_path: Path) -> None:
    """``stepwatch.enable(out=...)`` inside a script launched by torchrun with 4 ranks, rank 2 reading 3x slower."""
    result = torchrun(tmp_path, 4, str(PROGRAMS / "ddp_job.py"), "--out", "runs/ddp.json", "--slow-rank", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    names = sorted(path.name for path in (tmp_path / "runs").iterdir())
    assert names == ["ddp.json", "ddp.rank0.json", "ddp.rank1.json", "ddp.rank2.json", "ddp.rank3.json"]
    gathered = load_ranks(tmp_path / "runs" / "ddp.json")
    per_rank = [stepwatch.load(tmp_path / "runs" / f"ddp.rank{rank}.json") for rank in range(4)]
    assert gathered.world_size == 4 and not gathered.missing
    assert figures(ranks_report(gathered.runs)) == figures(ranks_report(per_rank))
    straggler = ranks_report(gathered.runs).straggler
    assert straggler is not None and straggler.rank == 2 and straggler.stage.startswith("loader")


@pytest.mark.slow
def test_torchrun_stepwatch_run_reports_all_ranks_and_survives_a_rank_that_dies(tmp_path: Path) -> None:
    """``torchrun -m stepwatch run``: zero code; rank 1 ends abruptly, before sending its summary."""
    script = str(PROGRAMS / "ddp_job.py")
    result = torchrun(tmp_path, 2, "-m", "stepwatch", "run", script, "--die-rank", "1", STEPWATCH_GATHER_TIMEOUT="3")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "stepwatch: rank 1 did not answer within 3 s" in result.stderr
    assert "stepwatch · all ranks · train · 1 of 2 ranks" in result.stderr
    assert "missing: rank 1" in result.stderr and "run saved to ddp_job.stepwatch.json" in result.stderr
    assert result.stderr.count("stepwatch · train ·") == 1  # rank 0's own report, and no other rank's
    assert sorted(path.name for path in tmp_path.glob("*.json")) == [
        "ddp_job.stepwatch.json",
        "ddp_job.stepwatch.rank0.json",
    ]

    # equal ranks: the reads sleep, so that a busy machine taking one rank's core does not make it a straggler
    result = torchrun(tmp_path, 2, "-m", "stepwatch", "run", "-o", "zero.json", script, "--sleep-reads")
    assert result.returncode == 0, result.stderr[-3000:]
    gathered = load_ranks(tmp_path / "zero.json")
    assert [run.metadata["rank"] for run in gathered.runs] == [0, 1] and not gathered.missing
    assert all(run.main_phase.steps == 15 and "step/backward" in run.stages for run in gathered.runs)
    assert "no straggler" in result.stderr


@pytest.mark.slow
def test_torchrun_stepwatch_run_stop_ends_every_rank_after_its_window(tmp_path: Path) -> None:
    """``torchrun -m stepwatch run --active N --stop``: each rank stops after its own window, with exit status 0;
    rank 0 gathers every rank's run then, and reports once."""
    script = str(PROGRAMS / "ddp_job.py")
    options = ["--warmup", "1", "--active", "4", "--stop", "-o", "stop.json"]
    result = torchrun(tmp_path, 2, "-m", "stepwatch", "run", *options, script, "--sleep-reads")
    assert result.returncode == 0, result.stderr[-3000:]
    gathered = load_ranks(tmp_path / "stop.json")
    assert [run.metadata["rank"] for run in gathered.runs] == [0, 1] and not gathered.missing
    assert all(run.main_phase.steps == 4 for run in gathered.runs)
    assert result.stderr.count("the measured window closed at step 5; stopping the program") == 1  # rank 0's
    assert result.stderr.count("stepwatch · all ranks · train") == 1 and "Traceback" not in result.stderr
    assert "stopped the program at step 5, after the report above" in result.stderr


def job_file(path: Path, forward_ms: list[int], clock: FakeClock) -> None:
    """An all-ranks file of one rank per entry of ``forward_ms``, on a controlled clock (2 samples a step)."""
    save_ranks(rank_runs(clock, forward_ms, steps=5), path)


def test_compare_all_ranks_files_job_and_per_rank(tmp_path: Path, clock: FakeClock) -> None:
    job_file(tmp_path / "before.json", [2, 6], clock)  # rank 1's forward holds the job back
    job_file(tmp_path / "after.json", [2, 2], clock)
    result = subprocess.run(
        [PYTHON, "-m", "stepwatch", "compare", "before.json", "after.json", "--fail-if-slower", "1"],
        cwd=tmp_path,
        env=subprocess_env(),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "all ranks: 2 -> 2 ranks" in lines[0]
    # the job: forward per call over both ranks' calls, 4 ms -> 2 ms; throughput summed over the ranks
    assert any(line.split()[:4] == ["forward", "4.000", "2.000", "-2.000"] for line in lines)
    rate_before = 2 / 0.003 + 2 / 0.007
    assert f"samples/s: {rate_before:,.1f} -> {2 * 2 / 0.003:,.1f}" in result.stdout
    assert any(line.split() == ["1", "7.000", "3.000", "-57.1%"] for line in lines)  # rank 1's ms per step
    assert "straggler before: rank 1, step/forward (+4.000 ms per step over the others)" in lines
    assert "straggler after: none" in lines

    slower = subprocess.run(
        [PYTHON, "-m", "stepwatch", "compare", "after.json", "before.json", "--fail-if-slower", "10"],
        cwd=tmp_path,
        env=subprocess_env(),
        capture_output=True,
        text=True,
    )
    assert slower.returncode == 1 and "time per step +66.7%" in slower.stderr


@pytest.mark.slow
def test_a_rank_0_that_crashes_keeps_its_file_and_does_not_wait_for_the_others(tmp_path: Path) -> None:
    """After an uncaught exception the other ranks are likely still training: rank 0 saves its own file and
    ends at once instead of waiting STEPWATCH_GATHER_TIMEOUT (here 120 s) for them."""
    script = str(PROGRAMS / "ddp_job.py")
    started = time.monotonic()
    result = torchrun(tmp_path, 2, script, "--out", "crash.json", "--raise-rank", "0", STEPWATCH_GATHER_TIMEOUT="120")
    assert time.monotonic() - started < 100  # no gather: a wait would last at least 120 s
    assert result.returncode != 0 and "RuntimeError: rank 0 fails after training" in result.stderr
    assert sorted(path.name for path in tmp_path.glob("*.json")) == ["crash.rank0.json", "crash.rank1.json"]
    assert stepwatch.load(tmp_path / "crash.rank0.json").main_phase.steps == 15


def test_gather_outside_a_job_and_bad_arguments(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    sw = stepwatch.Stopwatch()
    sw.enable()
    for _ in sw.timed_iter(range(3)):
        pass
    alone = sw.summary(ranks="all")
    assert alone is not None and alone.world_size == 1 and len(alone.runs) == 1 and not alone.missing
    assert alone.runs[0].main_phase.steps == 2
    for timeout in (-1, float("nan"), float("inf"), "5", 1e15, True):
        with pytest.raises(ValueError, match="timeout must be a number of seconds"):
            sw.summary(ranks="all", timeout=timeout)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ranks must be 'all' or None"):
        sw.summary(ranks="some")  # type: ignore[call-overload]
    monkeypatch.setenv("STEPWATCH_GATHER_TIMEOUT", "soon")
    assert gather_timeout() == 30.0 and "STEPWATCH_GATHER_TIMEOUT='soon' is not a number of seconds" in caplog.text
    monkeypatch.setenv("STEPWATCH_GATHER_TIMEOUT", "2.5")
    assert gather_timeout() == 2.5
    monkeypatch.setenv("STEPWATCH_GATHER_TIMEOUT", "1e15")  # once overflowed the store's wait: 0 s waited
    assert gather_timeout() == 86_400.0 and "is more than a day; waiting at most 86400 s" in caplog.text


def test_export_and_plot_refuse_all_ranks_files_report_refuses(tmp_path: Path, clock: FakeClock) -> None:
    """Duplicate ranks, or no rank that measured a step (what the gather writes for blocks without a loop): one
    line and exit 2, as ``report`` answers, for the page and the picture too."""
    runs = rank_runs(clock, [2, 2], steps=3)
    twice = [dataclasses.replace(run, metadata={**run.metadata, "rank": 0}) for run in runs]
    save_ranks(twice, tmp_path / "twice.json")
    blocks = stepwatch.Stopwatch()
    blocks.enable()
    with blocks.timed("setup"):
        pass
    no_loop = blocks.summary()
    save_ranks(
        [dataclasses.replace(no_loop, metadata={**no_loop.metadata, "rank": r}) for r in (0, 1)], tmp_path / "none.json"
    )
    for name, message in (("twice.json", "two runs are rank 0"), ("none.json", "no rank measured a step")):
        for command, out in (("report", None), ("export", "x.html"), ("plot", "x.png")):
            result = subprocess.run(
                [PYTHON, "-m", "stepwatch", command, name, *(["-o", out] if out else [])],
                cwd=tmp_path,
                env=subprocess_env(),
                capture_output=True,
                text=True,
            )
            assert result.returncode == 2, (command, name, result.stderr)
            assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
            assert "Traceback" not in result.stderr


def test_load_and_render_accept_what_save_and_summary_produce(tmp_path: Path, clock: FakeClock) -> None:
    """``stepwatch.load`` reads an all-ranks file back (as ``AllRanks``), a run file as a ``Summary``; and
    ``stepwatch.render`` renders either."""
    runs = rank_runs(clock, [2, 6], steps=4)
    job = stepwatch.AllRanks(tuple(runs), 3, (2,))
    job.save(tmp_path / "all.json")
    loaded = stepwatch.load(tmp_path / "all.json")
    assert isinstance(loaded, stepwatch.AllRanks)
    assert (loaded.world_size, loaded.missing, len(loaded.runs)) == (3, (2,), 2)
    text = stepwatch.render(loaded)
    assert "2 of 3 ranks" in text and "missing: rank 2" in text and "straggler: rank 1" in text
    assert stepwatch.render(loaded, "html").startswith("<!doctype html>")
    again = tmp_path / "again.json"
    again.write_text(stepwatch.render(loaded, "json"))
    assert stepwatch.load(again) == loaded  # the all-ranks file, as saved
    with pytest.raises(ValueError, match="per run: render one rank's run"):
        stepwatch.render(loaded, "csv")
    stepwatch._run_file.save_summary(runs[0], tmp_path / "one.json")
    assert isinstance(stepwatch.load(tmp_path / "one.json"), stepwatch.Summary)


def test_a_job_where_only_rank_0_answered_says_so(tmp_path: Path, clock: FakeClock) -> None:
    """The gathered file of a 2-rank job whose rank 1 never answered holds one run: its report and page are
    rank 0's, and both name the missing rank."""
    (run,) = rank_runs(clock, [2], steps=4)
    save_ranks([run], tmp_path / "job.json", world_size=2, missing=[1])
    for command, out in (("report", None), ("export", "job.html")):
        result = subprocess.run(
            [PYTHON, "-m", "stepwatch", command, "job.json", *(["-o", out] if out else [])],
            cwd=tmp_path,
            env=subprocess_env(),
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, result.stderr
        shown = result.stdout if out is None else (tmp_path / out).read_text()
        assert "missing: rank 1" in shown and "1 of 2 ranks answered" in shown


def test_merge_keeps_the_jobs_shape_and_refuses_mixtures(tmp_path: Path, clock: FakeClock) -> None:
    """Ranks 0 and 1 of a 4-rank job merge as 2 of 4 (ranks 2 and 3 missing), and stay so when merged again;
    ranks are ordered by rank, not by argument; a rank outside the world, two jobs of different sizes, or a
    run of no rank among others is refused in one line naming the files."""

    def rank_file(name: str, rank: int, world: int, job: str | None = None) -> str:
        (run,) = rank_runs(clock, [2 + rank], steps=3)
        run = dataclasses.replace(run, metadata={**run.metadata, "rank": rank, "world_size": world, "job": job})
        stepwatch._run_file.save_summary(run, tmp_path / name)
        return name

    def merge(*files: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [PYTHON, "-m", "stepwatch", "merge", *files, "-o", "m.json"],
            cwd=tmp_path,
            env=subprocess_env(),
            capture_output=True,
            text=True,
        )

    ten, one, zero = rank_file("r10.json", 10, 12), rank_file("r1.json", 1, 12), rank_file("r0.json", 0, 12)
    result = merge(ten, one, zero)
    assert result.returncode == 0 and "3 ranks of 12" in result.stderr, result.stderr
    job = stepwatch.load(tmp_path / "m.json")
    assert [run.metadata["rank"] for run in job.runs] == [0, 1, 10]
    assert job.world_size == 12 and job.missing == (2, 3, 4, 5, 6, 7, 8, 9, 11)
    (tmp_path / "m.json").rename(tmp_path / "first.json")
    again = merge("first.json")  # merged again, its missing ranks stay
    assert again.returncode == 0, again.stderr
    assert stepwatch.load(tmp_path / "m.json").missing == job.missing
    report = subprocess.run(
        [PYTHON, "-m", "stepwatch", "report", "first.json"],
        cwd=tmp_path,
        env=subprocess_env(),
        capture_output=True,
        text=True,
    )
    assert "3 of 12 ranks" in report.stdout and "missing: rank 2, 3, 4" in report.stdout
    stray = rank_file("r5.json", 5, 2)
    other = rank_file("other.json", 1, 4)
    plain = tmp_path / "plain.json"
    stepwatch._run_file.save_summary(rank_runs(clock, [2], steps=3)[0], plain)
    lonely = stepwatch.load(plain)
    stepwatch._run_file.save_summary(dataclasses.replace(lonely, metadata={**lonely.metadata, "rank": None}), plain)
    for files, message in (
        ((stray,), "r5.json holds rank 5 of a job of 2 ranks"),
        ((zero, other), "r0.json is of a job of 12 ranks, other.json of 4"),
        ((zero, "plain.json"), "plain.json holds a run of no rank"),
        ((zero, zero), "two runs are rank 0 (r0.json and r0.json)"),
        (
            (rank_file("j0.json", 0, 2, "run-a 127.0.0.1:29500"), rank_file("j1.json", 1, 2, "run-b 127.0.0.1:29501")),
            "j0.json and j1.json are runs of different jobs",
        ),
    ):
        refused = merge(*files)
        assert refused.returncode == 2 and message in refused.stderr, (files, refused.stderr)
        assert len(refused.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.parametrize(
    ("rotate", "verdict"),
    [
        (
            False,
            "rank 1 was the slowest in 4 of 4 windows before the ranks synchronize: a persistent straggler (look at"
            " its node, its data shard or its input pipeline)",
        ),
        (
            True,
            "the slowest rank changed from window to window (rank 0 in 2, rank 1 in 2 of 4 windows): rotating noise"
            " rather than one bad node",
        ),
    ],
)
def test_a_persistent_straggler_is_told_from_a_rotating_one(tmp_path: Path, rotate: bool, verdict: str) -> None:
    """A gloo job gathering every 3 steps: each rank notes its pre-synchronization time per step in each window,
    and the all-ranks report counts the windows each rank was the slowest in."""
    out = tmp_path / "windows.json"
    mp.spawn(ranks.slow_windows, args=(2, str(tmp_path / "init"), str(out), rotate), nprocs=2)
    rank1 = stepwatch.load(tmp_path / "windows.rank1.json")
    assert len(rank1.metadata["windows"]) == 4
    gathered = load_ranks(out)
    assert verdict in gathered.render(), gathered.render()
    assert gathered.report().slowest_in_windows == ({0: 0, 1: 4} if not rotate else {0: 2, 1: 2})
