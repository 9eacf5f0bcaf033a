"""FLOPs counted on one step (torch's FlopCounterMode, real models), kept out of the timing; FLOP/s and MFU in
the report, the verdict, metrics() and the saved run; the peak table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import stepwatch
from stepwatch import Stopwatch
from stepwatch._analysis import analyze
from stepwatch._mfu import percent
from stepwatch._peaks import check_peak, known_peak

from .conftest import stepwatch_command
from .realtime_device import RealtimeDevice

SIZES = ((64, 128), (128, 256), (256, 32))
BATCH = 16


def linear_stack() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(n, k) for n, k in SIZES])


def forward_flops(batch: int = BATCH) -> int:
    """A Linear of n inputs and k outputs on m samples: one m x n by n x k product, 2·m·n·k FLOPs."""
    return sum(2 * batch * n * k for n, k in SIZES)


def train(sw: Stopwatch, batches: int = 20) -> None:
    model = linear_stack()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(batches * BATCH, SIZES[0][0])), batch_size=BATCH)
    for (x,) in sw.timed_iter(loader):
        x.requires_grad_(True)  # every layer's backward then has two products: the input's and the weight's
        with sw.timed("forward"):
            y = model(x)
        with sw.timed("backward"):
            y.sum().backward()
        optimizer.step()
        optimizer.zero_grad()


@pytest.mark.parametrize(("warmup", "counted", "steps"), [(0, 2, 18), (1, 2, 18), (3, 3, 17)])
def test_a_linear_stack_gives_exactly_its_flops_on_a_step_kept_out_of_the_timing(
    warmup: int, counted: int, steps: int
) -> None:
    """Forward 2·m·n·k per layer, backward twice that. The step counted is the last warm-up step, or, with fewer
    than two, the second (the first is a one-off), taken out of the measured window."""
    sw = Stopwatch(flops=True, warmup=warmup)
    sw.enable()
    train(sw)
    summary = sw.summary()
    record = summary.metadata["flops"]["train"]
    assert record["forward"] == forward_flops() and record["backward"] == 2 * forward_flops()
    assert record["step"] == 3 * forward_flops() and record["at_step"] == counted
    assert record["dtype"] == "fp32" and record["device"] is None
    train_phase = summary.phases["train"]
    assert train_phase.steps == steps and train_phase.stages["step/forward"].calls == steps
    text = stepwatch.render(summary)
    line = next(line for line in text.splitlines() if line.startswith("FLOPs: "))
    assert line.startswith(f"FLOPs: 4.72 MFLOP a step, counted on step {counted} (kept out of the timing); ")
    assert "no MFU on a CPU (give peak_flops= to read it against a peak)" in line
    per_s = record["step"] / (train_phase.measured / train_phase.steps)
    assert sw.metrics()["stepwatch/train/flops_per_s"] == pytest.approx(per_s)


def test_without_flops_nothing_is_counted() -> None:
    sw = Stopwatch()
    sw.enable()
    train(sw, batches=5)
    summary = sw.summary()
    assert summary.metadata["flops"] == {} and summary.phases["train"].steps == 4
    assert "FLOPs:" not in stepwatch.render(summary)


def test_mfu_through_the_device_test_double_with_a_given_peak(tmp_path: Path) -> None:
    """With the device double timing the stages, a given peak of 1 GFLOP/s: MFU is the achieved FLOP/s over it,
    beside the verdict, in metrics() and in the saved run."""
    device = RealtimeDevice()
    sw = Stopwatch(device=device, flops=True, peak_flops=1e9)  # type: ignore[arg-type]
    sw.enable()
    train(sw)
    summary = sw.summary()
    phase = summary.phases["train"]
    achieved = 3 * forward_flops() / (phase.measured / phase.steps)
    assert sw.metrics()["stepwatch/train/mfu"] == pytest.approx(achieved / 1e9)
    assert analyze(summary).figures["mfu"] == pytest.approx(achieved / 1e9)
    text = stepwatch.render(summary)
    headline = next(line for line in text.splitlines() if line.startswith("verdict: "))
    mfu = percent(achieved / 1e9)
    assert f" · {mfu} MFU (the given peak, fp32): " in headline, headline
    assert f"{mfu} MFU of the given peak, fp32 (1 GFLOP/s)" in text
    assert f"{mfu} MFU of the given peak, fp32 (1 GFLOP/s)" in stepwatch.render(summary, "html")
    sw.save(tmp_path / "run.json")
    again = stepwatch.render(stepwatch.load(tmp_path / "run.json")).splitlines()
    assert [line for line in again if line.startswith(("FLOPs: ", "verdict: "))] == [
        line for line in text.splitlines() if line.startswith(("FLOPs: ", "verdict: "))
    ]


@pytest.mark.parametrize(
    ("name", "dtype", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", (989e12, "H100 bf16")),
        ("NVIDIA H100 PCIe", "bf16", (756e12, "H100 PCIe bf16")),
        ("NVIDIA H100 NVL", "tf32", (417.5e12, "H100 NVL tf32")),
        ("NVIDIA H200", "fp16", (989e12, "H200 fp16")),
        ("NVIDIA A100-SXM4-80GB", "tf32", (156e12, "A100 tf32")),
        ("NVIDIA L40S", "bf16", (362e12, "L40S bf16")),
        ("NVIDIA L4", "fp32", (30.3e12, "L4 fp32")),
        ("AMD Instinct MI300X", "bf16", (1307.4e12, "MI300X bf16")),
        ("NVIDIA B200", "fp32", None),  # not in its datasheet's dense figures: no MFU rather than a guess
        ("NVIDIA GeForce RTX 4090", "bf16", None),
        (None, "fp32", None),
    ],
)
def test_the_peak_table_reads_device_names(name: str | None, dtype: str, peak: Any) -> None:
    assert known_peak(name, dtype) == peak


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "989e12", True])
def test_a_bad_peak_is_refused_in_one_line(bad: Any) -> None:
    with pytest.raises(ValueError, match="peak_flops must be a positive number of FLOP/s"):
        check_peak(bad)
    with pytest.raises(ValueError, match="peak_flops must be a positive number"):
        Stopwatch(peak_flops=bad)


def test_stepwatch_run_flops_on_a_real_script(tmp_path: Path) -> None:
    """``stepwatch run --peak-flops`` on the nanoGPT-shaped test program (auto-instrumented, no DataLoader)."""
    program = Path(__file__).parent / "programs" / "nanogpt_like.py"
    done = stepwatch_command("run", "--peak-flops", "1e12", "-o", "run.json", str(program), "losses.txt", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    run = stepwatch.load(tmp_path / "run.json")
    record = run.metadata["flops"]["train"]
    assert record["step"] > 0 and record["backward"] > record["forward"] > 0, record
    assert "MFU of the given peak, fp32 (1 TFLOP/s)" in done.stderr
    assert "% MFU (the given peak, fp32): " in done.stderr


def test_a_loop_left_in_the_counted_step_ends_the_counting_at_disable() -> None:
    """A ``break`` in the very step being counted: torch's counter does not stay on past ``disable()``."""
    sw = Stopwatch(flops=True)
    sw.enable()
    model = linear_stack()
    for index in sw.timed_iter(range(10)):
        model(torch.randn(BATCH, SIZES[0][0])).sum().backward()
        if index == 1:  # the second step: the one being counted
            break
    assert sw.flop_count is not None and sw.flop_count.counter is not None
    sw.disable()
    assert sw.flop_count.counter is None and sw.flop_count.counted["train"]["step"] == 3 * forward_flops() - sum(
        2 * BATCH * n * k for n, k in SIZES[:1]
    )  # the first layer's input needs no gradient here: its backward has one product, not two
    assert torch.utils._python_dispatch._get_current_dispatch_mode() is None
