"""What by hand's stages add to ``auto.py``'s step, measured step by step inside one run (not a test).

``auto.py`` pairs whole runs (plain, by hand, ``auto()``) and takes the median of their differences: unbiased,
but a run's time moves by tens of microseconds from one run to the next (where its tensors land), so its
standard error stays at 4 to 7 us over 250 repeats, as large as what separates by hand's figure from its limit
(0.5% of a 2.4 ms step: 12 us). Here each run interleaves two loops over the same data: the plain step and one
way's step (each on a DataLoader of its own), in a shuffled order within each round, each step timed from just
before its ``next()`` to the end of its last stage. Whatever moves a run moves both, so the paired difference of
their mean steady step (from step ``WARM_STEPS``) has a standard error of 1 to 3 us in 30 repeats. The ways:

- ``plain again``: the plain step once more (the noise floor);
- ``by hand``: ``watch(loader)`` and five ``timed`` blocks, as in ``auto.py``;
- ``watch alone`` (its ``next()`` also timed apart), ``watch without its count`` (``counts_samples`` off) and
  ``timed_iter alone``: the loop's boundary and the data pipeline's timing, split;
- ``five timed blocks`` around the stages of a plain loop, and ``five with lock`` (``threading.Lock``: a ``with``
  statement whose own work is next to nothing): what a ``with`` statement costs in place, whoever provides it;
- ``ten us known``: the plain step and a wait of 10 us on the clock, a cost known in advance, which the figures must
  read back (a check of the design and of its estimate, not of any cache);
- ``floor``: by hand's loop timed by ``benchmarks/floor/floor.c`` (``footprint.py --floor``'s floor, built here):
  ``watch()`` and five ``timed`` blocks in the same shape, whose C reads the clock and keeps a total, no more; what
  any implementation of by hand's calls pays in place (the ``with`` statements, the calls, the clock).

Interleaving has a bias of its own, which this measures rather than hides: between two of a way's steps run
other steps (one on average, plus ``--fillers`` untimed plain steps a round), whose work pushes more of what
stepwatch touches out of the caches than one step of its own loop does, so the figures here are upper bounds of
what a loop of its own pays (which ``auto.py`` measures, unbiased and noisier). A cost that grows with the steps
between is cache misses: the figures at 0 and at 2 fillers show how much.

``--run-length K`` takes each loop's steps K in a row instead (a round: K plain steps and K of the way's, the two
runs in a shuffled order, no fillers; a run may follow one of its own kind from the round before, up to 2K in a
row), and leaves the first ``--skip`` steps of each run out of the figures: a step counted then follows steps of
its own loop, as in a loop of its own, and the steps just after the other loop's run, colder or evicted by it,
count for neither. Each way's added cost is also given by its place in a run (``added_by_place_ns``): how many
steps of its own it takes to settle, which says what ``--skip`` must be (on 2026-12-07's first host, by hand's was
26 and 16 us at a run's first two steps against 12 to 16 at the next eight; with K = 2 and only the first step left
out it read about twice what longer runs did; ``make bench`` takes K = 8 and 4 left out, and K = 16 and 8). The
host's speed wanders from one step to the next less than from one half second to the next (``auto.py``'s pairing of
whole runs), so runs of a few steps cancel more of it. ``ten us known``, read back, checks the design's scale.
Writes ``benchmarks/results/interleaved.json`` and prints the figures (microseconds added per step).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import itertools
import json
import math
import random
import statistics
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

from auto import build, code_hash, earlier_runs, verdict  # this script's folder, first on sys.path
from footprint import build_floor
from scaling import WARM_STEPS, machine, standard_error
from torch.utils.data import DataLoader

import stepwatch

RESULTS = Path(__file__).resolve().parent / "results"
WAYS = (
    "plain again",
    "by hand",
    "watch alone",
    "watch without its count",
    "timed_iter alone",
    "five timed blocks",
    "five with lock",
    "ten us known",
    "floor",
)
clock = time.perf_counter_ns
KNOWN_NS = 10_000
floor: Any = None  # benchmarks/floor/floor.c, built and imported where the ways include the floor


class Steps:
    """The steps of one run, each a function of its iterator: (the step's ns, its ``next()``'s ns). The block
    steps are written out rather than made from one step given the context manager: a call to make each block's
    manager would be part of what they measure, the ``with`` statement's own cost."""

    def __init__(self, model: Any, optimizer: Any, criterion: Any) -> None:
        self.model, self.optimizer, self.criterion = model, optimizer, criterion
        self.lock = threading.Lock()

    def plain(self, batches: Iterator[Any]) -> tuple[int, int]:
        start = clock()
        x, y = next(batches)
        fetched = clock()
        loss = self.criterion(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        return clock() - start, fetched - start

    def timed(self, batches: Iterator[Any]) -> tuple[int, int]:
        start = clock()
        x, y = next(batches)
        fetched = clock()
        with stepwatch.timed("forward"):  # as a program writes it, and as auto.py's by hand does
            out = self.model(x)
        with stepwatch.timed("loss"):
            loss = self.criterion(out, y)
        with stepwatch.timed("backward"):
            loss.backward()
        with stepwatch.timed("optimizer"):
            self.optimizer.step()
        with stepwatch.timed("zero_grad"):
            self.optimizer.zero_grad()
        return clock() - start, fetched - start

    def known(self, batches: Iterator[Any]) -> tuple[int, int]:
        """The plain step, then a wait of ``KNOWN_NS`` on the clock, counted with it."""
        step, fetch = self.plain(batches)
        waited_from = clock()
        until = waited_from + KNOWN_NS
        while clock() < until:
            pass
        return step + clock() - waited_from, fetch

    def locked(self, batches: Iterator[Any]) -> tuple[int, int]:
        lock = self.lock
        start = clock()
        x, y = next(batches)
        fetched = clock()
        with lock:
            out = self.model(x)
        with lock:
            loss = self.criterion(out, y)
        with lock:
            loss.backward()
        with lock:
            self.optimizer.step()
        with lock:
            self.optimizer.zero_grad()
        return clock() - start, fetched - start


def way_loop(way: str, loader: DataLoader[Any], steps: Steps) -> tuple[Iterator[Any], Callable[..., tuple[int, int]]]:
    """The way's iterator over its own loader, and its step."""
    if way in ("by hand", "watch alone", "watch without its count"):
        watched = stepwatch.watch(loader)
        if way == "watch without its count":
            watched.counts_samples = False
        return iter(watched), steps.timed if way == "by hand" else steps.plain
    if way == "timed_iter alone":
        return iter(stepwatch.timed_iter(loader)), steps.plain
    if way == "five timed blocks":
        return iter(loader), steps.timed
    if way == "ten us known":
        return iter(loader), steps.known
    if way == "floor":
        return floor.watch(loader), floor_step(steps)
    return iter(loader), steps.locked if way == "five with lock" else steps.plain


def floor_step(steps: Steps) -> Callable[..., tuple[int, int]]:
    """By hand's step with ``floor`` where it names ``stepwatch``: the same code object (the same bytecode, so only
    the timing differs), run with globals in which ``stepwatch.timed`` is ``floor.timed``."""
    step = types.FunctionType(Steps.timed.__code__, {**globals(), "stepwatch": floor}, "floor")
    return cast(Callable[..., tuple[int, int]], step.__get__(steps))


def rounds(fillers: int, run_length: int, order: random.Random) -> Iterator[list[str]]:
    """Each round's steps in order: the plain step, the way's and ``fillers`` untimed plain steps, shuffled; or
    with a ``run_length`` above 1, that many plain steps in a row and as many of the way's, the two runs in a
    shuffled order."""
    while True:
        if run_length > 1:
            first, second = order.sample(("plain", "way"), 2)
            yield [first] * run_length + [second] * run_length
        else:
            round_ = ["plain", "way"] + ["filler"] * fillers
            order.shuffle(round_)
            yield round_


def one_run(
    way: str,
    loaders: dict[str, DataLoader[Any]],
    steps: Steps,
    fillers: int,
    order: random.Random,
    run_length: int = 1,
    skip: int = 0,
) -> dict[str, dict[str, Any]]:
    """One run of ``way`` interleaved with the plain loop (and ``fillers`` untimed plain steps a round, or the two
    taken ``run_length`` steps in a row, the first ``skip`` of each run of steps left out): each one's mean steady
    step and ``next()``, in ns, and its mean steady step at each place in a run of steps (``by_place``)."""
    gc.collect()
    gc.disable()
    stepwatch.enable()
    try:
        plain = iter(loaders["plain"])
        filler = iter(loaders["filler"])
        batches, step = way_loop(way, loaders["way"], steps)
        times: dict[str, list[tuple[int, int]]] = {"plain": [], "way": []}
        places: dict[str, list[int]] = {"plain": [], "way": []}  # each step's place in its run of steps (from 0)
        last = ""
        for round_ in rounds(fillers, run_length, order):
            if len(times["plain"]) == len(loaders["plain"]):
                break
            for kind in round_:
                if kind in times:
                    if len(times[kind]) == len(loaders[kind]):
                        continue  # (the last round's runs cut at the end of the data)
                    places[kind].append(places[kind][-1] + 1 if last == kind and run_length > 1 else 0)
                    last = kind
                if kind == "plain":
                    times["plain"].append(steps.plain(plain))
                elif kind == "way":
                    times["way"].append(step(batches))
                else:
                    try:
                        steps.plain(filler)
                    except StopIteration:  # (a round has several)
                        filler = iter(loaders["filler"])
                        steps.plain(filler)
        for rest in (plain, batches):
            for _ in rest:  # the end of the data: the watched loop closes its last step
                raise AssertionError("the loaders are of one length")
        if way == "floor" and floor.calls("forward") == 0:
            raise AssertionError("the floor's blocks were not timed")
    finally:
        stepwatch.disable()
        gc.enable()
    stepwatch.reset()
    figures: dict[str, dict[str, Any]] = {}
    for kind, runs in times.items():
        steady = list(zip(runs[WARM_STEPS:], places[kind][WARM_STEPS:], strict=True))
        kept = [run for run, place in steady if place >= skip]
        figures[kind] = {
            "step": statistics.fmean(whole for whole, _ in kept),
            "next": statistics.fmean(fetch for _, fetch in kept),
            "by_place": [
                statistics.fmean([whole for (whole, _), at in steady if at == place] or [float("nan")])
                for place in range(2 * run_length)  # (a run of steps may follow one of its own: 2K in a row)
            ],
        }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200, help="steps of each loop a run")
    parser.add_argument("--repeats", type=int, default=30, help="runs of each way at each number of fillers")
    parser.add_argument("--fillers", default="0,2", help="untimed plain steps a round, comma-separated")
    parser.add_argument("--ways", default=",".join(WAYS), help="the ways to measure, comma-separated")
    parser.add_argument(
        "--run-length",
        type=int,
        default=1,
        help="steps of each loop in a row (1: step by step, shuffled with fillers)",
    )
    parser.add_argument(
        "--skip", type=int, default=2, help="with --run-length: the steps of each run not counted, from its start"
    )
    parser.add_argument("--out", default=str(RESULTS / "interleaved.json"))
    parser.add_argument(
        "--append",
        action="store_true",
        help="add this sitting's runs to those already in --out (the same code, configuration and host)",
    )
    args = parser.parse_args()
    if args.steps < WARM_STEPS + 10:
        parser.error(f"--steps must be at least {WARM_STEPS + 10}: the steady state starts after {WARM_STEPS} steps")
    if args.repeats < 2:
        parser.error("--repeats must be at least 2: each figure has a standard error over the repeats")
    try:
        fillers = [int(count) for count in args.fillers.split(",")]
    except ValueError:
        parser.error(f"--fillers: comma-separated counts, not {args.fillers!r}")
    if any(count < 0 for count in fillers):
        parser.error("--fillers: counts of at least 0")
    if args.run_length < 1:
        parser.error("--run-length must be at least 1")
    if args.run_length > 1 and fillers != [0]:
        parser.error("--run-length above 1 takes no fillers: give --fillers 0")
    skip = args.skip if args.run_length > 1 else 0
    if not 0 <= skip < args.run_length:
        parser.error("--skip must be at least 0 and less than --run-length")
    ways = args.ways.split(",")
    if unknown := set(ways) - set(WAYS):
        parser.error(f"--ways: unknown {sorted(unknown)}; the ways are {', '.join(WAYS)}")
    config = {
        "steps": args.steps,
        "fillers": fillers,
        "ways": ways,
        "run_length": args.run_length,
        "skip": skip,
        "warm_steps": WARM_STEPS,
        "code": code_hash(),
        "host": machine()["cpu"],
    }
    earlier, sittings = earlier_runs(Path(args.out), config, "interleaved.py") if args.append else ({}, 0)
    if "floor" in ways:
        load_floor()
    model, optimizer, criterion, loader = build(args.steps)
    steps = Steps(model, optimizer, criterion)
    order = random.Random(sittings)  # (other orders for each sitting)
    result: dict[str, Any] = {"figures": {}, "runs": {}}
    for count in fillers:
        result["figures"][str(count)], result["runs"][str(count)] = {}, {}
        for way in ways:
            loaders = {kind: DataLoader(loader.dataset, batch_size=64) for kind in ("plain", "way", "filler")}
            one_run(way, loaders, steps, count, order, args.run_length, skip)  # warm the path
            runs = earlier.get(str(count), {}).get(way, [])
            runs += [one_run(way, loaders, steps, count, order, args.run_length, skip) for _ in range(args.repeats)]
            result["runs"][str(count)][way] = runs
            result["figures"][str(count)][way] = figures = way_figures(way, runs, args.run_length)
            print_figures(count, way, figures)
    result["machine"] = machine()
    repeats = len(result["runs"][str(fillers[0])][ways[0]])
    result["config"] = {**config, "repeats": repeats, "sittings": sittings + 1}
    write(Path(args.out), result)


def load_floor() -> None:
    """Builds ``benchmarks/floor/floor.c`` into a folder of its own and imports it as ``floor``."""
    global floor
    sys.path.insert(0, str(build_floor(tempfile.mkdtemp(prefix="interleaved-floor-"))))
    floor = importlib.import_module("floor")


def write(out: Path, result: dict[str, Any]) -> None:
    """The results with their figures one to a line and the runs (whole nanoseconds) on one line each way: a
    thousand repeats take about 1 MB one number to a line."""
    runs = result["runs"]
    whole = {
        fillers: {way: [rounded(run) for run in way_runs] for way, way_runs in by_way.items()}
        for fillers, by_way in runs.items()
    }
    text = json.dumps({key: value for key, value in result.items() if key != "runs"}, indent=1)
    lines = [
        f" {json.dumps(fillers)}: {{"
        + ",".join(f"\n  {json.dumps(way)}: {json.dumps(way_runs)}" for way, way_runs in by_way.items())
        + "\n }"
        for fillers, by_way in whole.items()
    ]
    out.write_text(text.removesuffix("\n}") + ',\n "runs": {\n' + ",\n".join(lines) + "\n }\n}\n")


def rounded(value: Any) -> Any:
    """``value`` with each finite float rounded to a whole number (nanoseconds), in nested dicts and lists."""
    if isinstance(value, dict):
        return {key: rounded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [rounded(item) for item in value]
    return round(value) if isinstance(value, float) and math.isfinite(value) else value


def way_figures(way: str, runs: list[dict[str, dict[str, Any]]], run_length: int) -> dict[str, Any]:
    """A way's figures over its runs: the medians of the paired differences against the plain loop of each run,
    their standard errors, the share of the plain step, and by hand's verdict against target 4 (0.5%)."""
    step = [run["way"]["step"] - run["plain"]["step"] for run in runs]
    fetch = [run["way"]["next"] - run["plain"]["next"] for run in runs]
    plain_step = statistics.median(run["plain"]["step"] for run in runs)
    figures: dict[str, Any] = {
        "added_ns": statistics.median(step),
        "added_standard_error_ns": standard_error(step),
        "share": statistics.median(step) / plain_step,
        "next_added_ns": statistics.median(fetch),
        "next_added_standard_error_ns": standard_error(fetch),
        "plain_step_ns": plain_step,
    }
    if run_length > 1:  # how many steps of a run it takes for the way's added cost to settle
        by_place = [
            [
                difference
                for run in runs
                if not math.isnan(difference := run["way"]["by_place"][place] - run["plain"]["by_place"][place])
            ]
            for place in range(2 * run_length)
        ]
        by_place = list(itertools.takewhile(lambda place: len(place) >= 2, by_place))  # (places some runs reach)
        figures["added_by_place_ns"] = [statistics.median(place) for place in by_place]
        figures["added_by_place_standard_error_ns"] = [standard_error(place) for place in by_place]
    if way == "by hand":  # target 4 of issue 21, for the steady step
        error = figures["added_standard_error_ns"] / plain_step
        figures["target_under_half_a_percent"] = verdict(figures["share"], 0.005, error)
    return figures


def print_figures(fillers: int, way: str, figures: dict[str, Any]) -> None:
    print(
        f"fillers {fillers}  {way:24s} +{figures['added_ns'] / 1e3:6.2f} ± "
        f"{figures['added_standard_error_ns'] / 1e3:4.2f} us a step ({figures['share']:.2%}), "
        f"next() +{figures['next_added_ns'] / 1e3:6.2f} ± "
        f"{figures['next_added_standard_error_ns'] / 1e3:4.2f} us",
        flush=True,
    )
    if "added_by_place_ns" in figures:
        places = zip(figures["added_by_place_ns"], figures["added_by_place_standard_error_ns"], strict=True)
        print("  by place in a run: " + ", ".join(f"{v / 1e3:.1f} ± {e / 1e3:.1f}" for v, e in places))
    if target := figures.get("target_under_half_a_percent"):
        print(
            f"  by hand adds < 0.5% of the step: {target['value']:.4f} ± {target['standard_error']:.4f}, "
            f"{'met' if target['met'] else 'NOT met'}, {'' if target['resolved'] else 'not '}resolved"
        )


if __name__ == "__main__":
    main()
