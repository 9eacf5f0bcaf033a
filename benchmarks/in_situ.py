"""Where a timed block's microseconds go inside a real training step, against a tight loop (not a test).

A ``with stepwatch.timed(...)`` block costs about 0.4 us in a tight loop and was found to cost several times
that between the kernels of a real step; the README put it down to cache effects without measuring it. Here
the same five blocks (around the forward, loss, backward, optimizer step and zero_grad of ``scaling.py``'s
6-call training step) are measured three ways:

- time: per-step medians of paired runs (plain loop, the loop with an empty slotted ``with`` around each stage,
  the loop with five ``stepwatch.timed`` blocks), and the same blocks in a tight loop, per block;
- in place (``bracketed``): clock reads just outside and just inside each stage's ``with`` in one loop, the ways
  (no ``with``, an empty slotted ``with``, ``with lock:``, a stepwatch block) taking turns step by step, which
  paired runs, whose steps move by more than five blocks cost between runs, cannot resolve;
- instructions, and first-level and last-level cache misses, counted by Valgrind's ``cachegrind`` (its own
  simulated caches, not the machine's) as the difference of a short and a long run, per block.

If a block executes as many instructions in the step as in the tight loop but takes longer there, the
difference is the machine's (caches, branch predictors), not more work. Needs ``valgrind`` on PATH for the
counts (``--no-valgrind`` skips them). Writes ``benchmarks/results/in_situ.json``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
STAGES = 5
STEP_WAYS = ("plain", "empty_with", "blocks")
TIGHT_WAYS = ("tight_empty_with", "tight_blocks")
WARM_STEPS = 4


class Empty:
    """The cheapest context manager Python has short of ``nullcontext``'s construction: slotted, no work."""

    __slots__ = ()

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: object) -> None:
        pass


def steps(way: str, count: int) -> Iterator[None]:
    """``count`` training steps of ``way``, yielding after each (the caller's clock sits between steps)."""
    sys.path.insert(0, str(HERE))
    from scaling import build

    import stepwatch

    model, criterion, optimizer, loader = build(2, count)
    if way == "blocks":
        stepwatch.enable()
    empty = Empty()
    forward, loss_, backward, step, zero = (
        [stepwatch.timed(name) for name in ("forward", "loss", "backward", "optimizer", "zero_grad")]
        if way == "blocks"
        else [empty] * STAGES
    )
    if way == "plain":
        for x, y in loader:
            out = model(x)
            loss = criterion(out, y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            yield
        return
    try:
        for x, y in loader:
            with forward:
                out = model(x)
            with loss_:
                loss = criterion(out, y)
            with backward:
                loss.backward()
            with step:
                optimizer.step()
            with zero:
                optimizer.zero_grad()
            yield
    finally:
        stepwatch.disable()
        stepwatch.reset()


def tight(way: str, count: int, marks: bool = False) -> None:
    """``count`` x 5 blocks in a bare loop (after as many, unmarked, with ``marks``)."""
    import stepwatch

    block: Any = Empty()
    if way == "tight_blocks":
        stepwatch.enable()
        block = stepwatch.timed("x")
    for index in range(2 * count * STAGES if marks else count * STAGES):
        if marks and index == count * STAGES:
            os.getppid()
        with block:
            pass
    if marks:
        os.getpgrp()


def child(way: str, count: int) -> None:
    """``count`` steps (or their blocks in a tight loop) between the marks that callgrind counts between."""
    import torch

    torch.set_num_threads(1)
    if way in TIGHT_WAYS:
        tight(way, count, marks=True)
        return
    for index, _ in enumerate(steps(way, WARM_STEPS + count)):
        if index == WARM_STEPS - 1:
            os.getppid()
        elif index == WARM_STEPS + count - 1:
            os.getpgrp()


def step_times(count: int, repeats: int) -> dict[str, float]:
    """Per-step medians (ns) of each way, in alternating order, and each way's paired added time."""

    def run(way: str) -> float:
        clock = time.perf_counter_ns
        stamps = [clock() for _ in steps(way, count)]
        return statistics.median(b - a for a, b in itertools.pairwise(stamps))

    for way in STEP_WAYS:
        run(way)
    added: dict[str, list[float]] = {way: [] for way in STEP_WAYS[1:]}
    plain: list[float] = []
    for repeat in range(repeats):
        order = STEP_WAYS if repeat % 2 else tuple(reversed(STEP_WAYS))
        this = {way: run(way) for way in order}
        plain.append(this["plain"])
        for way in added:
            added[way].append(this[way] - this["plain"])
    figures = {"plain_step_ns": statistics.median(plain)}
    figures.update({f"{way}_per_block_ns": statistics.median(values) / STAGES for way, values in added.items()})
    return figures


BRACKET_WAYS = ("none", "empty_with", "lock_with", "blocks")
STAGE_NAMES = ("forward", "loss", "backward", "optimizer", "zero_grad")


def bracketed(count: int) -> dict[str, float]:
    """Per block, in place: each stage of a watched loop's steps between two clock reads just outside its
    ``with`` and two just inside, the ways taken in turn step by step in one loop (so that the machine's drift
    and the process's memory layout are the same for all), and a way's entry and exit the medians over its
    steps less those of the same clock reads with no ``with`` between them (``none``). What a ``with`` does to
    the work inside it afterwards is not in these (the paired runs of :func:`step_times` would have it)."""
    sys.path.insert(0, str(HERE))
    from scaling import build

    import stepwatch

    model, criterion, optimizer, loader = build(2, count)
    clock = time.perf_counter_ns
    stepwatch.enable()
    managers: dict[str, list[Any]] = {
        "empty_with": [Empty()] * STAGES,
        "lock_with": [threading.Lock() for _ in range(STAGES)],
        "blocks": [stepwatch.timed(name) for name in STAGE_NAMES],
    }
    entries: dict[str, list[list[int]]] = {way: [[] for _ in range(STAGES)] for way in BRACKET_WAYS}
    exits: dict[str, list[list[int]]] = {way: [[] for _ in range(STAGES)] for way in BRACKET_WAYS}

    def staged(way: str, stage: int, work: Callable[[], Any]) -> Any:
        if way == "none":
            before = clock()
            inside = clock()
            result = work()
            done = clock()
            after = clock()
        else:
            before = clock()
            with managers[way][stage]:
                inside = clock()
                result = work()
                done = clock()
            after = clock()
        entries[way][stage].append(inside - before)
        exits[way][stage].append(after - done)
        return result

    try:
        for index, (x, y) in enumerate(stepwatch.watch(loader)):
            way = BRACKET_WAYS[index % len(BRACKET_WAYS)]
            out = staged(way, 0, lambda: model(x))  # noqa: B023 (called at once)
            loss = staged(way, 1, lambda: criterion(out, y))  # noqa: B023
            staged(way, 2, lambda: loss.backward())  # noqa: B023
            staged(way, 3, lambda: optimizer.step())
            staged(way, 4, lambda: optimizer.zero_grad())
    finally:
        stepwatch.disable()
        stepwatch.reset()

    def cost(way: str, stage: int) -> float:
        return sum(
            statistics.median(times[way][stage][WARM_STEPS:]) - statistics.median(times["none"][stage][WARM_STEPS:])
            for times in (entries, exits)
        )

    return {way: sum(cost(way, stage) for stage in range(STAGES)) / STAGES for way in BRACKET_WAYS[1:]}


def bracketed_times(count: int, repeats: int) -> dict[str, Any]:
    """:func:`bracketed`'s figures, the median and the range over ``repeats`` loops."""
    runs = [bracketed(count) for _ in range(repeats)]
    figures: dict[str, Any] = {}
    for way in BRACKET_WAYS[1:]:
        values = sorted(run[way] for run in runs)
        figures[f"bracketed_{way}_per_block_ns"] = statistics.median(values)
        figures[f"bracketed_{way}_per_block_range_ns"] = [values[0], values[-1]]
    return figures


def tight_times(count: int, repeats: int) -> dict[str, float]:
    figures = {}
    for way in TIGHT_WAYS:
        runs = []
        for _ in range(repeats):
            start = time.perf_counter_ns()
            tight(way, count)
            runs.append((time.perf_counter_ns() - start) / (count * STAGES))
        figures[f"{way}_per_block_ns"] = statistics.median(runs)
    return figures


def counted(count: int) -> dict[str, dict[str, float]]:
    """Per block: instructions and simulated cache misses, in the step (against the plain step) and in a
    tight loop."""
    from instructions import valgrind_counts

    ways = (*STEP_WAYS, *TIGHT_WAYS)
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        runs = dict(
            zip(
                ways,
                pool.map(lambda way: valgrind_counts(__file__, ["--child", f"{way},{count}"], True), ways),
                strict=True,
            )
        )
    blocks = count * STAGES
    figures = {
        f"step_{way}": {key: (value - runs["plain"][key]) / blocks for key, value in runs[way].items()}
        for way in STEP_WAYS[1:]
    }
    figures.update({way: {key: value / blocks for key, value in runs[way].items()} for way in TIGHT_WAYS})
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--bracket-repeats", type=int, default=5, help="loops of the bracketed measurement")
    parser.add_argument("--no-valgrind", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS / "in_situ.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        way, count = args.child.split(",")
        child(way, int(count))
        return
    import torch

    torch.set_num_threads(1)
    result: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "time": {
            **step_times(args.steps, args.repeats),
            **bracketed_times(4 * args.steps, args.bracket_repeats),
            **tight_times(20_000, args.repeats),
        },
    }
    if not args.no_valgrind:
        result["valgrind"] = counted(200)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    show: Callable[[str], str] = lambda key: f"{result['time'][key]:.0f} ns"  # noqa: E731
    print(f"per block, in the step ({result['time']['plain_step_ns'] / 1e3:.0f} us) and in a tight loop:")
    print(f"  empty with:      step {show('empty_with_per_block_ns')}, tight {show('tight_empty_with_per_block_ns')}")
    print(f"  stepwatch block: step {show('blocks_per_block_ns')}, tight {show('tight_blocks_per_block_ns')}")
    print(f"per block, in place (clock reads around and inside each stage's with; {args.bracket_repeats} loops):")
    for way in BRACKET_WAYS[1:]:
        low, high = result["time"][f"bracketed_{way}_per_block_range_ns"]
        print(f"  {way:15s}  {result['time'][f'bracketed_{way}_per_block_ns']:.0f} ns ({low:.0f} to {high:.0f})")
    for name, counts in result.get("valgrind", {}).items():
        print(f"  {name:16s} " + ", ".join(f"{key} {value:.0f}" for key, value in counts.items()))


if __name__ == "__main__":
    main()
