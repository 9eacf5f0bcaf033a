"""Lightning: ``Trainer(profiler=StepwatchProfiler())`` gives stepwatch's report, verdict and saved run.

Lightning names every hook it runs (``trainer/call.py``, ``loops/``) and calls its profiler's ``start`` and
``stop`` around each. This profiler turns those actions into stepwatch's stages, on the default stopwatch, so
that ``stepwatch.timed`` blocks in the user's code nest where they run:

- the fetch of each batch (``[_TrainingEpochLoop].train_dataloader_next``, ``[_EvaluationLoop].val_next`` and
  ``.test_next``, ``[_PredictionLoop].predict_next``) is the ``loader`` wait of a loop advanced in two beats;
  the rest of each step is ``step``; validation is the ``val`` phase, taken out of the training step it runs
  in; ``trainer.test`` and ``trainer.predict`` are the ``test`` and ``predict`` phases;
- ``[Strategy]*.batch_to_device`` is ``h2d``, ``training_step``, ``validation_step``, ``test_step`` and
  ``predict_step`` are ``forward``,
  ``backward`` is ``backward`` (under manual optimization, the time between the ``on_before_backward`` and
  ``on_after_backward`` hooks), ``[LightningModule]*.optimizer_zero_grad`` is ``zero_grad``;
- ``[LightningModule]*.optimizer_step`` runs the closure (training_step, zero_grad, backward) inside it: its
  ``optimizer`` row is what remains, the optimizer's own time, and the closure's stages are the step's own;
- every other hook is a row of its own, under ``callbacks/<Callback>``, ``hooks/<hook>`` or
  ``strategy/<hook>``, so that time lost in callbacks, checkpointing and logging shows.

DataLoaders are instrumented when Lightning iterates them, so what their workers do comes back as with
``watch()``. Importing stepwatch never imports Lightning; importing this module does.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from .._all_ranks import AllRanks, end_report
from .._batch_size import batch_size
from .._constants import DEFAULT_PHASE
from .._dataloader.watch import instrument_always, uninstrument
from .._default_instance import stopwatch as _default
from .._external_loops import Beats, set_base_phase
from .._job import in_job
from .._patches import Patches
from .._peaks import check_peak
from .._results import save_run
from .._schedule import Schedule, check_flag
from .._summary import Summary
from .._window_end import check_stop
from ._lightning_actions import GROUPS, PREDICT, STAGES, TEST, TRANSPARENT, parse, record, safe
from ._lightning_base import GUARD_MARK, FailureGuard, Profiler

__all__ = ["StepwatchProfiler"]


class StepwatchProfiler(Profiler):
    """A Lightning profiler that records with stepwatch (see the module's docstring).

    Args:
        out: where the run is saved at the end of ``fit``; default ``stepwatch.json`` in the trainer's log
            directory.
        warmup: steps skipped before measuring, as for ``stepwatch.enable()``.
        active: steps measured (None: all of them), as for ``stepwatch.enable()``.
        every: the window repeats every that many steps, as for ``stepwatch.enable()``.
        flops: count the FLOPs of one training step, for FLOP/s and MFU in the report.
        peak_flops: the device's peak FLOP/s, for MFU where it is not in stepwatch's table.
        val_phase: the name of the validation phase.
        stop: with ``active``: end the fit once the window is measured (``Trainer.should_stop``); the report
            comes at the end of the fit, as always.
    """

    def __init__(
        self,
        out: str | os.PathLike[str] | None = None,
        *,
        warmup: int | None = None,
        active: int | None = None,
        every: int | None = None,
        val_phase: str = "val",
        stop: bool = False,
        flops: bool = False,
        peak_flops: float | None = None,
    ) -> None:
        stop = check_stop(stop, Schedule(warmup or 0, active, every))
        check_flag(flops, "flops")
        self._flops = (flops or None, check_peak(peak_flops))
        super().__init__()
        self._stop = stop
        self._trainer: Any = None  # the trainer running now, found by setup
        self.out = None if out is None else os.fspath(out)
        self.val_phase = val_phase
        self._schedule = (warmup, active, every)
        self._loops: dict[str, Beats] = {}
        self._closers: dict[str, list[Callable[[], None]]] = {}
        self._patches = Patches()
        self._loaders: list[Any] = []
        self._loader_of: dict[str, Any] = {}  # phase -> its DataLoader, for the advice
        self._enabled_here = False
        self._schedule_before = _default.schedule
        self._pending_count: int | None = None
        self._optimizer: list[int] | None = None  # [segment start or -1 while paused, own ns so far, depth]
        self._summary: Summary | None = None
        self._written: str | None = None  # this rank's run file, once saved
        self._gathered: AllRanks | None = None  # on rank 0 of a job of several ranks: every rank's summary
        self._log_dir: str | None = None
        self._backward_depth = 0  # [Strategy].backward actions open
        self._manual_backward: Any = None  # the block timing a manual_backward(), between its hooks
        self._base_before: str | None = None  # the thread's base phase before an evaluation-only run set it
        self._runs = 0  # trainer runs (fit, validate, test, predict) this profiler recorded
        self._out_given = self.out is not None
        self._failure = FailureGuard(self._failed)  # hears of a run failing (Lightning then calls no teardown)

    def __del__(self) -> None:
        if "_failure" in self.__dict__:  # Lightning's __del__ tears down: not a profiler whose __init__ raised
            super().__del__()

    # -- Lightning's profiler interface ----------------------------------------------------------------------

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        super().setup(stage, local_rank, log_dir)
        self._log_dir = log_dir
        if self._summary is not None:  # reused (fit, then test; a second Trainer): a run of its own
            self._new_run()
        self._runs += 1
        self._trainer = self._failure.attach(sys._getframe())
        import torch

        if not self._patches.patched(torch.utils.data.DataLoader, "__iter__"):
            self._patches.replace(torch.utils.data.DataLoader, "__iter__", self._wrap_loader_iter)
        if not _default.is_enabled():
            self._schedule_before = _default.schedule
            warmup, active, every = self._schedule
            _default.reset()  # what it holds is an earlier run's, saved then: this run starts empty
            _default.enable(
                warmup=warmup,
                active=active,
                every=every,
                stop=self._stop,
                flops=self._flops[0],
                peak_flops=self._flops[1],
            )
            self._enabled_here = True
            if self._stop and self._trainer is not None:
                _default.window_end.stop_with = functools.partial(_stop_fit, self._trainer)
        # validate, test or predict alone: its hooks outside the loop are that phase's, and there is no train phase
        if getattr(stage, "value", stage) != "fit" and self._base_before is None:
            self._base_before = set_base_phase(_default, self._evaluation_phase())

    def start(self, action_name: str) -> None:
        if action_name in TRANSPARENT or GUARD_MARK in action_name:
            return
        if action_name.endswith("].train_dataloader_next"):
            self._fetch_started(DEFAULT_PHASE)
            return
        phase = self._fetched_phase(action_name)
        if phase is not None:
            self._fetch_started(phase)
            return
        kind, owner, hook = parse(action_name)
        if (kind == "LightningModule" and hook == "optimizer_step") or action_name == "optimizer_step":
            self._optimizer_started(action_name)
            return
        if hook == "on_after_backward" and self._manual_backward is not None:
            self._manual_backward.__exit__(None, None, None)
            self._manual_backward = None
            self._resume_optimizer()
        stage = STAGES.get(f"[{kind}].{hook}")
        if stage == "backward":
            self._backward_depth += 1
        names = [stage] if stage else [GROUPS[kind], owner if kind == "Callback" else hook] if kind else [hook]
        self._pause_optimizer()
        blocks = [_default.timed(safe(name)) for name in names]
        for block in blocks:
            block.__enter__()

        def close() -> None:
            for block in reversed(blocks):
                block.__exit__(None, None, None)
            self._resume_optimizer()

        self._closers.setdefault(action_name, []).append(close)

    def stop(self, action_name: str) -> None:
        if GUARD_MARK in action_name:
            return
        if action_name in TRANSPARENT:
            if action_name == "run_training_epoch":
                self._close_loop(DEFAULT_PHASE)
            return
        if action_name.endswith("].train_dataloader_next"):
            self._fetch_ended(DEFAULT_PHASE)
            return
        phase = self._fetched_phase(action_name)
        if phase is not None:
            self._fetch_ended(phase)
            return
        closers = self._closers.get(action_name)
        if closers:
            closers.pop()()
        if action_name.startswith("[Strategy]") and action_name.endswith(".backward"):
            self._backward_depth -= 1
        elif action_name.endswith(".on_before_backward") and not self._backward_depth:
            # manual optimization: manual_backward() runs backward without an action of its own, between
            # these two hooks
            self._pause_optimizer()
            self._manual_backward = _default.timed("backward")
            self._manual_backward.__enter__()
        if action_name.startswith("[Strategy]"):  # an evaluation loop's last hook ends its loop
            for hook, phase in (
                ("on_validation_end", self.val_phase),
                ("on_test_end", TEST),
                ("on_predict_end", PREDICT),
            ):
                if action_name.endswith(f".{hook}"):
                    self._close_loop(phase)

    def _fetched_phase(self, action_name: str) -> str | None:
        """The phase whose batch fetch ``action_name`` is, if it is one."""
        if not action_name.endswith("_next"):
            return None
        for suffix, phase in (
            ("].train_dataloader_next", DEFAULT_PHASE),
            ("].val_next", self.val_phase),
            ("].test_next", TEST),
            ("].predict_next", PREDICT),
        ):
            if action_name.endswith(suffix):
                return phase
        return None

    def summary(self) -> Summary:  # type: ignore[override]
        """stepwatch's :class:`~stepwatch.Summary` of what was recorded (Lightning's profilers return text)."""
        return self._summary if self._summary is not None else _default.summary()

    def describe(self) -> None:
        """Lightning calls this at the end of ``fit``: the report and verdict, and the run saved."""
        self._finish()
        self._prepare_streams()
        if self._write_stream is not None:
            text = _default.report() if self._summary is None else _render(self._summary)
            if self.out is not None and self._written is not None:
                text = end_report(text, self._written, self._gathered, self.out)
            self._write_stream(text)
        if self._output_file is not None:
            self._output_file.flush()
        self.teardown(stage=self._stage)

    def teardown(self, stage: str | None) -> None:
        self._finish()
        super().teardown(stage)

    # -- steps ------------------------------------------------------------------------------------------------

    def _fetch_started(self, phase: str) -> None:
        if phase == DEFAULT_PHASE and self.val_phase in self._loops:  # a validation not ended by its last hook
            self._close_loop(self.val_phase)
        for other in (TEST, PREDICT):  # a loop of another stage, not ended by its last hook
            if other != phase and other in self._loops:
                self._close_loop(other)
        loop = self._loops.get(phase)
        if loop is None:
            loop = self._loops[phase] = Beats(_default, phase, self._loader_of.get(phase))
        loop.wait()

    def _fetch_ended(self, phase: str) -> None:
        loop = self._loops.get(phase)
        if loop is None:
            return
        loop.go()
        count, self._pending_count = self._pending_count, None
        if count:
            _default.count(samples=count)

    def _close_loop(self, phase: str) -> None:
        loop = self._loops.pop(phase, None)
        if loop is not None:
            loop.close()

    def _optimizer_started(self, action_name: str) -> None:
        self._optimizer = [time.perf_counter_ns(), 0, 0]

        def close() -> None:
            state, self._optimizer = self._optimizer, None
            if state is None:
                return
            own = state[1] + (time.perf_counter_ns() - state[0] if state[0] >= 0 else 0)
            record(_default, "optimizer", own)

        self._closers.setdefault(action_name, []).append(close)

    def _pause_optimizer(self) -> None:
        state = self._optimizer
        if state is not None:
            if state[2] == 0:
                state[1] += time.perf_counter_ns() - state[0]
                state[0] = -1
            state[2] += 1

    def _resume_optimizer(self) -> None:
        state = self._optimizer
        if state is not None and state[2] > 0:
            state[2] -= 1
            if state[2] == 0:
                state[0] = time.perf_counter_ns()

    # -- DataLoaders --------------------------------------------------------------------------------------------

    def _wrap_loader_iter(self, original: Callable[[Any], Iterator[Any]]) -> Callable[[Any], Iterator[Any]]:
        import torch

        def __iter__(loader: Any) -> Iterator[Any]:
            if _default.is_enabled() and not any(loader is known for known in self._loaders):
                instrument_always(loader, _default)
                loader._get_iterator.on_batch = self._saw_batch
                self._loaders.append(loader)
                # Lightning's evaluation loops run without gradients, its training loop with them
                self._loader_of[DEFAULT_PHASE if torch.is_grad_enabled() else self._evaluation_phase()] = loader
            return original(loader)

        __iter__.__wrapped__ = original  # type: ignore[attr-defined]
        return __iter__

    def _evaluation_phase(self) -> str:
        """The phase of a loop run without gradients, from the stage the trainer runs."""
        stage = getattr(self._stage, "value", self._stage)  # Lightning's TrainerFn, a str enum
        return {"test": TEST, "predict": PREDICT}.get(str(stage or ""), self.val_phase)

    def _saw_batch(self, batch: Any) -> None:
        self._pending_count = batch_size(batch)

    # -- the end ------------------------------------------------------------------------------------------------

    def _new_run(self) -> None:
        """Forgets the previous run (already saved), so that this one is recorded, saved and undone too."""
        self._summary = self._written = self._gathered = None
        self._loops, self._closers, self._loader_of = {}, {}, {}
        self._optimizer, self._pending_count, self._manual_backward = None, None, None
        self._backward_depth = 0
        if not self._out_given:
            self.out = None
        _default.reset()

    def _run_path(self) -> str:
        """Where this run is saved: ``out`` (default ``stepwatch.json`` in the log directory); a later run of
        the same profiler beside it, named by its stage (``pl.test.json``), so it never replaces the first."""
        base = self.out or os.path.join(self._log_dir or os.getcwd(), "stepwatch.json")
        if self._runs <= 1:
            return base
        stem, extension = os.path.splitext(base)
        stage = str(getattr(self._stage, "value", self._stage) or "run")
        return f"{stem}.{stage}{self._runs}{extension or '.json'}"

    def _failed(self) -> None:
        self._finish(crashed=True)

    def _finish(self, crashed: bool = False) -> None:
        """Closes the loops, takes stepwatch off the DataLoaders and torch, and saves the run (once a run; a
        failed run is saved without gathering the ranks: the others may still be training)."""
        if self._summary is not None:
            return
        for phase in list(self._loops):
            self._close_loop(phase)
        if self._base_before is not None:
            set_base_phase(_default, self._base_before)
            self._base_before = None
        self._patches.undo()
        for loader in self._loaders:
            uninstrument(loader)
        self._loaders.clear()
        self._summary = _default.summary()
        out = self._run_path()
        if self._runs <= 1 or self._out_given:
            self.out = self.out or out
        if self._summary.phases or (in_job() and not crashed):  # every rank of a job takes part in the gather
            os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
            self._written, self._gathered = save_run(_default, out, gather=not crashed)
        if self._enabled_here:
            _default.disable()
            _default.schedule = self._schedule_before  # the default stopwatch as it was
            _default.window_end.stop, _default.window_end.stop_with = False, None
            self._enabled_here = False
        if not crashed:  # (a failing run is still walking its callbacks)
            self._failure.detach()


def _stop_fit(trainer: Any) -> None:
    """The measured window closed with ``stop``: the fit ends after this step, as Lightning's own early stopping
    ends it."""
    trainer.should_stop = True


def _render(summary: Summary) -> str:
    from .._render import render_text

    return render_text(summary)
