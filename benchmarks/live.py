"""What the live view costs a training step (not a test).

The six-stage CPU training step of ``overhead.py`` (an MLP, about 2.5 ms), recorded by two stopwatches in
alternating order within each repeat: one with the live view drawing its panel on a terminal (a pseudo-terminal
that a ``cat`` process reads and throws away), one without. The live view redraws once a second, so a run lasts several
seconds; the figure is the median over repeats of the paired difference per step. Writes
``benchmarks/results/live.json``. Target: under 0.2% of the step.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import torch
from overhead import six_stage_training

import stepwatch
from stepwatch._live import LiveView

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=2000, help="steps per run (about 5 s: five redraws)")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--out", default=str(RESULTS / "live.json"))
    args = parser.parse_args()

    train = six_stage_training()

    master, slave = os.openpty()
    terminal = os.fdopen(slave, "w", buffering=1)
    # the terminal's side, in a process of its own as a terminal is (a thread here would take the GIL)
    reader = subprocess.Popen(["cat"], stdin=master, stdout=subprocess.DEVNULL)

    def run(sw: stepwatch.Stopwatch) -> float:
        return train(sw, args.steps)

    plain, live = stepwatch.Stopwatch(), stepwatch.Stopwatch()
    plain.enable()
    live.enable()
    view = live.live = LiveView(live, stream=terminal)
    assert view.tty
    redraws, drawing_ns = 0, 0
    original_draw = view.draw

    def counted(*draw_args: Any) -> None:
        nonlocal redraws, drawing_ns
        redraws += 1
        started = time.perf_counter_ns()
        original_draw(*draw_args)
        drawing_ns += time.perf_counter_ns() - started

    view.draw = counted  # type: ignore[method-assign]
    run(plain)
    run(live)
    off, on, added = [], [], []
    try:
        for repeat in range(args.repeats):
            first, second = (plain, live) if repeat % 2 else (live, plain)
            times = {id(first): run(first), id(second): run(second)}
            off.append(times[id(plain)])
            on.append(times[id(live)])
            added.append(times[id(live)] - times[id(plain)])
    finally:
        view.close()
        terminal.close()
        reader.terminate()
        reader.wait()
        os.close(master)
    step = statistics.median(off)
    share = statistics.median(added) / step
    live_runs_ns = sum(on) * args.steps  # the runs with the live view, warm-up run aside
    drawing_share = drawing_ns / (live_runs_ns + statistics.median(on) * args.steps)
    result = {
        "step_ns_without_live": step,
        "step_ns_with_live": statistics.median(on),
        "added_ns_per_step_median_paired": statistics.median(added),
        "added_share": share,
        "redraws": redraws,
        "redraws_per_run": redraws / (args.repeats + 1),
        "drawing_ns_per_redraw": drawing_ns / max(redraws, 1),
        "drawing_share_of_the_time": drawing_share,
        "targets": {
            "live view < 0.2% of the step (paired difference, noisy)": {
                "value": share,
                "limit": 0.002,
                "met": share < 0.002,
            },
            "live view < 0.2% of the time (its redraws, timed)": {
                "value": drawing_share,
                "limit": 0.002,
                "met": drawing_share < 0.002,
            },
        },
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count()},
        "config": {"steps": args.steps, "repeats": args.repeats},
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"step {step / 1e3:.0f} us without the live view; it adds {statistics.median(added) / 1e3:.2f} us")
    print(f"({share:.3%} of the step by paired difference; {redraws} redraws in all)")
    print(
        f"redraws timed: {drawing_ns / max(redraws, 1) / 1e3:.0f} us each, {drawing_share:.3%} of the time"
        f" (target < 0.2%: {'met' if drawing_share < 0.002 else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
