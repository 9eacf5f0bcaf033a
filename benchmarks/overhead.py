"""Overhead of stepwatch against the floor and its peers, in one interleaved run (not a test).

Run with ``make bench`` (installs the ``bench`` extra: Lightning and torchtnt). Every timer runs the same
number of iterations in each repeat, in a shuffled order, and the medians over repeats are reported, so that
drifts of the machine touch every timer alike. Figures are nanoseconds per iteration with the cost of the
bare ``for`` loop subtracted. Writes ``benchmarks/results/overhead.json`` and prints the table.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import stepwatch

RESULTS = Path(__file__).resolve().parent / "results"

Loop = Callable[[int], None]


class Floor:
    """The least a timing block can do: an empty ``with`` reading the clock on the way in and out."""

    __slots__ = ("end", "start")

    def __init__(self) -> None:
        self.start = 0
        self.end = 0

    def __enter__(self) -> None:
        self.start = time.perf_counter_ns()

    def __exit__(self, *exc: object) -> None:
        self.end = time.perf_counter_ns()


def block_loop(make_context: Callable[[], Any]) -> Loop:
    def run(n: int) -> None:
        for _ in range(n):
            with make_context():
                pass

    return run


def named_block_loop(open_block: Callable[[str], Any]) -> Loop:
    """``with open_block("stage"):`` as a user writes it (``sw.timed``, Lightning's ``profile``, torchtnt's
    ``time``), with no wrapper of the benchmark's own around the call."""

    def run(n: int) -> None:
        for _ in range(n):
            with open_block("stage"):
                pass

    return run


def reused_loop(context: Any) -> Loop:
    def run(n: int) -> None:
        for _ in range(n):
            with context:
                pass

    return run


def bare_loop(n: int) -> None:
    for _ in range(n):
        pass


def timed_iter_loop(sw: stepwatch.Stopwatch) -> Loop:
    def run(n: int) -> None:
        for _ in sw.timed_iter(range(n)):
            pass

    return run


def count_loop(sw: stepwatch.Stopwatch) -> Loop:
    def run(n: int) -> None:
        count = sw.count
        for _ in range(n):
            count(samples=32)

    return run


def build_timers() -> tuple[dict[str, Loop], list[str]]:
    on = stepwatch.Stopwatch(window=1024)
    on.enable()
    off = stepwatch.Stopwatch()
    switched_off = stepwatch.Stopwatch()  # on, then off: blocks keep what the switch guarantees
    switched_off.enable()
    switched_off.disable()
    traced = stepwatch.Stopwatch(window=1024, trace_steps=200)
    traced.enable()
    outside = stepwatch.Stopwatch(active=1)
    outside.enable()
    for _ in outside.timed_iter(range(2)):  # one step measured, then the window is closed
        pass
    timers: dict[str, Loop] = {
        "bare loop": bare_loop,
        "floor (__slots__ with, 2 clock reads)": reused_loop(Floor()),
        "contextlib.nullcontext()": block_loop(contextlib.nullcontext),
        "stepwatch timed, disabled": named_block_loop(off.timed),
        "stepwatch timed, after disable()": named_block_loop(switched_off.timed),
        "stepwatch timed, enabled": named_block_loop(on.timed),
        "stepwatch timed, enabled, trace_steps": named_block_loop(traced.timed),
        "stepwatch timed, outside the window": named_block_loop(outside.timed),
        "stepwatch timed_iter, per item": timed_iter_loop(on),
        "stepwatch count(samples=32)": count_loop(on),
    }
    missing = []
    try:
        from lightning.pytorch.profilers import SimpleProfiler

        simple = SimpleProfiler()
        timers["Lightning SimpleProfiler"] = named_block_loop(simple.profile)
    except ImportError:
        missing.append("lightning")
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torchtnt.utils.timer import Timer

        tnt = Timer()
        timers["torchtnt Timer"] = named_block_loop(tnt.time)
    except ImportError:
        missing.append("torchtnt")
    return timers, missing


def interleaved_medians(timers: dict[str, Loop], n: int, repeats: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in timers}
    order = list(timers)
    rng = random.Random(0)
    for loop in timers.values():  # warm everything up once
        loop(min(n, 10_000))
    for _ in range(repeats):
        rng.shuffle(order)
        for name in order:
            gc.collect()
            start = time.perf_counter_ns()
            timers[name](n)
            samples[name].append((time.perf_counter_ns() - start) / n)
    return {name: statistics.median(values) for name, values in samples.items()}


def heap_growth(loop: Loop, n: int) -> int:
    """Bytes the heap grows by over ``n`` iterations after a warm-up (tracemalloc)."""
    loop(5000)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    loop(n)
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    return sum(stat.size_diff for stat in after.compare_to(before, "filename"))


def six_stage_training() -> Callable[[stepwatch.Stopwatch, int], float]:
    """A small real CPU training loop with six stages (an MLP, about 2.5 ms a step on 2 cores): returns
    ``run(sw, steps)``, which trains ``steps`` steps recorded by ``sw`` and returns the ns per step. Also the
    step of ``live.py``."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    torch.set_num_threads(1)
    batches = [(torch.randn(64, 384), torch.randn(64, 1)) for _ in range(64)]
    model = nn.Sequential(nn.Linear(384, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    criterion = nn.MSELoss()

    def run(sw: stepwatch.Stopwatch, steps: int) -> float:
        start = time.perf_counter_ns()
        for i in sw.timed_iter(range(steps)):
            with sw.timed("unpack"):
                x, y = batches[i % len(batches)]
            with sw.timed("h2d"):
                x, y = x.to("cpu"), y.to("cpu")
            with sw.timed("forward"):
                out = model(x)
            with sw.timed("loss"):
                loss = criterion(out, y)
            with sw.timed("backward"):
                loss.backward()
            with sw.timed("optimizer"):
                optimizer.step()
                optimizer.zero_grad()
            sw.count(samples=len(y))
        return (time.perf_counter_ns() - start) / steps

    return run


def training_step_cost(steps: int, repeats: int) -> dict[str, float]:
    """The six-stage training loop, timed with stepwatch off and on (interleaved), with the standard error of the
    median paired difference (bootstrap, as ``auto.py``'s): with 15 repeats of 200 steps the figure moved by about
    a percent of the step between runs of the same code (0.78% and 1.80%), as much as its target."""
    from scaling import standard_error  # this script's folder, first on sys.path

    train = six_stage_training()

    def run(sw: stepwatch.Stopwatch) -> float:
        return train(sw, steps)

    off, on = stepwatch.Stopwatch(), stepwatch.Stopwatch()
    on.enable()
    run(off)
    run(on)
    off_times, on_times, differences = [], [], []
    for repeat in range(repeats):  # paired runs in alternating order; the median difference resists drift
        first, second = (off, on) if repeat % 2 else (on, off)
        times = {id(first): run(first), id(second): run(second)}
        off_times.append(times[id(off)])
        on_times.append(times[id(on)])
        differences.append(times[id(on)] - times[id(off)])
    from stepwatch._self_cost import own_share

    return {
        "step_ns_off": statistics.median(off_times),
        "step_ns_on": statistics.median(on_times),
        "step_ns_added_median_paired": statistics.median(differences),
        "step_ns_added_standard_error": standard_error(differences),
        "repeats": repeats,
        "own_cost_estimate_share": own_share(on.summary()) or 0.0,  # the report's last line, to check against
    }


def main() -> None:
    from scaling import machine, resolved  # this script's folder, first on sys.path

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=200_000, help="iterations per timer per repeat")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--heap-n", type=int, default=1_000_000, help="blocks for the heap-growth figure")
    parser.add_argument("--steps", type=int, default=200, help="training steps per repeat")
    parser.add_argument(
        "--step-repeats", type=int, default=100, help="paired runs of the real step (off and on), ~1.5 s each"
    )
    parser.add_argument("--out", default=str(RESULTS / "overhead.json"))
    args = parser.parse_args()

    timers, missing = build_timers()
    raw = interleaved_medians(timers, args.n, args.repeats)
    baseline = raw["bare loop"]
    ns = {name: value - baseline for name, value in raw.items() if name != "bare loop"}

    heap_names = [
        "stepwatch timed, enabled",
        "stepwatch timed_iter, per item",
        "Lightning SimpleProfiler",
        "torchtnt Timer",
    ]
    heap = {name: heap_growth(timers[name], args.heap_n) for name in heap_names if name in timers}

    training = training_step_cost(args.steps, args.step_repeats)
    floor = ns["floor (__slots__ with, 2 clock reads)"]
    enabled = ns["stepwatch timed, enabled"]
    per_step_added = ns["stepwatch timed_iter, per item"] + 6 * enabled + ns["stepwatch count(samples=32)"]
    measured_step = training["step_ns_off"]

    targets: dict[str, dict[str, Any]] = {
        "enabled <= 3x floor": {"value": enabled / floor, "limit": 3.0},
        "enabled with trace_steps <= 4x floor": {
            "value": ns["stepwatch timed, enabled, trace_steps"] / floor,
            "limit": 4.0,
        },
        "disabled <= nullcontext": {
            "value": ns["stepwatch timed, disabled"] / ns["contextlib.nullcontext()"],
            "limit": 1.0,
        },
        "after disable() <= nullcontext": {
            "value": ns["stepwatch timed, after disable()"] / ns["contextlib.nullcontext()"],
            "limit": 1.0,
        },
        "outside the window <= nullcontext": {
            "value": ns["stepwatch timed, outside the window"] / ns["contextlib.nullcontext()"],
            "limit": 1.0,
        },
        "timed_iter item <= 2x enabled block": {
            "value": ns["stepwatch timed_iter, per item"] / enabled,
            "limit": 2.0,
        },
        "added cost < 1% of a 2 ms step (micro)": {
            "value": per_step_added / 2_000_000 * 100,
            "limit": 1.0,
            "unit": "%",
        },
        "added cost < 1% of the real step (on - off)": {
            "value": training["step_ns_added_median_paired"] / training["step_ns_off"] * 100,
            "limit": 1.0,
            "unit": "%",
            "standard_error": training["step_ns_added_standard_error"] / training["step_ns_off"] * 100,
        },
        "heap growth <= 1 MiB per 1e6 blocks": {
            "value": heap["stepwatch timed, enabled"] / 2**20,
            "limit": 1.0,
            "unit": "MiB",
        },
    }
    for peer in ("Lightning SimpleProfiler", "torchtnt Timer"):
        if peer in ns:
            targets[f"enabled <= 1/3 of {peer}"] = {"value": enabled / ns[peer], "limit": 1 / 3}
    for target in targets.values():
        target["met"] = target["value"] <= target["limit"]
        if "standard_error" in target:
            target["resolved"] = resolved(target["value"], target["limit"], target["standard_error"])

    result = {
        "machine": machine(),
        "cpu_count": os.cpu_count(),
        "settings": vars(args),
        "ns_per_iteration_minus_bare_loop": ns,
        "bare_loop_ns": baseline,
        "heap_growth_bytes": heap,
        "training_loop": {
            **training,
            "six_stage_step_added_ns_predicted": per_step_added,
            "added_fraction_of_this_step": per_step_added / measured_step,
            "added_fraction_measured_on_minus_off": training["step_ns_added_median_paired"] / measured_step,
        },
        "targets": targets,
        "missing_peers": missing,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(render(result))
    if missing:
        print(f"(not measured: {', '.join(missing)}; install with: pip install -e '.[bench]')", file=sys.stderr)


def render(result: dict[str, Any]) -> str:
    ns = result["ns_per_iteration_minus_bare_loop"]
    floor = ns["floor (__slots__ with, 2 clock reads)"]
    heap = result["heap_growth_bytes"]
    lines = [f"{'timer':40} {'ns/iter':>9} {'x floor':>8} {'heap/1e6':>10}"]
    for name, value in ns.items():
        growth = f"{heap[name] / 2**20:.2f} MiB" if name in heap else ""
        lines.append(f"{name:40} {value:9.0f} {value / floor:8.2f} {growth:>10}")
    training = result["training_loop"]
    lines.append("")
    lines.append(
        f"real 6-stage CPU step: {training['step_ns_off'] / 1e3:.0f} us off, {training['step_ns_on'] / 1e3:.0f} us on;"
        f" stepwatch adds {training['step_ns_added_median_paired'] / 1e3:.1f}"
        f" ± {training['step_ns_added_standard_error'] / 1e3:.1f} us measured (median of {training['repeats']} paired"
        " runs),"
        f" {training['six_stage_step_added_ns_predicted'] / 1e3:.1f} us predicted from the figures above"
    )
    lines.append("")
    lines.append(f"{'target':44} {'measured':>9} {'limit':>7}  met")
    for name, target in result["targets"].items():
        unit = target.get("unit", "")
        error = (
            f"  (± {target['standard_error']:.2f}: {'' if target['resolved'] else 'not '}resolved)"
            if "standard_error" in target
            else ""
        )
        lines.append(
            f"{name:44} {target['value']:8.2f}{unit:1} {target['limit']:7.2f}  {'yes' if target['met'] else 'NO'}"
            + error
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
