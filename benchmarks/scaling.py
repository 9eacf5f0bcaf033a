"""How stepwatch's cost per step scales with the batch and with the model (not a test).

Three tables, each the median over repeats of paired differences against the plain loop (the same loop,
stepwatch off, run in alternating order within each repeat, so that the machine's drift touches both):

- ``watch(loader)`` against the batch size (16, 128, 1024), with 0 and 2 DataLoader workers: a TensorDataset
  of 8 features and an empty loop body, so that all that differs is the data pipeline's timing.
- ``auto()`` and the same stages by hand (``watch`` and 5 ``timed`` blocks) against the module calls a step
  makes (a ``Sequential`` of N Linear+ReLU blocks and a loss: 6, 34, 130, 514 calls).
- one run of each with a device: the device test double of ``tests/fake_device.py`` with ``memory="stage"``
  (two memory reads per block; on a real GPU each ``memory_stats()`` read builds a dictionary).

Each run is timed twice: over the whole run (the loop's start and end in it: the first batch, ``auto()``'s
learning steps, which route every module call through Python) and over its steady state, from the end of step
:data:`WARM_STEPS` to the end of the last step: what each further step of a long training pays. The targets
are about the second; the first is printed beside it. Each run also counts Python's garbage collections and
the time they took (``Collector``): at batch 1024 without workers they are a third of the plain step, so the
watch() table says, beside the time, whether stepwatch changed how much the collector did, and what the steady
state added outside the collections (their time taken out of each run's: where a run's full collections fall
moves its time by far more than stepwatch's cost). Since stepwatch leaves the collector's work as it was, the
watch() and model tables are measured twice (``--collector on,paused``): with the collector as the loop has it,
and paused (everything collected before each run, the collector disabled during it), where what remains is what
stepwatch adds to the rest of the step. Every table has a noise floor beside its figures: the plain loop run
once more (``plain_again``), paired against the plain loop as the other ways are. The model table also pairs
``auto()`` against by hand directly (``auto_minus_by_hand``: the median of their differences repeat by repeat,
what target 2's "at most by hand + 10 us" asks, rather than the difference of two medians against the plain loop).

Every paired median has its standard error beside it in the results (``..._standard_error``, bootstrap over the
repeats). Writes ``benchmarks/results/scaling.json`` and prints the tables. Figures are microseconds added per
step.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import stepwatch
from stepwatch._self_cost import IN_SITU

RESULTS = Path(__file__).resolve().parent / "results"
BATCHES = (16, 128, 1024)
BLOCKS = {6: 2, 34: 16, 130: 64, 514: 256}  # module calls per step -> Linear+ReLU blocks
WARM_STEPS = IN_SITU + 8
"""Steps before the steady state: the loop's first, auto()'s learning steps (see ``_module_calls``), and
stepwatch's own cost measured in place (``IN_SITU`` steps from the third), whose steps take the general step
boundary (before 2026-12-03, night, 5: a 100-step run's steady state had 22 of its 95 steps inside it)."""
AfterStep = Callable[[int], None]
Result = TypeVar("Result")
SPANS = {"run": "step_ns", "steady": "steady_step_ns", "steady_outside_collector": "steady_outside_collector_step_ns"}
"""What each run's time per step is taken over -> the figures' names (their paired differences: ``added_ns``)."""


def paired(ways: dict[str, Callable[[], dict[str, float]]], repeats: int, collector: str) -> dict[str, float]:
    """Each way's medians (whole run and steady state), and each non-plain way's median paired differences
    against ``plain`` (ns/step); ``plain_again`` among the ways is the noise floor. ``collector``: ``"on"``, as
    the loop has it, or ``"paused"`` (collected before each run, disabled during it)."""
    ways = {**ways, "plain_again": ways["plain"]}
    for run in ways.values():  # warm every path once
        run()
    times: dict[str, list[dict[str, float]]] = {way: [] for way in ways}
    names = list(ways)
    for repeat in range(repeats):
        order = names if repeat % 2 else list(reversed(names))
        this = {way: run_with_collector(ways[way], collector) for way in order}
        for way in names:
            times[way].append(this[way])
        stepwatch.reset()
    figures = {}
    for way, runs in times.items():
        for measure in ("collector", "collections"):
            figures[f"{way}_{measure}_per_step"] = statistics.median(run[measure] for run in runs)
        for span, key in SPANS.items():
            figures[f"{way}_{key}"] = statistics.median(run[span] for run in runs)
            if way != "plain":
                added = key.replace("step_ns", "added_ns")
                differences = [run[span] - plain[span] for run, plain in zip(runs, times["plain"], strict=True)]
                figures[f"{way}_{added}"] = statistics.median(differences)
                figures[f"{way}_{added}_standard_error"] = standard_error(differences)
    if "auto" in times and "by_hand" in times:  # target 2's "by hand + 10 us", paired in itself
        for span, key in SPANS.items():
            differences = [a[span] - h[span] for a, h in zip(times["auto"], times["by_hand"], strict=True)]
            name = f"auto_minus_by_hand_{key.replace('step_ns', 'added_ns')}"
            figures[name] = statistics.median(differences)
            figures[f"{name}_standard_error"] = standard_error(differences)
    return figures


def machine() -> dict[str, Any]:
    """The host the figures were taken on: Python, torch, CPUs, the processor and its caches (Linux; "" where not
    read). Two hosts of one kind read the same code's cost several microseconds a step apart (2026-12-07), so a
    result names its host and ``--append`` pools only sittings of the same one."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = (part.strip() for part in line.partition(":"))
            info.setdefault(key, value)
    except OSError:
        pass
    caches = []
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level, kind, size = ((index / name).read_text().strip() for name in ("level", "type", "size"))
        except OSError:
            continue
        caches.append(f"L{level}{'' if kind == 'Unified' else kind[0].lower()} {size}")
    cpu = info.get("model name", "") + (
        f" (family {info['cpu family']}, model {info['model']})" if "cpu family" in info and "model" in info else ""
    )
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "cpu": cpu or platform.processor() or platform.machine(),
        "caches": ", ".join(caches),
    }


def standard_error(differences: list[float], resamples: int = 2000) -> float:
    """The standard error of the median of paired differences, by bootstrap (the repeats resampled with
    replacement, a fixed seed): how far the median could move with other repeats of the same machine. With 90
    repeats of ``auto.py``'s step it was 4 to 6 us, as large as what separated by hand's figure from its target."""
    draw = random.Random(1).choices
    medians = [statistics.median(draw(differences, k=len(differences))) for _ in range(resamples)]
    return statistics.stdev(medians)


def resolved(value: float, limit: float, error: float) -> bool:
    """Whether a figure and its limit are more than two standard errors apart: if not, another run of the same code
    may well give the other verdict (``auto.py``'s and ``overhead.py``'s targets)."""
    return abs(value - limit) > 2 * error


def run_with_collector(run: Callable[[], Result], collector: str) -> Result:
    """One run, the garbage collector as the loop has it (``"on"``) or ``"paused"``: everything collected before
    the run and the collector disabled during it, so that no collection falls inside it. Where a run's
    collections fall moves its time by far more than stepwatch's cost (a full one walks every object of the
    process, torch's mostly, and leaves the caches cold); ``watch()`` and ``auto()`` leave the collector's work
    as it was (the "on" tables count it), so with it paused what remains is what they add to the rest."""
    if collector == "on":
        return run()
    gc.collect()
    gc.disable()
    try:
        return run()
    finally:
        gc.enable()


def per_step(loop: Callable[[AfterStep], int]) -> dict[str, float]:
    """Runs ``loop(after_step)`` once: its time per step over the whole run, and over its steady state (from
    the end of step :data:`WARM_STEPS` to the end of the last step; ``after_step`` reads the clock after each
    step, in every way alike)."""
    marks: dict[int, int] = {}
    collected_at: dict[int, int] = {}  # the collector's time so far, at each mark

    def after_step(index: int) -> None:
        marks[index] = time.perf_counter_ns()
        collected_at[index] = collector.spent_ns

    collector = Collector()
    gc.callbacks.append(collector)
    try:
        start = time.perf_counter_ns()
        steps = loop(after_step)
        end = time.perf_counter_ns()
    finally:
        gc.callbacks.remove(collector)
    last = max(marks)
    steady_steps = last - WARM_STEPS + 1
    steady = (marks[last] - marks[WARM_STEPS - 1]) / steady_steps
    collector_steady = (collected_at[last] - collected_at[WARM_STEPS - 1]) / steady_steps
    return {
        "run": (end - start) / steps,
        "steady": steady,
        "steady_outside_collector": steady - collector_steady,
        "collector": collector.spent_ns / steps,
        "collections": collector.collections / steps,
    }


class Collector:
    """Python's garbage collections during a run and the time they took (a ``gc.callbacks`` entry): at batch
    1024 without workers the plain loop's own collections are a third of its step, and where its full ones
    fall moves a run's time by far more than stepwatch's cost, so the tables say whether ``watch()`` changes
    how much the collector does."""

    def __init__(self) -> None:
        self.collections = 0
        self.spent_ns = 0
        self._started = 0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter_ns()
        else:
            self.collections += 1
            self.spent_ns += time.perf_counter_ns() - self._started


def loader_table(steps: int, repeats: int, workers: int, collector: str) -> dict[str, dict[str, float]]:
    table = {}
    for batch in BATCHES:
        data = TensorDataset(torch.randn(batch * steps, 8), torch.randn(batch * steps, 1))
        options: dict[str, Any] = {"batch_size": batch, "num_workers": workers}
        if workers:
            options.update(persistent_workers=True, multiprocessing_context="fork")
        plain_loader, watched_loader = DataLoader(data, **options), DataLoader(data, **options)

        def plain(after_step: AfterStep, loader: DataLoader[Any] = plain_loader) -> int:
            for index, _ in enumerate(loader):
                after_step(index)
            return len(loader)

        def watched(after_step: AfterStep, loader: DataLoader[Any] = watched_loader) -> int:
            stepwatch.enable()
            try:
                for index, _ in enumerate(stepwatch.watch(loader)):
                    after_step(index)
                return len(loader)
            finally:
                stepwatch.disable()

        table[str(batch)] = paired(
            {"plain": lambda: per_step(plain), "watch": lambda: per_step(watched)}, repeats, collector
        )
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


def model_ways(blocks: int, steps: int) -> dict[str, Callable[[], dict[str, float]]]:
    """The plain loop, ``auto()`` over it, and the same stages by hand, on a model of ``blocks`` blocks."""
    training = build(blocks, steps)
    model, criterion, optimizer, loader = training

    def plain(after_step: AfterStep) -> int:
        for index, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            after_step(index)
        return len(loader)

    def auto() -> dict[str, float]:
        stepwatch.auto()
        try:
            return per_step(plain)
        finally:
            stepwatch.auto(False)
            stepwatch.disable()

    def hand() -> dict[str, float]:
        stepwatch.enable()
        try:
            return per_step(lambda after_step: by_hand(stepwatch, training, after_step))
        finally:
            stepwatch.disable()

    return {"plain": lambda: per_step(plain), "auto": auto, "by_hand": hand}


def model_table(steps: int, repeats: int, collector: str, calls: list[int]) -> dict[str, dict[str, float]]:
    return {str(count): paired(model_ways(BLOCKS[count], steps), repeats, collector) for count in calls}


def device_run(steps: int, repeats: int) -> dict[str, float]:
    """The by-hand loop of 34 module calls on a stopwatch with the device test double and memory="stage"."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.conftest import FakeClock
    from tests.fake_device import FakeDevice

    training = build(16, steps)
    results = {}
    for memory in ("step", "stage"):
        sw = stepwatch.Stopwatch(device=FakeDevice(FakeClock()), memory=memory)

        def loop(after_step: AfterStep, sw: stepwatch.Stopwatch = sw) -> int:
            return by_hand(sw, training, after_step)

        sw.enable()
        loop(lambda index: None)
        runs = [per_step(loop) for _ in range(repeats)]
        results[f"memory_{memory}_step_ns"] = statistics.median(run["run"] for run in runs)
        results[f"memory_{memory}_steady_step_ns"] = statistics.median(run["steady"] for run in runs)
        sw.disable()
    return results


def added(figures: dict[str, float], way: str) -> str:
    """A way's added µs per step: the steady state's, and the whole run's in parentheses."""
    return f"{figures[f'{way}_steady_added_ns'] / 1e3:7.1f} ({figures[f'{way}_added_ns'] / 1e3:6.1f})"


def collected(figures: dict[str, float], way: str) -> str:
    """A way's time in the garbage collector per step, and its collections per step in parentheses."""
    return f"{figures[f'{way}_collector_per_step'] / 1e3:.0f} ({figures[f'{way}_collections_per_step']:.2f})"


COLLECTOR_KEYS = {"on": "", "paused": "_collector_paused"}
"""A table's key suffix in the results, by the collector's mode."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=100, help="training steps per run")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--workers", default="0,2", help="worker counts of the watch() table")
    parser.add_argument("--parts", default="watch,model,device", help="which tables to measure")
    parser.add_argument(
        "--calls", default=",".join(map(str, BLOCKS)), help="module calls per step of the model table's columns"
    )
    parser.add_argument(
        "--collector", default="on,paused", help="the garbage collector's modes: on (as the loop has it), paused"
    )
    parser.add_argument("--out", default=str(RESULTS / "scaling.json"))
    args = parser.parse_args()
    if args.steps < WARM_STEPS + 10:
        parser.error(f"--steps must be at least {WARM_STEPS + 10}: the steady state starts after {WARM_STEPS} steps")
    modes = args.collector.split(",")
    if not modes or any(mode not in COLLECTOR_KEYS for mode in modes):
        parser.error(f"--collector takes a comma-separated list of {', '.join(COLLECTOR_KEYS)}")
    names = args.calls.split(",")
    calls = [int(name) for name in names if name.strip().isdigit()]
    if len(calls) != len(names) or any(count not in BLOCKS for count in calls):
        parser.error(f"--calls takes a comma-separated list of {', '.join(map(str, BLOCKS))}")
    torch.set_num_threads(1)
    parts = args.parts.split(",")
    workers = [int(count) for count in args.workers.split(",")]
    result: dict[str, Any] = {}
    for mode in modes:
        suffix = COLLECTOR_KEYS[mode]
        if "watch" in parts:
            tables = {f"workers_{w}": loader_table(args.steps, args.repeats, w, mode) for w in workers}
            result[f"watch_by_batch{suffix}"] = tables
        if "model" in parts:
            result[f"by_module_calls{suffix}"] = model_table(args.steps, args.repeats, mode, calls)
    result["device_double"] = device_run(args.steps, args.repeats) if "device" in parts else {}
    result["machine"] = machine()
    result["config"] = {"steps": args.steps, "repeats": args.repeats, "collector": modes, "calls": calls}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for mode in modes:
        print_tables(result, mode)
    for name, value in result["device_double"].items():
        print(f"  device double, {name}: {value / 1e3:.1f} µs per step")


def print_tables(result: dict[str, Any], mode: str) -> None:
    """The watch() and model tables measured with the collector in ``mode``."""
    suffix = COLLECTOR_KEYS[mode]
    print(f"the garbage collector {mode} during the runs")
    watch_tables = result.get(f"watch_by_batch{suffix}", {})
    if watch_tables:
        print("  watch(loader): µs added per step in the steady state (over the whole run), by batch size")
    for workers, table in watch_tables.items():
        for way, label in (("watch", "watch"), ("plain_again", "floor")):
            row = "  ".join(f"{batch:>5}: {added(figures, way)}" for batch, figures in table.items())
            print(f"    {workers:10s} {label:5s} {row}")
        if mode != "on":
            continue
        outside = "  ".join(
            f"{batch:>5}: {figures['watch_steady_outside_collector_added_ns'] / 1e3:7.1f}"
            for batch, figures in table.items()
        )
        row = "  ".join(
            f"{batch:>5}: {collected(figures, 'plain')} / {collected(figures, 'watch')}"
            for batch, figures in table.items()
        )
        print(f"    {'':16s} the steady state outside the collector's collections (µs added per step)")
        print(f"    {'':16s} {outside}")
        print(f"    {'':16s} the garbage collector, plain / watch: µs per step (collections per step)")
        print(f"    {'':16s} {row}")
    model = result.get(f"by_module_calls{suffix}", {})
    if model:
        print("  auto() and by hand: µs added per step in the steady state (over the whole run), by module calls")
    for calls, figures in model.items():
        auto, hand, floor = (added(figures, way) for way in ("auto", "by_hand", "plain_again"))
        plain = figures["plain_steady_step_ns"] / 1e3
        print(f"    {calls:>4} calls  auto {auto}  by hand {hand}  floor {floor}  (plain {plain:7.1f})")
        error = figures.get("auto_minus_by_hand_steady_added_ns_standard_error", float("nan")) / 1e3
        print(f"    {'':10s} auto - by hand, paired {added(figures, 'auto_minus_by_hand')}  ± {error:.1f} steady")
        if mode == "on":
            print(
                f"    {'':10s} collector, plain / auto / by hand: "
                + " / ".join(collected(figures, way) for way in ("plain", "auto", "by_hand"))
            )


if __name__ == "__main__":
    main()
