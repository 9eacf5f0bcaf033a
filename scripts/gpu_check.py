"""Exercises stepwatch's real CUDA path; run it on a machine with a GPU (exits 2 without one).

    python scripts/gpu_check.py [--out benchmarks/results/gpu_check.json]

Asserts: device times of a known matmul are positive and plausible; no synchronize happens in the hot path in
async mode; stage device times add up to within 5% of the step's; an input-starved loop shows a high GPU idle
share and a GPU-bound loop a low one, and stays compute-bound with a ``loss.item()`` at each step's end; the
peak memory of a stage that allocates a known tensor is at least that tensor's size; an unchanged loop under
``stepwatch.auto()`` gets ``h2d`` and device times. Prints one line per check and writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import stepwatch
from stepwatch._device import TorchDevice


class CountingDevice(TorchDevice):
    """The real CUDA backend, counting synchronize calls so the check can prove the hot path makes none."""

    def __init__(self, device: Any) -> None:
        super().__init__(device)
        self.synchronize_calls = 0

    def synchronize(self) -> None:
        self.synchronize_calls += 1
        super().synchronize()


def reference_matmul_ms(torch: Any, a: Any, b: Any, repeats: int = 20) -> float:
    """Device time of one matmul measured the plain way: events around a synchronized batch."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeats):
        a @ b
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) / repeats


def run_loop(
    torch: Any, device: CountingDevice, steps: int, load_s: float, size: int, matmuls: int, item: bool = False
) -> Any:
    sw = stepwatch.Stopwatch(device=device, warmup=3)
    sw.enable()
    x = torch.randn(size, size, device="cuda")

    def batches():
        for i in range(steps):
            if load_s:
                time.sleep(load_s)  # an input pipeline that cannot keep up
            yield i

    for _ in sw.timed_iter(batches()):
        with sw.timed("forward"):
            y = x
            for _ in range(matmuls):
                y = torch.tanh(y @ x)
        with sw.timed("backward"):
            for _ in range(matmuls):
                y = torch.tanh(y @ x)
        if item:
            y.sum().item()  # the user's own loss.item(): a synchronize at each step's end
        sw.count(samples=size)
    before_summary = device.synchronize_calls
    summary = sw.summary()
    return sw, summary, before_summary


def auto_loop(torch: Any) -> Any:
    """A plain training loop run under ``stepwatch.auto()``: the model moved to CUDA before the loop starts."""
    from torch.utils.data import DataLoader, TensorDataset

    stepwatch.auto()
    try:
        model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        criterion = torch.nn.CrossEntropyLoss()
        data = TensorDataset(torch.randn(64 * 20, 512), torch.randint(0, 10, (64 * 20,)))
        for x, y in DataLoader(data, batch_size=64, pin_memory=True):
            x, y = x.to("cuda", non_blocking=True), y.to("cuda", non_blocking=True)
            loss = criterion(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return stepwatch.summary()
    finally:
        stepwatch.auto(False)
        stepwatch.disable()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="benchmarks/results/gpu_check.json")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here", file=sys.stderr)
        return 2
    checks: list[tuple[str, bool, str]] = []
    figures: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}

    # 1. a known matmul: positive and plausible against a plain event measurement
    device = CountingDevice("cuda")
    a = torch.randn(4096, 4096, device="cuda")
    b = torch.randn(4096, 4096, device="cuda")
    reference = reference_matmul_ms(torch, a, b)
    sw = stepwatch.Stopwatch(device=device)
    sw.enable()
    for _ in sw.timed_iter(range(30)):
        with sw.timed("matmul"):
            a @ b
    stage = sw.summary().stages["step/matmul"]
    measured = stage.device.mean * 1e3
    figures["matmul_4096_ms"] = {"stepwatch_device": measured, "reference_events": reference, "cpu": stage.mean * 1e3}
    checks.append(
        (
            "matmul device time positive and plausible",
            measured > 0 and 0.5 < measured / reference < 2.0,
            f"{measured:.3f} ms vs {reference:.3f} ms",
        )
    )

    # 2-4. GPU-bound and input-starved loops, asynchronous mode
    bound_device = CountingDevice("cuda")
    _, bound, syncs_in_loop = run_loop(torch, bound_device, steps=40, load_s=0.0, size=2048, matmuls=8)
    starved_device = CountingDevice("cuda")
    _, starved, _ = run_loop(torch, starved_device, steps=25, load_s=0.03, size=512, matmuls=2)
    checks.append(("no synchronize in the async hot path", syncs_in_loop == 0, f"{syncs_in_loop} calls"))
    stages = bound.stages
    parts = stages["step/forward"].device.total + stages["step/backward"].device.total
    whole = stages["step"].device.total
    checks.append(
        (
            "stage device times add up to the step's (5%)",
            abs(parts - whole) <= 0.05 * whole,
            f"{parts:.4f} s of {whole:.4f} s",
        )
    )
    idle_bound, idle_starved = bound.main_phase.device.idle_share, starved.main_phase.device.idle_share
    figures["idle_share"] = {"gpu_bound": idle_bound, "input_starved": idle_starved}
    checks.append(("GPU-bound loop: low idle share (< 10%)", idle_bound < 0.10, f"{idle_bound:.1%}"))
    checks.append(("input-starved loop: high idle share (> 50%)", idle_starved > 0.50, f"{idle_starved:.1%}"))

    # 4b. the GPU-bound loop with a synchronize at each step's end (loss.item()): still compute-bound
    _, synced, _ = run_loop(torch, CountingDevice("cuda"), steps=40, load_s=0.0, size=2048, matmuls=8, item=True)
    synced_verdict = synced.verdict
    figures["synchronized_each_step"] = {"verdict": synced_verdict.label, **synced_verdict.figures}
    checks.append(
        (
            "GPU-bound loop with loss.item() each step: compute-bound, not host-bound",
            synced_verdict.kind == "compute-bound",
            synced_verdict.headline,
        )
    )

    # 5. peak memory of a stage that allocates a known tensor
    sw = stepwatch.Stopwatch(device=CountingDevice("cuda"), memory="stage")
    sw.enable()
    size_bytes = 256 * 2**20
    with sw.timed("allocate"):
        tensor = torch.empty(size_bytes, dtype=torch.uint8, device="cuda")
        del tensor
    peak = sw.summary().stages["allocate"].peak_allocated or 0
    figures["peak_allocate_bytes"] = peak
    checks.append(("peak memory >= known tensor", peak >= size_bytes, f"{peak / 2**20:.1f} MiB >= 256 MiB"))

    # 6. auto-instrumentation: an unchanged loop on CUDA gets h2d and device times with no stepwatch call in it
    auto_summary = auto_loop(torch)
    auto_stages = auto_summary.phases["train"].stages
    found = auto_summary.metadata.get("auto") or ""
    figures["auto"] = found
    checks.append(
        (
            "auto: h2d timed, forward has device time",
            "step/h2d" in auto_stages and auto_stages["step/forward"].device is not None,
            found,
        )
    )

    # 7. the timeline's device lane: each stage's device time, placed on the CPU's clock by the anchor
    sw = stepwatch.Stopwatch(device="cuda", trace_steps=20)
    sw.enable()
    x = torch.randn(2048, 2048, device="cuda")
    for _ in sw.timed_iter(range(10)):
        with sw.timed("forward"):
            for _ in range(4):
                x = torch.tanh(x @ x)
    traced = sw.summary()
    lane = [e for e in traced.trace if e.lane.startswith("device") and e.path == "step/forward"]
    device_total = traced.stages["step/forward"].device.total_ns if traced.stages["step/forward"].device else 0
    on_lane = sum(e.duration_ns for e in lane)
    checks.append(
        (
            "timeline: device lane holds forward's device time",
            len(lane) == 9 and on_lane == device_total,
            f"{len(lane)} device events, {on_lane / 1e6:.2f} ms of {device_total / 1e6:.2f} ms",
        )
    )

    # FLOPs and MFU on the real device: a bf16 Linear stack of known FLOPs, the peak read from the device's name
    from stepwatch._mfu import flops_of

    sw = stepwatch.Stopwatch(device="cuda", flops=True, warmup=2)
    sw.enable()
    layers = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096, bias=False) for _ in range(4)]).cuda().bfloat16()
    batch = torch.randn(2048, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for _ in sw.timed_iter(range(20)):
        with sw.timed("forward"):
            out = layers(batch)
        with sw.timed("backward"):
            out.float().sum().backward()
    counted = sw.summary()
    record = counted.metadata["flops"].get("train") or {}
    expected = 4 * 2 * 2048 * 4096 * 4096 * 3  # forward 2mnk a layer, backward twice that
    achieved = flops_of(counted, counted.main_phase)
    checks.append(
        (
            "FLOPs: exact on the device, bf16, MFU from the peak table",
            record.get("step") == expected and record.get("dtype") == "bf16" and achieved is not None,
            f"{record} -> {achieved.describe() if achieved else 'no figures'}",
        )
    )

    figures["reports"] = {"gpu_bound": stepwatch.render(bound), "input_starved": stepwatch.render(starved)}
    figures["checks"] = [{"check": name, "passed": ok, "detail": detail} for name, ok, detail in checks]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(figures, indent=1) + "\n")
    for name, ok, detail in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
    print(figures["reports"]["gpu_bound"])
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
