"""The real CUDA path: run only where a GPU is present; elsewhere the script must say so clearly."""

from __future__ import annotations

import subprocess

import pytest
import torch

from .conftest import PYTHON, ROOT, subprocess_env

SCRIPT = str(ROOT / "scripts" / "gpu_check.py")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the real check runs instead")
def test_gpu_check_without_cuda_exits_2_with_one_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    result = subprocess.run(
        [PYTHON, SCRIPT, "--out", str(tmp_path / "g.json")], env=subprocess_env(), capture_output=True, text=True
    )
    assert result.returncode == 2
    assert result.stderr.strip() == "gpu_check: no CUDA device here"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_check_passes_on_cuda(tmp_path) -> None:  # type: ignore[no-untyped-def]
    result = subprocess.run(
        [PYTHON, SCRIPT, "--out", str(tmp_path / "g.json")], env=subprocess_env(), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
