"""What auto-instrumentation adds to a training step, against the plain loop and against hand-written blocks
(not a test).

One unmodified loop (a DataLoader, forward, loss, backward, optimizer step and zero_grad on a ~2 ms CPU step)
runs three ways, in alternating order within each repeat: plain (stepwatch off, nothing patched), under
``stepwatch.auto()`` (what ``stepwatch run`` and ``STEPWATCH=auto`` do, in this process so that interpreter
start-up does not drown the per-step figure), and with the same stages written by hand (``watch`` and
``timed``), plus the plain loop once more as the noise floor, in a shuffled order within each repeat. Medians
of the paired differences over repeats resist the machine's drift. Writes
``benchmarks/results/auto.json`` and prints the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import stepwatch

RESULTS = Path(__file__).resolve().parent / "results"


def build(steps: int) -> tuple[nn.Module, Any, Any, DataLoader[Any]]:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(384, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = TensorDataset(torch.randn(64 * steps, 384), torch.randn(64 * steps, 1))
    return model, optimizer, nn.MSELoss(), DataLoader(data, batch_size=64)


def plain(model: nn.Module, optimizer: Any, criterion: Any, loader: DataLoader[Any]) -> float:
    """The program as its author wrote it: nanoseconds per step."""
    start = time.perf_counter_ns()
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return (time.perf_counter_ns() - start) / len(loader)


def by_hand(model: nn.Module, optimizer: Any, criterion: Any, loader: DataLoader[Any]) -> float:
    """The same stages, written by hand with stepwatch's API."""
    start = time.perf_counter_ns()
    for x, y in stepwatch.watch(loader):
        with stepwatch.timed("forward"):
            out = model(x)
        with stepwatch.timed("loss"):
            loss = criterion(out, y)
        with stepwatch.timed("backward"):
            loss.backward()
        with stepwatch.timed("optimizer"):
            optimizer.step()
        with stepwatch.timed("zero_grad"):
            optimizer.zero_grad()
        stepwatch.count(samples=len(y))
    return (time.perf_counter_ns() - start) / len(loader)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200, help="training steps per run")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", default=str(RESULTS / "auto.json"))
    args = parser.parse_args()
    model, optimizer, criterion, loader = build(args.steps)

    def run(way: str) -> float:
        if way == "plain":
            return plain(model, optimizer, criterion, loader)
        if way == "auto":
            stepwatch.auto()
            try:
                return plain(model, optimizer, criterion, loader)  # the very same code, patched
            finally:
                stepwatch.auto(False)
                stepwatch.disable()
        stepwatch.enable()
        try:
            return by_hand(model, optimizer, criterion, loader)
        finally:
            stepwatch.disable()

    ways = ["plain", "plain again", "auto", "by hand"]
    for way in ways:  # warm every path once
        run(way.removesuffix(" again"))
    times: dict[str, list[float]] = {way: [] for way in ways}
    shuffle = random.Random(0).shuffle
    for _ in range(args.repeats):
        order = list(ways)
        shuffle(order)  # in a fixed order, whatever runs after a stepwatch run was 0.7% slower or faster
        this = {way: run(way.removesuffix(" again")) for way in order}
        for way in ways:
            times[way].append(this[way])
        stepwatch.reset()

    def added_to_plain(way: str) -> float:
        return statistics.median(t - p for t, p in zip(times[way], times["plain"], strict=True))

    step = statistics.median(times["plain"])
    added = added_to_plain("auto")
    figures = {
        "step_ns_plain": step,
        "step_ns_auto": statistics.median(times["auto"]),
        "step_ns_by_hand": statistics.median(times["by hand"]),
        "auto_added_ns_per_step_median_paired": added,
        "by_hand_added_ns_per_step_median_paired": added_to_plain("by hand"),
        "auto_minus_by_hand_ns_per_step_median_paired": statistics.median(
            a - h for a, h in zip(times["auto"], times["by hand"], strict=True)
        ),
        "noise_floor_plain_again_minus_plain_ns": added_to_plain("plain again"),
    }
    share = added / step
    hand_share = added_to_plain("by hand") / step
    estimates = own_estimates(model, optimizer, criterion, loader)
    figures_shares = {
        "auto: measured share": share,
        "auto: stepwatch's own estimate": estimates["auto"],
        "by hand: measured share": hand_share,
        "by hand: stepwatch's own estimate": estimates["by hand"],
    }
    result = {
        "figures": figures,
        "own_cost_estimate": figures_shares,
        "targets": {
            "auto adds < 1% of the step": {"value": share, "limit": 0.01, "met": share < 0.01},
            "by hand adds < 0.5% of the step": {"value": hand_share, "limit": 0.005, "met": hand_share < 0.005},
            **{
                f"{way}: the own-cost estimate within 2x of the measured": {
                    "value": ratio,
                    "limit": 2.0,
                    "met": 0.5 <= ratio <= 2.0,
                }
                for way, ratio in (
                    ("auto", estimates["auto"] / share if share > 0 else float("inf")),
                    ("by hand", estimates["by hand"] / hand_share if hand_share > 0 else float("inf")),
                )
            },
        },
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count()},
        "config": {"steps": args.steps, "repeats": args.repeats},
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for name, value in figures.items():
        print(f"{name:48s} {value / 1e3:10.1f} µs")
    for name, value in figures_shares.items():
        print(f"{name:48s} {value:10.2%}")
    for name, target in result["targets"].items():
        met = "met" if target["met"] else "NOT met"
        print(f"{name:60s} {target['value']:8.4f}  limit {target['limit']:6.3f}  {met}")


def own_estimates(model: nn.Module, optimizer: Any, criterion: Any, loader: DataLoader[Any]) -> dict[str, float]:
    """What the report's last line estimates of stepwatch's own cost, after one run each way."""
    from stepwatch._self_cost import own_share

    estimates = {}
    for way in ("auto", "by hand"):
        stepwatch.reset()
        if way == "auto":
            stepwatch.auto()
            plain(model, optimizer, criterion, loader)
            stepwatch.auto(False)
        else:
            stepwatch.enable()
            by_hand(model, optimizer, criterion, loader)
        estimates[way] = own_share(stepwatch.summary()) or 0.0
        stepwatch.disable()
    stepwatch.reset()
    return estimates


if __name__ == "__main__":
    main()
