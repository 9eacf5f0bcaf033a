"""How stepwatch's cost per step scales with the batch and with the model (not a test).

Three tables, each the median over repeats of paired differences against the plain loop (the same loop,
stepwatch off, run in alternating order within each repeat, so that the machine's drift touches both):

- ``watch(loader)`` against the batch size (16, 128, 1024), with 0 and 2 DataLoader workers: a TensorDataset
  of 8 features and an empty loop body, so that all that differs is the data pipeline's timing.
- ``auto()`` and the same stages by hand (``watch`` and 5 ``timed`` blocks) against the module calls a step
  makes (a ``Sequential`` of N Linear+ReLU blocks and a loss: 6, 34, 130, 514 calls).
- one run of each with a device: the device test double of ``tests/fake_device.py`` with ``memory="stage"``
  (two memory reads per block; on a real GPU each ``memory_stats()`` read builds a dictionary).

Writes ``benchmarks/results/scaling.json`` and prints the tables. Figures are microseconds added per step.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import stepwatch

RESULTS = Path(__file__).resolve().parent / "results"
BATCHES = (16, 128, 1024)
BLOCKS = {6: 2, 34: 16, 130: 64, 514: 256}  # module calls per step -> Linear+ReLU blocks


def paired(ways: dict[str, Callable[[], float]], repeats: int) -> dict[str, float]:
    """Each way's median, and each non-plain way's median paired difference against ``plain`` (ns/step)."""
    for run in ways.values():  # warm every path once
        run()
    times: dict[str, list[float]] = {way: [] for way in ways}
    added: dict[str, list[float]] = {way: [] for way in ways if way != "plain"}
    names = list(ways)
    for repeat in range(repeats):
        order = names if repeat % 2 else list(reversed(names))
        this = {way: ways[way]() for way in order}
        for way in names:
            times[way].append(this[way])
        for way in added:
            added[way].append(this[way] - this["plain"])
        stepwatch.reset()
    figures = {f"{way}_step_ns": statistics.median(values) for way, values in times.items()}
    figures.update({f"{way}_added_ns": statistics.median(values) for way, values in added.items()})
    return figures


def per_step(loop: Callable[[], int]) -> float:
    start = time.perf_counter_ns()
    steps = loop()
    return (time.perf_counter_ns() - start) / steps


def loader_table(steps: int, repeats: int, workers: int) -> dict[str, dict[str, float]]:
    table = {}
    for batch in BATCHES:
        data = TensorDataset(torch.randn(batch * steps, 8), torch.randn(batch * steps, 1))
        options: dict[str, Any] = {"batch_size": batch, "num_workers": workers}
        if workers:
            options.update(persistent_workers=True, multiprocessing_context="fork")
        plain_loader, watched_loader = DataLoader(data, **options), DataLoader(data, **options)

        def plain(loader: DataLoader[Any] = plain_loader) -> int:
            return sum(1 for _ in loader)

        def watched(loader: DataLoader[Any] = watched_loader) -> int:
            stepwatch.enable()
            try:
                return sum(1 for _ in stepwatch.watch(loader))
            finally:
                stepwatch.disable()

        table[str(batch)] = paired({"plain": lambda: per_step(plain), "watch": lambda: per_step(watched)}, repeats)
        del plain_loader, watched_loader
    return table


Training = tuple[nn.Module, nn.Module, torch.optim.Optimizer, DataLoader[Any]]


def build(blocks: int, steps: int) -> Training:
    """A model of ``blocks`` Linear+ReLU blocks, its loss, its optimizer and ``steps`` batches of 8."""
    torch.manual_seed(0)
    model = nn.Sequential(*[layer for _ in range(blocks) for layer in (nn.Linear(16, 16), nn.ReLU())])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(TensorDataset(torch.randn(8 * steps, 16), torch.randn(8 * steps, 16)), batch_size=8)
    return model, nn.MSELoss(), optimizer, loader


def by_hand(recorder: Any, training: Training, after_step: Callable[[int], None] | None = None) -> int:
    """The training loop with its stages written by hand, on ``recorder``: the ``stepwatch`` module (its
    default stopwatch) or a ``Stopwatch``, which have the same ``watch`` and ``timed``. ``after_step(index)``,
    if given, is called at the end of each step (``instructions.py`` marks the steps it counts)."""
    model, criterion, optimizer, loader = training
    for index, (x, y) in enumerate(recorder.watch(loader)):
        with recorder.timed("forward"):
            out = model(x)
        with recorder.timed("loss"):
            loss = criterion(out, y)
        with recorder.timed("backward"):
            loss.backward()
        with recorder.timed("optimizer"):
            optimizer.step()
        with recorder.timed("zero_grad"):
            optimizer.zero_grad()
        if after_step is not None:
            after_step(index)
    return len(loader)


def model_ways(blocks: int, steps: int) -> dict[str, Callable[[], float]]:
    """The plain loop, ``auto()`` over it, and the same stages by hand, on a model of ``blocks`` blocks."""
    training = build(blocks, steps)
    model, criterion, optimizer, loader = training

    def plain() -> int:
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        return len(loader)

    def auto() -> float:
        stepwatch.auto()
        try:
            return per_step(plain)
        finally:
            stepwatch.auto(False)
            stepwatch.disable()

    def hand() -> float:
        stepwatch.enable()
        try:
            return per_step(lambda: by_hand(stepwatch, training))
        finally:
            stepwatch.disable()

    return {"plain": lambda: per_step(plain), "auto": auto, "by_hand": hand}


def model_table(steps: int, repeats: int) -> dict[str, dict[str, float]]:
    return {str(calls): paired(model_ways(blocks, steps), repeats) for calls, blocks in BLOCKS.items()}


def device_run(steps: int, repeats: int) -> dict[str, float]:
    """The by-hand loop of 34 module calls on a stopwatch with the device test double and memory="stage"."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.conftest import FakeClock
    from tests.fake_device import FakeDevice

    training = build(16, steps)
    results = {}
    for memory in ("step", "stage"):
        sw = stepwatch.Stopwatch(device=FakeDevice(FakeClock()), memory=memory)

        def loop(sw: stepwatch.Stopwatch = sw) -> int:
            return by_hand(sw, training)

        sw.enable()
        loop()
        results[f"memory_{memory}_step_ns"] = statistics.median(per_step(loop) for _ in range(repeats))
        sw.disable()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=100, help="training steps per run")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--workers", default="0,2", help="worker counts of the watch() table")
    parser.add_argument("--parts", default="watch,model,device", help="which tables to measure")
    parser.add_argument("--out", default=str(RESULTS / "scaling.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    parts = args.parts.split(",")
    workers = [int(count) for count in args.workers.split(",")]
    result: dict[str, Any] = {
        "watch_by_batch": {f"workers_{w}": loader_table(args.steps, args.repeats, w) for w in workers}
        if "watch" in parts
        else {},
        "by_module_calls": model_table(args.steps, args.repeats) if "model" in parts else {},
        "device_double": device_run(args.steps, args.repeats) if "device" in parts else {},
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count()},
        "config": {"steps": args.steps, "repeats": args.repeats},
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print("watch(loader): µs added per step, by batch size")
    for workers, table in result["watch_by_batch"].items():
        row = "  ".join(f"{batch:>5}: {figures['watch_added_ns'] / 1e3:7.1f}" for batch, figures in table.items())
        print(f"  {workers:10s} {row}")
    print("auto() and by hand: µs added per step, by module calls per step")
    for calls, figures in result["by_module_calls"].items():
        auto, hand = figures["auto_added_ns"] / 1e3, figures["by_hand_added_ns"] / 1e3
        print(
            f"  {calls:>4} calls  auto {auto:8.1f}  by hand {hand:7.1f}  (plain {figures['plain_step_ns'] / 1e3:7.1f})"
        )
    for name, value in result["device_double"].items():
        print(f"  device double, {name}: {value / 1e3:.1f} µs per step")


if __name__ == "__main__":
    main()
