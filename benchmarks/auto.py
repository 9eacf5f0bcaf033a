"""What auto-instrumentation adds to a training step, against the plain loop and against hand-written blocks
(not a test).

One unmodified loop (a DataLoader, forward, loss, backward, optimizer step and zero_grad on a ~2 ms CPU step)
runs three ways, in alternating order within each repeat: plain (stepwatch off, nothing patched), under
``stepwatch.auto()`` (what ``stepwatch run`` and ``STEPWATCH=auto`` do, in this process so that interpreter
start-up does not drown the per-step figure), and with the same stages written by hand (``watch`` and
``timed``), plus the plain loop once more as the noise floor, in a shuffled order within each repeat. Medians
of the paired differences over repeats resist the machine's drift. Each run is timed over the whole run (its
start in it: the first batch, ``auto()``'s learning steps, stepwatch's own cost measured in place, spread over
``--steps``) and over its steady state, from the end of step ``WARM_STEPS`` (what each further step of a long
training pays); the targets are given for both. ``--collector paused`` collects before each run and disables
the garbage collector during it (where a full collection falls moves a run by more than stepwatch's cost).
Each paired median comes with its standard error (bootstrap over the repeats), and each target says whether its
figure and its limit are more than two standard errors apart (``resolved``). The runs' own times are kept in the
results (``runs``), with a hash of stepwatch's code; ``--append`` adds a new run's repeats to those of ``--out``
where both timed the same code the same way on the same host, so that repeats taken over calm spells of the host
pool (the host's speed moves a run by 60 to 130 us from one half second to the next: the standard error falls only
as one over the square root of the repeats). Writes ``benchmarks/results/auto.json`` and prints the figures.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch
from scaling import WARM_STEPS, machine, resolved, run_with_collector, standard_error  # this script's folder
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


class Run(NamedTuple):
    """One run's nanoseconds per step: over the whole run, and over its steady state (from the end of step
    ``WARM_STEPS`` to the end of the last: what each further step of a long training pays, past the loop's
    first batch, ``auto()``'s learning steps and the steps on which stepwatch measures its own cost)."""

    whole: float
    steady: float


def timed_run(loop: Callable[[list[int]], None], steps: int) -> Run:
    """Runs ``loop(marks)``, which appends the clock at the end of each step (every way alike)."""
    marks: list[int] = []
    start = time.perf_counter_ns()
    loop(marks)
    return Run((marks[-1] - start) / steps, (marks[-1] - marks[WARM_STEPS - 1]) / (steps - WARM_STEPS))


def plain(model: nn.Module, optimizer: Any, criterion: Any, loader: DataLoader[Any], marks: list[int]) -> None:
    """The program as its author wrote it."""
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        marks.append(time.perf_counter_ns())


def by_hand(model: nn.Module, optimizer: Any, criterion: Any, loader: DataLoader[Any], marks: list[int]) -> None:
    """The same stages, written by hand with stepwatch's API (``watch()`` counts the samples, as ``auto()``)."""
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
        marks.append(time.perf_counter_ns())


def by_hand_counting(
    model: nn.Module, optimizer: Any, criterion: Any, loader: DataLoader[Any], marks: list[int]
) -> None:
    """By hand with the program's own ``count(samples=len(y))``, which replaces watch()'s count (``--parts``)."""
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
        marks.append(time.perf_counter_ns())


def watch_alone(model: nn.Module, optimizer: Any, criterion: Any, loader: DataLoader[Any], marks: list[int]) -> None:
    """The watched loop with no block and no count (``--parts``)."""
    for x, y in stepwatch.watch(loader):
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        marks.append(time.perf_counter_ns())


PARTS = {"by hand": by_hand, "by hand with its own count": by_hand_counting, "watch alone": watch_alone}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200, help="training steps per run")
    parser.add_argument(
        "--repeats", type=int, default=90, help="paired repeats (30 left a noise floor of up to 22 us; 90: 1 us)"
    )
    parser.add_argument(
        "--collector",
        choices=("on", "paused"),
        default="on",
        help="the garbage collector during each run: as the loop has it, or paused (collected before the run)",
    )
    parser.add_argument(
        "--parts",
        action="store_true",
        help="two ways more, to split by hand's cost: with the program's own count(), and watch() alone (no blocks)",
    )
    parser.add_argument("--out", default=str(RESULTS / "auto.json"))
    parser.add_argument(
        "--append",
        action="store_true",
        help="add this run's repeats to those already in --out (the same code, steps, collector, ways and host)",
    )
    args = parser.parse_args()
    if args.steps < WARM_STEPS + 10:
        parser.error(f"--steps must be at least {WARM_STEPS + 10}: the steady state starts after {WARM_STEPS} steps")
    config = {
        "steps": args.steps,
        "collector": args.collector,
        "parts": args.parts,
        "code": code_hash(),
        "host": machine()["cpu"],
    }
    earlier, sittings = earlier_runs(Path(args.out), config) if args.append else ({}, 0)
    model, optimizer, criterion, loader = build(args.steps)

    def loop(way: str, marks: list[int]) -> None:
        if way == "plain":
            plain(model, optimizer, criterion, loader, marks)
            return
        if way == "auto":
            stepwatch.auto()
            try:
                plain(model, optimizer, criterion, loader, marks)  # the very same code, patched
            finally:
                stepwatch.auto(False)
                stepwatch.disable()
            return
        stepwatch.enable()
        try:
            PARTS[way](model, optimizer, criterion, loader, marks)
        finally:
            stepwatch.disable()

    def run(way: str) -> Run:
        def timed() -> Run:
            return timed_run(lambda marks: loop(way.removesuffix(" again"), marks), len(loader))

        return run_with_collector(timed, args.collector)

    ways = ["plain", "plain again", "auto", "by hand"]
    if args.parts:
        ways += ["by hand with its own count", "watch alone"]
    for way in ways:  # warm every path once
        run(way)
    times: dict[str, list[Run]] = {way: [] for way in ways}
    # each sitting its own orders (seeded with the sittings before it, the first's as before): with one seed for
    # all, every sitting ran the same 80 orders, and pooling them never evened out what those left unbalanced
    shuffle = random.Random(sittings).shuffle
    for _ in range(args.repeats):
        order = list(ways)
        shuffle(order)  # in a fixed order, whatever runs after a stepwatch run was 0.7% slower or faster
        this = {way: run(way) for way in order}
        for way in ways:
            times[way].append(this[way])
        stepwatch.reset()
    if earlier:
        times = {way: [Run(*run) for run in earlier[way]] + runs for way, runs in times.items()}
    estimates = own_estimates(model, optimizer, criterion, loader)
    result: dict[str, Any] = {}
    for span, suffix in (("whole", ""), ("steady", "_steady")):
        result.update(span_figures(times, span, suffix, estimates))
    result["machine"] = machine()
    result["config"] = {**config, "repeats": len(times["plain"]), "sittings": sittings + 1}
    result["runs"] = {way: [list(run) for run in runs] for way, runs in times.items()}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for span, suffix in (("whole run", ""), (f"steady state (after step {WARM_STEPS})", "_steady")):
        print(f"over the {span}, the garbage collector {args.collector}:")
        for name, value in result[f"figures{suffix}"].items():
            print(f"  {name:48s} {value / 1e3:10.1f} µs")
        for name, value in result[f"standard_errors_ns{suffix}"].items():
            print(f"  {'standard error: ' + name:48s} {value / 1e3:10.1f} µs")
        for name, value in result[f"own_cost_estimate{suffix}"].items():
            print(f"  {name:48s} {value:10.2%}")
        for name, target in result[f"targets{suffix}"].items():
            met = "met" if target["met"] else "NOT met"
            if "resolved" in target:
                met += f" (± {target['standard_error']:.4f}: {'' if target['resolved'] else 'not '}resolved)"
            print(f"  {name:60s} {target['value']:8.4f}  limit {target['limit']:6.3f}  {met}")


def code_hash() -> str:
    """A hash of stepwatch's installed code (its sources and compiled module), so that only runs of the same code
    pool."""
    package = Path(stepwatch.__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*")):
        if path.is_file() and path.suffix in (".py", ".c", ".so"):
            digest.update(path.relative_to(package).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def earlier_runs(out: Path, config: dict[str, Any], script: str = "auto.py") -> tuple[dict[str, Any], int]:
    """The runs already in ``out`` and its sittings, for ``--append`` (this script's and ``interleaved.py``'s); exits
    with a one-line error where there are none, or where they timed other code or another configuration."""
    try:
        saved = json.loads(out.read_text())
        runs: dict[str, Any] = dict(saved["runs"])
        saved_config = saved["config"]
        sittings = int(saved_config.get("sittings", 1))
    except (OSError, ValueError, KeyError, TypeError) as error:
        sys.exit(f"{script}: --append: {out} holds no runs to add to ({type(error).__name__}: {error})")
    differing = [key for key in config if saved_config.get(key) != config[key]]
    if differing:
        sys.exit(f"{script}: --append: {out} timed another {', '.join(differing)}; not pooled")
    return runs, sittings


def span_figures(
    times: dict[str, list[Run]], span: str, suffix: str, estimates: dict[str, float]
) -> dict[str, dict[str, Any]]:
    """The paired medians, shares and targets over one span of the runs (``whole`` or ``steady``)."""
    per_way = {way: [getattr(run, span) for run in runs] for way, runs in times.items()}

    def differences(way: str, base: str = "plain") -> list[float]:
        return [t - p for t, p in zip(per_way[way], per_way[base], strict=True)]

    def added_to_plain(way: str) -> float:
        return statistics.median(differences(way))

    step = statistics.median(per_way["plain"])
    added = added_to_plain("auto")
    figures = {
        "step_ns_plain": step,
        "step_ns_auto": statistics.median(per_way["auto"]),
        "step_ns_by_hand": statistics.median(per_way["by hand"]),
        "auto_added_ns_per_step_median_paired": added,
        "by_hand_added_ns_per_step_median_paired": added_to_plain("by hand"),
        "auto_minus_by_hand_ns_per_step_median_paired": statistics.median(differences("auto", "by hand")),
        "noise_floor_plain_again_minus_plain_ns": added_to_plain("plain again"),
    }
    errors = {
        "auto_added": standard_error(differences("auto")),
        "by_hand_added": standard_error(differences("by hand")),
        "auto_minus_by_hand": standard_error(differences("auto", "by hand")),
        "noise_floor": standard_error(differences("plain again")),
    }
    for part in ("by hand with its own count", "watch alone"):
        if part in per_way:
            key = part.replace(" ", "_") + "_added"
            figures[key + "_ns_per_step_median_paired"] = added_to_plain(part)
            errors[key] = standard_error(differences(part))
    share = added / step
    hand_share = added_to_plain("by hand") / step
    shares = {
        "auto: measured share": share,
        "auto: stepwatch's own estimate": estimates["auto"],
        "by hand: measured share": hand_share,
        "by hand: stepwatch's own estimate": estimates["by hand"],
    }
    targets = {
        "auto adds < 1% of the step": verdict(share, 0.01, errors["auto_added"] / step),
        "by hand adds < 0.5% of the step": verdict(hand_share, 0.005, errors["by_hand_added"] / step),
    }
    if span == "whole":  # the report's estimate is over a whole run
        for way, ratio in (
            ("auto", estimates["auto"] / share if share > 0 else float("inf")),
            ("by hand", estimates["by hand"] / hand_share if hand_share > 0 else float("inf")),
        ):
            name = f"{way}: the own-cost estimate within 2x of the measured"
            targets[name] = {"value": ratio, "limit": 2.0, "met": 0.5 <= ratio <= 2.0}
    return {
        f"figures{suffix}": figures,
        f"standard_errors_ns{suffix}": errors,
        f"own_cost_estimate{suffix}": shares,
        f"targets{suffix}": targets,
    }


def verdict(value: float, limit: float, error: float) -> dict[str, Any]:
    """A target's figure against its limit, with the figure's standard error: ``met`` is the figure under the
    limit, as it always was; ``resolved`` whether the two are more than two standard errors apart
    (``scaling.resolved``)."""
    return {
        "value": value,
        "limit": limit,
        "met": value < limit,
        "standard_error": error,
        "resolved": resolved(value, limit, error),
    }


def own_estimates(model: nn.Module, optimizer: Any, criterion: Any, loader: DataLoader[Any]) -> dict[str, float]:
    """What the report's last line estimates of stepwatch's own cost, after one run each way."""
    from stepwatch._self_cost import own_share

    estimates = {}
    for way in ("auto", "by hand"):
        stepwatch.reset()
        if way == "auto":
            stepwatch.auto()
            plain(model, optimizer, criterion, loader, [])
            stepwatch.auto(False)
        else:
            stepwatch.enable()
            by_hand(model, optimizer, criterion, loader, [])
        estimates[way] = own_share(stepwatch.summary()) or 0.0
        stepwatch.disable()
    stepwatch.reset()
    return estimates


if __name__ == "__main__":
    main()
