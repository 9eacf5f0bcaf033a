"""Many ranks: each rank knows who it is and writes its own run file (real processes, gloo on CPU)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch.multiprocessing as mp

import stepwatch
from stepwatch._ranks import ranks_report
from stepwatch.distributed import rank_info, rank_path

from .conftest import PYTHON, subprocess_env

sys.path.insert(0, str(Path(__file__).parent / "programs"))
import ranks

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


def ddp_runs(tmp_path: Path, busy_s: tuple[float, float], slow_forward_rank: int = -1) -> list[stepwatch.Summary]:
    out = tmp_path / "ddp.json"
    args = (2, str(tmp_path / "init"), str(out), busy_s, slow_forward_rank)
    mp.spawn(ranks.ddp_train, args=args, nprocs=2)
    return [stepwatch.load(tmp_path / f"ddp.rank{rank}.json") for rank in (0, 1)]


@pytest.mark.slow
def test_a_rank_with_a_slow_dataset_is_the_straggler_though_backward_hides_it(tmp_path: Path) -> None:
    runs = ddp_runs(tmp_path, (0.0005, 0.0015))  # rank 1 reads each sample 3x slower
    report = ranks_report(runs)
    assert report.straggler is not None
    assert report.straggler.rank == 1 and report.straggler.stage.startswith("loader")
    backward = next(s for s in report.stages if s.path == "step/backward")
    assert backward.equalized and backward.high[1] == 0  # rank 0 waits for rank 1 inside the all-reduce
    assert report.job_throughput["samples"] == pytest.approx(sum(r.throughput["samples"] for r in report.ranks))
    result = subprocess.run(
        [PYTHON, "-m", "stepwatch", "report", str(tmp_path / "ddp.rank0.json"), str(tmp_path / "ddp.rank1.json")],
        env=subprocess_env(),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "stepwatch · all ranks · train · 2 ranks" in result.stdout
    assert "straggler: rank 1, loader" in result.stdout
    report_text = result.stdout

    # merged offline into one all-ranks file, which reports the same figures
    merged = tmp_path / "all.json"
    per_rank = [str(tmp_path / "ddp.rank0.json"), str(tmp_path / "ddp.rank1.json")]
    result = subprocess.run(
        [PYTHON, "-m", "stepwatch", "merge", *per_rank, "-o", str(merged)],
        env=subprocess_env(),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0 and "2 ranks merged" in result.stderr, result.stderr
    again = subprocess.run(
        [PYTHON, "-m", "stepwatch", "report", str(merged)], env=subprocess_env(), capture_output=True, text=True
    )
    assert again.returncode == 0 and again.stdout == report_text


@pytest.mark.slow
def test_a_rank_with_a_slow_forward_is_the_straggler(tmp_path: Path) -> None:
    report = ranks_report(ddp_runs(tmp_path, (0.0005, 0.0005), slow_forward_rank=0))
    assert report.straggler is not None
    assert (report.straggler.rank, report.straggler.stage) == (0, "step/forward")


@pytest.mark.slow
def test_equal_ranks_have_no_straggler(tmp_path: Path) -> None:
    report = ranks_report(ddp_runs(tmp_path, (0.001, 0.001)))
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
        (["a.json", "a.json", "-o", "m.json"], None),  # the same run twice has no rank: taken as ranks 0 and 1
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
        if message is None:
            assert result.returncode == 0, result.stderr
            assert len(stepwatch._saved.load_runs(tmp_path / "m.json")) == 2
        else:
            assert result.returncode == 2 and message in result.stderr and "\n" not in result.stderr.strip()
