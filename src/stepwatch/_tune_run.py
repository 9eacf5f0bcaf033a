"""``stepwatch tune train.py``: the DataLoader settings that make this program's training fastest, measured in its
own training loop, then the program stopped.

The program runs as ``stepwatch run`` runs it. Its first loop over a DataLoader (in the main thread) is fed, step
after step, from new DataLoaders over the same dataset with the settings the search (``_tune.plan``) asks for,
``--steps`` batches each after each one's first batch; the program's own step body runs on every batch, so each
setting's time per step is the wait for its batch plus the program's step. When the search is done, the table and
the recommendation are printed (stderr), saved with ``-o``, and the program is stopped as ``--stop`` stops it
(exit status 0): the training it ran was for measuring only.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ._patches import Patches
from ._runner import check_program, run_program, split
from ._tune import STEPS, Rebuilder, conclude, plan, trial_batches
from ._tuning import Trial, Tuning
from ._window_end import StoppedByStepwatch

NO_LOOP_STEPS = 20
"""Optimizer steps without a DataLoader loop after which the program is said to have none to tune."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stepwatch tune",
        usage="stepwatch tune [options] (script.py | -m module) [args ...]",
        description="Run a training program's own loop under several DataLoader settings, print the fastest, and"
        " stop the program: the training it runs is for measuring only (checkpoints it writes are not a finished"
        " training).",
    )
    parser.add_argument("-m", dest="module", metavar="MODULE", help="run a module as a script, like python -m")
    parser.add_argument("--steps", type=int, default=STEPS, help=f"steps measured per setting (default {STEPS})")
    parser.add_argument("--max-workers", type=int, default=None, help="most workers tried (default: CPU count)")
    parser.add_argument("-o", "--out", help="save the table as JSON (stepwatch report prints it again)")
    return parser


class TuneSession:
    """The tuning of one program: its first DataLoader loop is replaced by :meth:`tuned`."""

    def __init__(self, steps: int, max_workers: int | None, out: str | None) -> None:
        self.steps = steps
        self.max_workers = max_workers
        self.out = out
        self.thread = threading.get_ident()
        self.started = False
        self.optimizer_steps = 0

    def wrap_iter(self, original: Callable[[Any], Iterator[Any]]) -> Callable[[Any], Iterator[Any]]:
        def __iter__(loader: Any) -> Iterator[Any]:
            if self.started or threading.get_ident() != self.thread:
                return original(loader)
            self.started = True
            try:
                rebuilder = Rebuilder(loader)
            except ValueError as error:
                raise SystemExit(f"stepwatch tune: {error}: nothing to tune") from None
            return self.tuned(rebuilder)

        __iter__.__wrapped__ = original  # type: ignore[attr-defined]
        return __iter__

    def optimizer_stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Without any DataLoader loop, the program trains on tensors it slices itself: nothing to tune."""
        if self.started or threading.get_ident() != self.thread:
            return
        self.optimizer_steps += 1
        if self.optimizer_steps >= NO_LOOP_STEPS:
            raise SystemExit(
                f"stepwatch tune: {NO_LOOP_STEPS} optimizer steps and no loop over a DataLoader: the program makes"
                " its batches itself (nanoGPT-style slicing), there is no DataLoader to tune"
            )

    def tuned(self, rebuilder: Rebuilder) -> Iterator[Any]:
        """The program's loop: batches from a DataLoader per setting, each step timed, until the search ends;
        then the table and the stop. A program that leaves its loop first gets the table of what was measured."""
        trials: list[Trial] = []
        search = plan(rebuilder.original, self.max_workers, rebuilder.pin_memory)
        setting = next(search)
        done = 0
        try:
            while True:
                try:
                    for batch in trial_batches(setting, rebuilder.build(setting), self.steps, trials):
                        yield batch  # the program's step on it
                        done += 1
                except ValueError as error:
                    raise SystemExit(f"stepwatch tune: {error}") from None
                try:
                    setting = search.send(trials[-1])
                except StopIteration as finished:
                    self.report(conclude(rebuilder.original, finished.value, trials, rebuilder.kept))
                    sys.stderr.write(
                        f"stepwatch tune: stopped the program at step {done}: the training it ran was for measuring"
                        " only (a checkpoint it wrote is not a finished training)\n"
                    )
                    raise StoppedByStepwatch(done) from None
        except GeneratorExit:  # the program left its loop (a break, its max_steps) before the search ended
            if trials:
                fastest = min(trials, key=lambda trial: trial.per_step).setting
                kept = [*rebuilder.kept, f"the search: the program's loop ended at step {done}, before it did"]
                self.report(conclude(rebuilder.original, fastest, trials, kept))
            else:
                sys.stderr.write(
                    f"stepwatch tune: the program's loop ended at step {done}, before a setting was measured\n"
                )
            raise

    def report(self, tuning: Tuning) -> None:
        text = tuning.render()
        if self.out is not None:
            tuning.save(self.out)
            text += f"stepwatch tune: saved to {os.path.relpath(self.out)}\n"
        sys.stderr.write(text)
        sys.stderr.flush()


def main(arguments: Sequence[str]) -> int:
    """Runs ``stepwatch tune ARGS``; returns the exit code (or exits as the program does)."""
    own, program = split(arguments, {"-o", "--out", "--steps", "--max-workers"}, {"-h", "--help"})
    parser = build_parser()
    try:
        args = parser.parse_args(own)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    refused = check_program("stepwatch tune", parser, args.module, program)
    if refused is not None:
        return refused
    if args.steps < 2 or (args.max_workers is not None and args.max_workers < 0):
        print("stepwatch tune: --steps must be at least 2 and --max-workers at least 0", file=sys.stderr)
        return 2
    import torch
    from torch.optim import optimizer as optim_module

    out = None if args.out is None else os.path.abspath(args.out)
    session = TuneSession(args.steps, args.max_workers, out)
    patches = Patches()
    patches.replace(torch.utils.data.DataLoader, "__iter__", session.wrap_iter)
    patches.hook(optim_module.register_optimizer_step_post_hook(session.optimizer_stepped))
    try:
        code = run_program(args.module, program)
    finally:
        patches.undo()
    if not session.started:
        print("stepwatch tune: the program ended without a loop over a DataLoader: nothing to tune", file=sys.stderr)
        return 1
    return code
