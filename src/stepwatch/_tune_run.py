"""``stepwatch tune train.py``: the DataLoader settings that make this program's training fastest, measured in its
own training loop, then the program stopped.

The program runs as ``stepwatch run`` runs it. Its first loop over a DataLoader (in the main thread) is fed, step
after step, from new DataLoaders over the same dataset with the settings the search (``_tune_plan.plan``) asks for,
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
from ._tune import STEPS, Rebuilder, trial_batches
from ._tune_plan import conclude, plan
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
    parser.add_argument(
        "--max-workers",
        type=int,
        default=None,
        help=(
            "most workers tried (default: the CPU count, and up to twice the cores plus two while the workers"
            " wait on reads rather than compute)"
        ),
    )
    parser.add_argument("-o", "--out", help="save the table as JSON (stepwatch report prints it again)")
    return parser


class TuneSession:
    """The tuning of one program. Every loop over a DataLoader in the main thread gets a :class:`Loop`; the first
    one in which the program steps an optimizer is its training loop: from its next batch on, it (and each of its
    later epochs) is fed by :meth:`tuned`, the search's trials, until the search ends. Loops over other loaders
    (a validation run, Lightning's sanity check) pass through, and a step during which one ran is not timed."""

    def __init__(self, steps: int, max_workers: int | None, out: str | None) -> None:
        self.steps = steps
        self.max_workers = max_workers
        self.out = out
        self.thread = threading.get_ident()
        self.loader: Any = None
        """The training loop's DataLoader, once found."""
        self.feed: Iterator[Any] | None = None
        self.last: Loop | None = None
        """The loop that gave the latest batch."""
        self.batch_since_step = False
        self.steps_without_loop = 0
        self.trained = 0
        """Optimizer steps on batches of a DataLoader loop before the tuning started."""
        self.elsewhere = 0
        """Batches given by other loops, to tell a step that ran another loop (not timed)."""
        self.trials: list[Trial] = []
        self.rebuilder: Rebuilder | None = None
        self.done = 0
        self.finished = False

    @property
    def started(self) -> bool:
        return self.feed is not None

    def wrap_iter(self, original: Callable[[Any], Iterator[Any]]) -> Callable[[Any], Iterator[Any]]:
        def __iter__(loader: Any) -> Iterator[Any]:
            if self.finished or threading.get_ident() != self.thread or hasattr(loader, "stepwatch_tune_trial"):
                return original(loader)
            if loader is self.loader:
                return Loop(self, None)  # a later epoch of the training loop: the search goes on
            last = self.last
            if not self.started and last is not None and last.training and last.loader is loader:
                self.start(loader)  # a trainer that takes next(iter(loader)) each step: its next iterator
                self.done = self.trained  # the training's steps so far
                return Loop(self, None)
            return Loop(self, original(loader), loader)

        __iter__.__wrapped__ = original  # type: ignore[attr-defined]
        return __iter__

    def optimizer_stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """The loop that gave the batch this step trained on is the training loop; without any, the program
        trains on tensors it slices itself: nothing to tune."""
        if self.started or threading.get_ident() != self.thread:
            return
        if self.last is not None and self.batch_since_step:
            self.last.training = True
            self.batch_since_step = False
            self.trained += 1
            return
        self.steps_without_loop += 1
        if self.steps_without_loop >= NO_LOOP_STEPS:
            raise SystemExit(
                f"stepwatch tune: {NO_LOOP_STEPS} optimizer steps and no loop over a DataLoader: the program makes"
                " its batches itself (nanoGPT-style slicing), there is no DataLoader to tune"
            )

    def start(self, loader: Any) -> Iterator[Any]:
        """The search begins on the training loop's DataLoader."""
        try:
            self.rebuilder = Rebuilder(loader)
        except ValueError as error:
            raise SystemExit(f"stepwatch tune: {error}: nothing to tune") from None
        self.loader = loader
        self.feed = self.tuned(self.rebuilder)
        return self.feed

    def interrupted(self, seen: list[int]) -> bool:
        """Whether another loop gave batches since the last call (``seen`` keeps the count between calls)."""
        before, seen[0] = seen[0], self.elsewhere
        return self.elsewhere != before

    def tuned(self, rebuilder: Rebuilder) -> Iterator[Any]:
        """The training loop's batches: from a DataLoader per setting, each step timed, until the search ends;
        then the table and the stop."""
        search = plan(rebuilder.original, self.max_workers, rebuilder.pin_memory, map_style=not rebuilder.iterable)
        setting = next(search)
        seen = [self.elsewhere]
        while True:
            loader = rebuilder.build(setting, self.steps)
            try:
                for batch in trial_batches(setting, loader, self.steps, self.trials, lambda: self.interrupted(seen)):
                    yield batch  # the program's step on it
                    self.done += 1
            except ValueError as error:
                raise SystemExit(f"stepwatch tune: {error}") from None
            try:
                setting = search.send(self.trials[-1])
            except StopIteration as finished:
                self.finished = True
                self.report(
                    conclude(rebuilder.original, finished.value, self.trials, rebuilder.kept, rebuilder.describe)
                )
                sys.stderr.write(
                    f"stepwatch tune: stopped the program at step {self.done}: the training it ran was for measuring"
                    " only (a checkpoint it wrote is not a finished training)\n"
                )
                raise StoppedByStepwatch(self.done) from None

    def ended_early(self) -> None:
        """The program ended its training before the search did: the table of what was measured."""
        if self.finished or self.rebuilder is None:
            return
        self.finished = True
        if not self.trials:
            sys.stderr.write(f"stepwatch tune: the training ended at step {self.done}, before a setting was measured\n")
            return
        fastest = min(self.trials, key=lambda trial: trial.per_step).setting
        kept = [*self.rebuilder.kept, f"the search: the training ended at step {self.done}, before it did"]
        self.report(conclude(self.rebuilder.original, fastest, self.trials, kept, self.rebuilder.describe))

    def report(self, tuning: Tuning) -> None:
        text = tuning.render()
        if self.out is not None:
            tuning.save(self.out)
            text += f"stepwatch tune: saved to {os.path.relpath(self.out)}\n"
        sys.stderr.write(text)
        sys.stderr.flush()


class Loop:
    """One loop of the program over a DataLoader: its own batches until it is found to be the training loop,
    then the tuning's (``own`` None: a later epoch of the training loop, fed by the tuning from the start)."""

    def __init__(self, session: TuneSession, own: Iterator[Any] | None, loader: Any = None) -> None:
        self.session, self.own, self.loader = session, own, loader
        self.training = False
        self.taken = 0

    def __iter__(self) -> Loop:
        return self

    def __next__(self) -> Any:
        session = self.session
        if self.own is None or (self.training and not session.finished):
            if self.own is not None:
                self.own = None  # its workers end: the tuning's loaders take over
                session.start(self.loader)
                session.done = self.taken  # the training's steps so far
            assert session.feed is not None
            return next(session.feed)
        batch = next(self.own)
        self.taken += 1
        if session.started:
            session.elsewhere += 1
        else:
            session.last, session.batch_since_step = self, True
        return batch


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
        session.ended_early()
    if not session.started:
        print("stepwatch tune: the program ended without a loop over a DataLoader: nothing to tune", file=sys.stderr)
        return 1
    return code
