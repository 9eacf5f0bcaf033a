"""stepwatch's footprint: the distinct cache lines it touches in a training step, counted by Valgrind (not a test).

In a real step what a block costs is mostly its cache misses: the model's own work evicts what stepwatch touched
in the step before, so each of its touches comes back from a slower cache (``docs/overhead.md``). How many lines
it touches a step is what makes its cost grow with the model, and what would make it flat: a number that wall
time on a shared machine cannot resolve, and that instruction counts do not show. This counts it. Each stage of
the step (forward, loss, backward, the optimizer step, ``zero_grad``, and the rest of the step) sweeps 4 MiB,
twice the second-level cache simulated (``--LL=2097152,16,64``, this machine's), so whatever stepwatch touches
between two stages misses it again: its cache misses a step over the plain loop's are the lines it touches, cold.
The plain loop, the same stages by hand (``watch`` + 5 ``timed``) and ``auto()`` each run in a process of their
own under ``callgrind`` with the cache simulated, counted over ``--steps`` steps after :data:`WARM_STEPS`, marked
as in ``instructions.py``. Of the added misses and instructions, those in stepwatch's compiled code are given
apart (no heap layout moves them); the rest are the interpreter's (the ``with`` statements, stepwatch's Python)
and torch's or the C library's, which a dump taken mid-run cannot tell apart (its open frames carry their calls'
costs), and which move with where the allocator put things. The model is a Linear by default (4 module calls a
step); ``--module-calls N`` gives it Linear and ReLU layers in turn, to count a larger model where the wall clock
cannot resolve it, and ``--collector paused`` keeps Python's collections out of the count. ``--functions N`` lists,
for each way, the N functions whose misses a step differ most from the plain loop's, code and data apart (where
a step's lines go; ``callgrind_dump.py`` reads the dumps), and each way counts the pools pymalloc made ready a
step (:data:`POOL_MADE`). ``--floor`` counts a fourth way: by hand's loop timed
by ``floor/floor.c``, the least C that times it (its own C given as "in C"), what the ``with`` statement, the call
and the clock cost without stepwatch. Takes about five minutes on two cores; writes
``benchmarks/results/footprint.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gc
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from callgrind_dump import added_by_function, calls_to, self_costs  # this script's folder, first on sys.path

from stepwatch._self_cost import IN_SITU

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
WAYS = ("plain", "by_hand", "auto")
WARM_STEPS = IN_SITU + 8
"""Steps before the count: the loop's first, ``auto()``'s learning steps, and stepwatch's own cost measured in
place (:data:`~stepwatch._self_cost.IN_SITU` steps from the third), whose steps take the general step boundary."""
SWEEP_BYTES = 4 << 20
LAST_LEVEL = "--LL=2097152,16,64"
MISSES = ("ILmr", "DLmr", "DLmw")
POOL_MADE = "allocate_from_new_pool"
"""pymalloc's function that takes a free pool and makes it ready, where no pool of the size asked for has room:
counted a step, since a heap the warm-up leaves otherwise makes the step's own short-lived objects each take a
pool again (about 4 lines each; under Valgrind by hand's process made 16 a step where the plain one made none,
and natively 2: ``docs/overhead.md``)."""
PHASES = ("switched on", "step 0", "steps 1-2", f"steps 3-{IN_SITU + 2}", f"steps {IN_SITU + 3}-{WARM_STEPS - 1}")
"""What ``--phases`` counts apart, a dump each: ``enable()`` or ``auto()`` itself, the loop's first step (its
setup), ``auto()``'s learning steps, the steps on which stepwatch measures its own cost, and the steady steps
before :data:`WARM_STEPS`: what a run pays once, against what each step pays."""


def layers(module_calls: int) -> list[Any]:
    """The model's layers before its sweep, for ``module_calls`` module calls a step (the ``Sequential``, these,
    the sweep and the loss): a Linear, then ReLU and Linear in turn."""
    from torch import nn

    return [nn.Linear(16, 16) if index % 2 == 0 else nn.ReLU() for index in range(module_calls - 3)]


def child(way: str, steps: int, module_calls: int, collector: str, phases: bool = False) -> None:
    """Runs :data:`WARM_STEPS` + ``steps`` steps of one way in this process (under Valgrind), each of its stages
    sweeping the caches, and marks where the counted steps start (``os.getppid()``) and end (``os.getpgrp()``).
    The model's submodule calls run one after the other with nothing swept between them, as a model's layers
    do when they are small: what a call adds there is the code it runs, warm. ``collector`` "paused": Python's
    garbage collector off before the model is built, so that no collection falls in one count and not in another.
    ``phases``: a whole run of the way first, then a count of each of :data:`PHASES` of the next run (a dump at
    the end of each, the count zeroed just before stepwatch is switched on)."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import stepwatch

    torch.set_num_threads(1)
    if collector == "paused":
        gc.disable()
    scratch = bytearray(SWEEP_BYTES)

    def sweep() -> None:
        scratch.find(b"x")  # reads every line of 4 MiB: the caches hold nothing of what came before

    class Sweep(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            sweep()
            return x

    class SweepingLoss(nn.MSELoss):
        def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            sweep()
            return super().forward(input, target)

    class SweepingSGD(torch.optim.SGD):
        def step(self, closure: object = None) -> None:  # type: ignore[override]
            sweep()
            super().step()

        def zero_grad(self, set_to_none: bool = True) -> None:
            sweep()
            super().zero_grad(set_to_none)

    torch.manual_seed(0)
    model = nn.Sequential(*layers(module_calls), Sweep())
    criterion = SweepingLoss()
    optimizer = SweepingSGD(model.parameters(), lr=1e-3)
    total = WARM_STEPS + steps
    loader = DataLoader(TensorDataset(torch.randn(8 * total, 16), torch.randn(8 * total, 16)), batch_size=8)

    marks = (0, 2, IN_SITU + 2, WARM_STEPS - 1) if phases else ()  # each phase's last step

    def mark(index: int) -> None:
        sweep()  # the rest of the step: what the program does between its stages and the next batch
        if phases:
            if index in marks:
                os.getpgrp()  # a dump: the phase's count
        elif index == WARM_STEPS - 1:
            os.getppid()
        elif index == total - 1:
            os.getpgrp()

    def swept_gradient(grad: torch.Tensor) -> torch.Tensor:
        sweep()  # inside backward
        return grad

    def hand_written(timer: Any) -> Any:
        """By hand's loop (``watch`` + 5 ``timed``) timed by ``timer``: stepwatch, or for ``--floor``
        ``benchmarks/floor/floor.c``, the two in one shape so that only the timing differs."""

        def loop(batches: Any, after_step: Any) -> None:
            for index, (x, y) in enumerate(timer.watch(batches)):
                with timer.timed("forward"):
                    out = model(x)
                out.register_hook(swept_gradient)
                with timer.timed("loss"):
                    loss = criterion(out, y)
                with timer.timed("backward"):
                    loss.backward()
                with timer.timed("optimizer"):
                    optimizer.step()
                with timer.timed("zero_grad"):
                    optimizer.zero_grad()
                after_step(index)

        return loop

    def program(batches: Any, after_step: Any) -> None:  # the plain loop, and what auto() patches
        for index, (x, y) in enumerate(batches):
            out = model(x)
            out.register_hook(swept_gradient)
            loss = criterion(out, y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            after_step(index)

    def switch_on() -> None:
        if way == "by_hand":
            stepwatch.enable()
        elif way == "auto":
            stepwatch.auto()

    if way == "floor":
        import floor  # built by build_floor, on the child's path

        loop = hand_written(floor)
    else:
        loop = hand_written(stepwatch) if way == "by_hand" else program
    if phases:  # a whole run first, as each of auto.py's runs follows others: its imports and calibration done
        switch_on()
        loop(loader, lambda index: None)
        if way == "auto":
            stepwatch.auto(False)
        if way != "plain":
            stepwatch.disable()
            stepwatch.reset()
        sweep()
        os.getppid()
    switch_on()
    if phases:
        os.getpgrp()  # the first phase: switching on
    loop(loader, mark)


def compiled(path: str) -> bool:
    """Whether an object file is stepwatch's compiled code, or the floor's (never on the stack at the marks: its
    self costs are exact in a dump taken mid-run)."""
    return "_speedups" in path or Path(path).name.startswith("floor.")


def count(way: str, steps: int, module_calls: int, collector: str, phases: bool = False) -> dict[str, Any]:
    """Runs one way under callgrind with the cache simulated: its instructions and last-level misses a step,
    the misses and instructions a step in stepwatch's compiled code, and each function's misses a step (code
    and data); with ``phases``, the instructions and misses of each of :data:`PHASES` instead."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch, "out")
        command = [
            "valgrind",
            "--tool=callgrind",
            "--cache-sim=yes",
            LAST_LEVEL,
            "--zero-before=getppid",
            "--dump-before=getpgrp",
            f"--callgrind-out-file={out}",
            sys.executable,
            __file__,
            "--child",
            f"{way},{steps},{module_calls},{collector}" + (",phases" if phases else ""),
        ]
        env = {key: value for key, value in os.environ.items() if not key.startswith("STEPWATCH")}
        env.update(PYTHONHASHSEED="0", OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
        if way == "floor":
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(build_floor(scratch)), env.get("PYTHONPATH")]))
        result = subprocess.run(command, capture_output=True, text=True, env=env)
        dumps = [Path(f"{out}.{index}") for index in range(1, (len(PHASES) if phases else 1) + 1)]
        if result.returncode or not all(dump.exists() for dump in dumps):
            raise RuntimeError(f"valgrind failed or left a dump missing at the marks:\n{result.stderr[-2000:]}")
        if phases:
            counts = [self_costs(dump.read_text())[0] for dump in dumps]
            return {"instructions": [c["Ir"] for c in counts], "misses": [sum(c[n] for n in MISSES) for c in counts]}
        text = dumps[0].read_text()
        totals, per_function = self_costs(text)
        pools_made = calls_to(text, POOL_MADE)
    in_compiled = [costs for name, costs in per_function.items() if compiled(name.split(":", 1)[0])]
    missed_in_compiled = sum(costs[name] for costs in in_compiled for name in MISSES)
    executed_in_compiled = sum(costs["Ir"] for costs in in_compiled)
    return {
        "instructions": totals["Ir"] / steps,
        "misses": sum(totals[name] for name in MISSES) / steps,
        **{name: totals[name] / steps for name in MISSES},
        "in_compiled": missed_in_compiled / steps,
        "instructions_in_compiled": executed_in_compiled / steps,
        "pools_made": pools_made / steps,
        "functions": {
            name: (costs["ILmr"] / steps, (costs["DLmr"] + costs["DLmw"]) / steps)
            for name, costs in per_function.items()
        },
    }


def build_floor(directory: str) -> Path:
    """Compiles ``benchmarks/floor/floor.c`` (the floor: the same loop timed by the least C that times it) into
    ``directory`` as setuptools compiles an extension (stepwatch's own module adds ``-fno-plt`` on Linux and
    line-aligned functions, which the floor does without: each of its calls into libpython may fetch one line
    more); the directory to import it from."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    command = [
        *shlex.split(sysconfig.get_config_var("LDSHARED")),
        "-O2",
        "-DNDEBUG",
        "-fPIC",
        "-I",
        sysconfig.get_paths()["include"],
        str(Path(__file__).resolve().parent / "floor" / "floor.c"),
        "-o",
        str(Path(directory, "floor" + suffix)),
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"footprint.py: benchmarks/floor/floor.c did not build:\n{result.stderr[-2000:]}")
    return Path(directory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="steps counted, after the warm ones")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path, help="footprint.json, or footprint_phases.json with --phases")
    parser.add_argument(
        "--module-calls",
        type=int,
        default=4,
        help="module calls a step: 4 (one Linear), or more Linear and ReLU layers (514 is scaling.py's largest)",
    )
    parser.add_argument(
        "--collector",
        choices=("on", "paused"),
        default="on",
        help="Python's garbage collector in the counted processes: on (as a program has it), or paused",
    )
    parser.add_argument(
        "--phases",
        action="store_true",
        help="count what a run pays once instead: switching on, each phase of its first steps (footprint_phases.json)",
    )
    parser.add_argument(
        "--functions",
        type=int,
        default=0,
        metavar="N",
        help="also list, for each way, the N functions whose misses a step differ most from the plain loop's",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="count a fourth way: by hand's loop timed by benchmarks/floor/floor.c, the least C that times it",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.module_calls < 4:
        parser.error("--module-calls: at least 4 (the Sequential, a Linear, the sweep and the loss)")
    if args.floor and args.phases:
        parser.error("--floor: for the steady steps' count (not with --phases)")
    if args.functions < 0 or (args.functions and args.phases):
        parser.error("--functions: a count of 0 or more, for the steady steps' count (not with --phases)")
    if args.child:
        way, steps, module_calls, collector, *phases = args.child.split(",")
        child(way, int(steps), int(module_calls), collector, phases == ["phases"])
        return
    if shutil.which("valgrind") is None:
        sys.exit("footprint.py: needs valgrind on PATH (apt-get install valgrind)")
    ways = (*WAYS, "floor") if args.floor else WAYS
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        counts = pool.map(lambda way: count(way, args.steps, args.module_calls, args.collector, args.phases), ways)
        counted = dict(zip(ways, counts, strict=True))
    args.out = args.out or RESULTS / ("footprint_phases.json" if args.phases else "footprint.json")
    if args.phases:
        report_phases(counted, args)
        return
    plain = counted["plain"]
    table = {}
    print(
        f"{'way':8s} {'lines a step':>12s} {'of them in C':>12s} {'instructions':>13s} {'of them in C':>12s}"
        f" {'pools made':>10s}"
    )
    for way in ways[1:]:
        runs = counted[way]
        table[way] = {
            "added_lines_per_step": runs["misses"] - plain["misses"],
            "lines_in_stepwatch_compiled_code": runs["in_compiled"],
            "instructions_in_stepwatch_compiled_code": runs["instructions_in_compiled"],
            "added_instructions_per_step": runs["instructions"] - plain["instructions"],
            **{f"added_{name}": runs[name] - plain[name] for name in MISSES},
            "added_pools_made_per_step": runs["pools_made"] - plain["pools_made"],
        }
        row = table[way]
        print(
            f"{way:8s} {row['added_lines_per_step']:12.0f} {row['lines_in_stepwatch_compiled_code']:12.0f}"
            f" {row['added_instructions_per_step']:13.0f} {row['instructions_in_stepwatch_compiled_code']:12.0f}"
            f" {row['added_pools_made_per_step']:10.1f}"
        )
    functions = {way: added_by_function(counted[way], plain, args.functions) for way in ways[1:] if args.functions}
    for way, rows in functions.items():
        print(f"\n{way}: the {len(rows)} functions that add or save the most lines a step")
        print(f"{'lines':>8s} {'code':>7s} {'data':>7s}  function")
        for row in rows:
            print(f"{row['lines']:8.1f} {row['code_lines']:7.1f} {row['data_lines']:7.1f}  {row['function'][:100]}")
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "last_level_cache": LAST_LEVEL,
        "sweep_bytes": SWEEP_BYTES,
        "steps_counted": args.steps,
        "module_calls_per_step": args.module_calls,
        "collector": args.collector,
        "warm_steps": WARM_STEPS,
        "plain": {
            "lines_per_step": plain["misses"],
            "instructions_per_step": plain["instructions"],
            "pools_made_per_step": plain["pools_made"],
        },
        "added": table,
        **({"functions": functions} if functions else {}),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


def report_phases(counted: dict[str, dict[str, list[int]]], args: argparse.Namespace) -> None:
    """Prints and writes what each way adds to the plain loop in each of :data:`PHASES`."""
    plain = counted["plain"]
    added = {
        way: {
            phase: {
                "instructions": counted[way]["instructions"][index] - plain["instructions"][index],
                "lines": counted[way]["misses"][index] - plain["misses"][index],
            }
            for index, phase in enumerate(PHASES)
        }
        for way in WAYS[1:]
    }
    print(f"{'phase':14s}" + "".join(f" {way + ' lines':>15s} {way + ' instructions':>22s}" for way in WAYS[1:]))
    for phase in PHASES:
        cells = [f" {added[way][phase]['lines']:15,d} {added[way][phase]['instructions']:22,d}" for way in WAYS[1:]]
        print(f"{phase:14s}{''.join(cells)}")
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "last_level_cache": LAST_LEVEL,
        "module_calls_per_step": args.module_calls,
        "collector": args.collector,
        "phases": list(PHASES),
        "added": added,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
