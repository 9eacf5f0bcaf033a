"""Throughput cost of GPU timing (run on a GPU; not a test).

A GPU-bound training loop (an MLP on random data already on the device) runs with stepwatch off, in its
asynchronous event mode (peak memory per step, the default, and per stage), in exact synchronous mode, and with
a naive timer that calls ``torch.cuda.synchronize()`` at every stage boundary. Runs are interleaved; medians of
samples/s are reported as ratios to off. Target: async within 1% of off. Also measures what one read of the
allocator's statistics costs (``max_memory_allocated()`` builds the whole ``memory_stats()`` dict each time,
which stepwatch now reads once per boundary). Writes ``benchmarks/results/gpu.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import stepwatch

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(RESULTS / "gpu.json"))
    args = parser.parse_args()
    import torch
    from torch import nn

    if not torch.cuda.is_available():
        print("benchmarks/gpu.py: no CUDA device here", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 10))
    model.cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    criterion = nn.CrossEntropyLoss()
    data = [(torch.randn(512, 4096, device="cuda"), torch.randint(0, 10, (512,), device="cuda")) for _ in range(8)]

    @contextmanager
    def synchronizing(_name: str) -> Any:
        torch.cuda.synchronize()
        yield
        torch.cuda.synchronize()

    def loop(mode: str) -> float:
        memory = "stage" if mode == "async, memory per stage" else "step"
        timing = mode in ("async", "sync", "async, memory per stage")
        sw = stepwatch.Stopwatch(device="cuda", sync=mode == "sync", memory=memory) if timing else None
        if sw is not None:
            sw.enable()
        timed = sw.timed if sw is not None else (synchronizing if mode == "naive sync" else None)
        iterable = sw.timed_iter(range(args.steps)) if sw is not None else range(args.steps)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for i in iterable:
            x, y = data[i % len(data)]
            if timed is None:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                continue
            with timed("forward"):
                out = model(x)
            with timed("loss"):
                loss = criterion(out, y)
            with timed("backward"):
                loss.backward()
            with timed("optimizer"):
                optimizer.step()
                optimizer.zero_grad()
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        if sw is not None:
            sw.summary()
        return args.steps * 512 / elapsed

    modes = ["off", "async", "async, memory per stage", "sync", "naive sync"]
    for mode in modes:
        loop(mode)  # warm-up
    samples: dict[str, list[float]] = {mode: [] for mode in modes}
    for repeat in range(args.repeats):
        for mode in modes[repeat % len(modes) :] + modes[: repeat % len(modes)]:
            samples[mode].append(loop(mode))
    medians = {mode: statistics.median(values) for mode, values in samples.items()}
    ratios = {mode: medians[mode] / medians["off"] for mode in modes}
    reads = {}
    for name, read in (
        ("max_memory_allocated", lambda: torch.cuda.max_memory_allocated()),
        ("memory_stats (stepwatch's one read)", lambda: torch.cuda.memory_stats()),
        ("reset_peak_memory_stats", lambda: torch.cuda.reset_peak_memory_stats()),
    ):
        start = time.perf_counter_ns()
        for _ in range(2000):
            read()
        reads[name] = (time.perf_counter_ns() - start) / 2000
    result = {
        "device": torch.cuda.get_device_name(0),
        "memory_read_ns": reads,
        "samples_per_s": medians,
        "ratio_to_off": ratios,
        "target_async_within_1pct": {"value": 1 - ratios["async"], "limit": 0.01, "met": 1 - ratios["async"] <= 0.01},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for mode in modes:
        print(f"{mode:24} {medians[mode]:12,.0f} samples/s  {ratios[mode]:.3f} x off")
    for name, ns in reads.items():
        print(f"{name:36} {ns / 1e3:8.1f} us per call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
