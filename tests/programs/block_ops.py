"""Runs programs of stepwatch calls and prints what each recorded, one JSON line a program: what
``tests/test_differential.py`` compares between the compiled blocks and their Python twin (``STEPWATCH_PURE_PYTHON``).

A program is a list of operations, each a list whose first item names it (nested operations in the last):
``block`` (a ``with timed(name)``), ``raise`` (the same, its body ending in an exception caught outside it),
``loop`` (``watch()`` over a DataLoader or ``timed_iter()`` over a range, a phase, a step to ``break`` at),
``thread`` (the body in a thread of its own), ``generator`` (a generator suspended inside a block while the body runs,
then closed), ``crossed`` (two blocks closed in the wrong order), ``opened`` (a block entered and never closed),
``count``, ``toggle`` (``disable()`` then ``enable()``), ``reset`` and ``reload`` (``load_state_dict(state_dict())``).
Each program runs on a new ``Stopwatch``, or on the default one through the module's functions (``"default"``),
which is reset first, switched on with its ``schedule`` (``warmup``, ``active``, ``every``) where it has one, a
callback called every ``log_every`` training steps where it has one (how many times it was called is printed).
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

import stepwatch


def run(api: Any, ops: list[Any]) -> None:
    for op in ops:
        OPERATIONS[op[0]](api, op)


def block(api: Any, op: list[Any]) -> None:
    with api.timed(op[1]):
        run(api, op[2])


def raising(api: Any, op: list[Any]) -> None:
    try:
        with api.timed(op[1]):
            run(api, op[2])
            raise KeyError(op[1])
    except KeyError:
        pass


def loop(api: Any, op: list[Any]) -> None:
    _, kind, length, break_at, phase, body = op
    if kind == "watch":
        data = TensorDataset(torch.arange(2 * length, dtype=torch.float32).reshape(-1, 1))
        looped: Any = api.watch(DataLoader(data, batch_size=2), phase=phase)
    else:
        looped = api.timed_iter(range(length), phase=phase)
    for index, _ in enumerate(looped):
        if index == break_at:
            break
        run(api, body)


def in_thread(api: Any, op: list[Any]) -> None:
    failures: list[BaseException] = []

    def body() -> None:
        try:
            run(api, op[1])
        except BaseException as error:  # reported in the caller's thread
            failures.append(error)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    if failures:
        raise failures[0]


def suspended(api: Any, op: list[Any]) -> None:
    def inside() -> Iterator[None]:
        with api.timed(op[1]):
            yield

    generator = inside()
    next(generator)
    run(api, op[2])
    generator.close()


def crossed(api: Any, op: list[Any]) -> None:
    outer, inner = api.timed(op[1]), api.timed(op[2])
    outer.__enter__()
    inner.__enter__()
    outer.__exit__(None, None, None)
    inner.__exit__(None, None, None)


OPERATIONS = {
    "block": block,
    "raise": raising,
    "loop": loop,
    "thread": in_thread,
    "generator": suspended,
    "crossed": crossed,
    "opened": lambda api, op: api.timed(op[1]).__enter__(),
    "count": lambda api, op: api.count(samples=op[1]),
    "toggle": lambda api, op: (api.disable(), api.enable()),
    "reset": lambda api, op: api.reset(),
    "reload": lambda api, op: api.load_state_dict(api.state_dict()),
}


def recorded(program: dict[str, Any]) -> dict[str, Any]:
    """What one program recorded: each phase's stages and their calls (not the computed ``other`` rows), steps,
    counters and ``count()`` calls, and the blocks dropped; or the error it raised."""
    if program["on"] == "default":
        api: Any = stepwatch
        stepwatch.disable()
        stepwatch.reset()
        owner = stepwatch._default_instance.stopwatch
    else:
        api = owner = stepwatch.Stopwatch()
    logged: list[int] = []
    stop_logging = None
    try:
        api.enable(**program.get("schedule", {}))
        if program.get("log_every"):
            stop_logging = api.log_every(program["log_every"], lambda metrics: logged.append(len(metrics)))
        run(api, program["ops"])
        summary = api.summary()
    except Exception as error:  # compared between the two implementations
        return {"error": f"{type(error).__name__}: {error}"}
    finally:
        api.disable()
        if stop_logging is not None:  # (the default stopwatch's callbacks would outlive the program)
            stop_logging()
    return {**records(summary, owner), "logged": len(logged)}


def records(summary: Any, owner: stepwatch.Stopwatch) -> dict[str, Any]:
    """A summary's stages and their calls (not the computed ``other`` rows), steps, counters and ``count()`` calls
    by phase, and the blocks ``owner`` dropped."""
    phases = {}
    for name, phase in ({} if summary is None else summary.phases).items():
        stages = sorted([path, stats.calls] for path, stats in phase.stages.items() if not path.endswith("other"))
        phases[name] = {
            "stages": stages,
            "steps": phase.steps,
            "counters": dict(sorted(phase.counters.items())),
            "count_calls": phase.count_calls,
        }
    return {"phases": phases, "dropped": owner.span.dropped_blocks}


def main(record: Callable[[dict[str, Any]], dict[str, Any]] = recorded) -> None:
    """Which blocks run the programs (compiled or the Python twin), then what each program in the file named first
    recorded (``record``: this module's programs, or ``auto_ops.py``'s), a line each."""
    torch.set_num_threads(1)
    print(f"compiled blocks: {stepwatch._block_base.COMPILED}", flush=True)
    with open(sys.argv[1]) as programs:
        for program in json.load(programs):
            print(json.dumps(record(program), sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
