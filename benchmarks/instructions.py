"""What stepwatch adds to a training step in instructions, counted by Valgrind, against the model's size (not
a test).

On a shared 2-core machine a 9 ms step drifts by 1-2% from run to run, so wall-clock time cannot tell whether
stepwatch adds 10 us or 100 us to it. Instructions executed can: Valgrind's ``callgrind`` counts every
instruction of the process. Each way of running ``scaling.py``'s training loop (plain, ``auto()``, by hand)
runs in a process of its own; the count starts after :data:`WARM_STEPS` steps (the loop's first step and
``auto()``'s learning steps are behind it) and stops after ``--steps`` more: the program marks both points by
calling ``os.getppid()`` and ``os.getpgrp()``, which nothing else calls there, and callgrind zeroes its counters
on the first and dumps them on the second. What a way adds is its instructions per step minus the plain loop's.

Instructions are not time (cache misses are not counted, nor the clock's reads' latency), but a cost that does
not grow in instructions with the model grows in time only through the machine. Needs ``valgrind`` on PATH;
takes about fifteen minutes on two cores. Writes ``benchmarks/results/instructions.json``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from stepwatch._self_cost import IN_SITU

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
BLOCKS = {6: 2, 34: 16, 130: 64, 514: 256}  # module calls per step -> Linear+ReLU blocks, as in scaling.py
WAYS = ("plain", "auto", "by_hand")
WARM_STEPS = IN_SITU + 8
"""Steps before the count: the loop's first, ``auto()``'s learning steps, and stepwatch's own cost measured in
place (:data:`~stepwatch._self_cost.IN_SITU` steps from the third), whose steps take the general step boundary
(before 2026-12-03, night, 4: the 20 steps counted were all inside that measurement)."""


def child(blocks: int, way: str, steps: int) -> None:
    """Runs :data:`WARM_STEPS` + ``steps`` steps of one way in this process (under Valgrind), marking where
    the counted steps start and end."""
    sys.path.insert(0, str(HERE))
    import torch
    from scaling import build, by_hand

    import stepwatch

    torch.set_num_threads(1)
    training = build(blocks, WARM_STEPS + steps)
    model, criterion, optimizer, loader = training

    def mark(index: int) -> None:
        if index == WARM_STEPS - 1:
            os.getppid()  # callgrind zeroes its counters here
        elif index == WARM_STEPS + steps - 1:
            os.getpgrp()  # ... and dumps them here

    if way == "by_hand":
        stepwatch.enable()
        by_hand(stepwatch, training, mark)
        return
    if way == "auto":
        stepwatch.auto()
    for index, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        mark(index)


def valgrind_counts(script: str, arguments: list[str], cache_sim: bool = False) -> dict[str, int]:
    """Runs ``python script *arguments`` under callgrind: the events counted between the program's
    ``os.getppid()`` and ``os.getpgrp()`` (``Ir``, instructions; with ``cache_sim``, also the simulated
    caches' misses: ``I1mr``, ``D1mr``, ``D1mw``, ``ILmr``, ``DLmr``, ``DLmw``)."""
    with tempfile.TemporaryDirectory() as scratch:
        command = [
            "valgrind",
            "--tool=callgrind",
            f"--cache-sim={'yes' if cache_sim else 'no'}",
            "--zero-before=getppid",
            "--dump-before=getpgrp",
            f"--callgrind-out-file={scratch}/out",
            sys.executable,
            script,
            *arguments,
        ]
        env = {key: value for key, value in os.environ.items() if not key.startswith("STEPWATCH")}
        env.update(PYTHONHASHSEED="0", OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
        result = subprocess.run(command, capture_output=True, text=True, env=env)
        if result.returncode:
            raise RuntimeError(f"valgrind failed:\n{result.stderr[-2000:]}")
        dump = Path(scratch, "out.1")
        if not dump.exists():
            raise RuntimeError(f"no dump at the end mark (os.getpgrp):\n{result.stderr[-2000:]}")
        text = dump.read_text()
    events = re.search(r"^events:\s*(.+)$", text, re.M)
    summary = re.search(r"^summary:\s*(.+)$", text, re.M)
    if events is None or summary is None:
        raise RuntimeError("callgrind's dump has no events or summary line")
    names, values = events.group(1).split(), [int(value) for value in summary.group(1).split()]
    return dict(zip(names, values + [0] * (len(names) - len(values)), strict=True))  # trailing zeros left out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="steps counted, after the warm ones")
    parser.add_argument("--calls", default=",".join(map(str, BLOCKS)), help="module calls per step to measure")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path, default=RESULTS / "instructions.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        blocks, way, steps = args.child.split(",")
        child(int(blocks), way, int(steps))
        return
    if shutil.which("valgrind") is None:
        sys.exit("instructions.py: needs valgrind on PATH (apt-get install valgrind)")
    calls = [int(c) for c in args.calls.split(",")]
    runs = [(c, way) for c in calls for way in WAYS]

    def per_step(run: tuple[int, str]) -> float:
        arguments = ["--child", f"{BLOCKS[run[0]]},{run[1]},{args.steps}"]
        return valgrind_counts(__file__, arguments)["Ir"] / args.steps

    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        counts = dict(zip(runs, pool.map(per_step, runs), strict=True))
    table: dict[str, dict[str, float]] = {}
    for c in calls:
        plain = counts[(c, "plain")]
        table[str(c)] = {
            "plain_instructions_per_step": plain,
            **{f"{way}_added_instructions": counts[(c, way)] - plain for way in WAYS if way != "plain"},
        }
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "steps_counted": args.steps,
        "warm_steps": WARM_STEPS,
        "by_module_calls": table,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("instructions added per step, by module calls per step (thousands)")
    for c, row in table.items():
        print(
            f"  {c:>4} calls  auto {row['auto_added_instructions'] / 1e3:8.1f}k"
            f"  by hand {row['by_hand_added_instructions'] / 1e3:8.1f}k"
            f"  (plain {row['plain_instructions_per_step'] / 1e3:10.1f}k)"
        )


if __name__ == "__main__":
    main()
