"""Many ranks: each rank knows who it is and writes its own run file (real processes, gloo on CPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch.multiprocessing as mp

import stepwatch
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
