"""Hugging Face ``transformers.Trainer``: ``attach(trainer)`` before ``trainer.train()``.

The Trainer's loop (``_inner_training_loop``, read from transformers 5.x) fetches a whole gradient-accumulation
window of batches with ``get_batch_samples``, then runs ``training_step`` per micro-batch, then steps the
optimizer between the ``on_pre_optimizer_step`` and ``on_optimizer_step`` callbacks, then logs, evaluates and
saves. ``attach`` wraps those methods of this trainer instance (never the class) and adds a callback:

- ``get_batch_samples`` is the ``loader`` wait of a loop advanced in two beats; one step is one optimizer step;
- the DataLoaders ``get_train_dataloader`` and ``get_eval_dataloader`` return are instrumented through
  Accelerate's wrapper (its ``base_dataloader``), so what their workers do comes back (``loader/dataset``,
  ``loader/collate``, per-worker figures) and the advice reads their real configuration;
- ``_prepare_inputs`` is ``h2d``, ``compute_loss`` is ``forward`` (with the loss), ``accelerator.backward`` is
  ``backward``, per micro-batch; the optimizer step is ``optimizer``;
- ``log``, ``evaluate`` and ``_save_checkpoint`` are the ``log``, ``eval`` and ``save`` rows, where HF users
  often lose most of their time; inside ``evaluate``, each ``prediction_step`` is a step of the ``val`` phase
  (its ``loader`` is the time between them: the fetch and the gathering of outputs);
- stepwatch's figures (``stepwatch/loader_ms``, ``stepwatch/input_share``, ``stepwatch/samples_per_s``, ...)
  are added to the logs ``Trainer.log`` receives, before it appends them to ``state.log_history`` and calls
  the callbacks, so they reach ``log_history`` and every ``report_to`` integration.

At the end of ``train`` the run is saved (``out``, default ``stepwatch.json`` in ``args.output_dir``) and the
report printed on stderr. Importing stepwatch never imports transformers; this module imports it when
``attach`` runs.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

from .._all_ranks import end_report
from .._batch_size import batch_size
from .._constants import DEFAULT_PHASE
from .._dataloader.find import inner_loader, loader_config
from .._dataloader.watch import instrument_always, uninstrument
from .._default_instance import stopwatch as _default
from .._external_loops import Beats
from .._job import is_rank_zero
from .._mfu import flops_of
from .._results import save_run
from .._summary import Summary

_ATTACHED = "_stepwatch_attachment"
"""Where a trainer keeps its attachment (in its own ``__dict__``), so that attaching twice is attaching once."""
_WRAPPED = ("get_batch_samples", "training_step", "_prepare_inputs", "compute_loss", "log", "evaluate")


__all__ = ["Attachment", "attach", "metrics"]


class Attachment:
    """What :func:`attach` put on one trainer, and the recording it drives."""

    def __init__(self, trainer: Any, out: str | None, val_phase: str) -> None:
        self.trainer = trainer
        self.out = out
        self.val_phase = val_phase
        self.train: Beats | None = None
        self.val: Beats | None = None
        self.optimizer_block: Any = None
        self.enabled_here = False
        self.summary: Summary | None = None
        self.originals: dict[str, Any] = {}
        self.backward_before: Any = None  # the accelerator's own backward attribute, if it had one
        self.callback: Any = None
        self.loaders: list[Any] = []  # the torch DataLoaders instrumented, to undo
        self.loader_of: dict[str, Any] = {}  # phase -> its DataLoader

    # -- the wrappers -------------------------------------------------------------------------------------

    def wrap(self, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        original = getattr(self.trainer, name)
        self.originals[name] = self.trainer.__dict__.get(name)
        setattr(self.trainer, name, functools.wraps(original)(make(original)))

    def get_batch_samples(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def get_batch_samples(*args: Any, **kwargs: Any) -> Any:
            if self.train is None:
                self.start()
                self.train = Beats(_default, DEFAULT_PHASE, self.loader_of.get(DEFAULT_PHASE))
            self.train.wait()
            try:
                result = original(*args, **kwargs)
            finally:
                self.train.go()
            samples = sum(batch_size(batch) or 0 for batch in result[0])
            if samples:
                _default.count(samples=samples)
            return result

        return get_batch_samples

    def dataloader(self, phase: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """``get_train_dataloader`` / ``get_eval_dataloader``: the torch DataLoader inside what they return is
        instrumented (its workers' timings come back) and its configuration recorded for ``phase``."""

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def get_dataloader(*args: Any, **kwargs: Any) -> Any:
                loader = original(*args, **kwargs)
                inner = inner_loader(loader)
                if inner is None:
                    return loader
                if phase == DEFAULT_PHASE:
                    self.start()
                self.loader_of[phase] = inner
                config = loader_config(inner)
                if config is not None:
                    _default.tree.loader_configs[phase] = config
                if _default.is_enabled() and not any(inner is known for known in self.loaders):
                    instrument_always(inner, _default)
                    self.loaders.append(inner)
                return loader

            return get_dataloader

        return make

    def timed(self, stage: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            block = _default.timed(stage)

            def call(*args: Any, **kwargs: Any) -> Any:
                with block:
                    return original(*args, **kwargs)

            return call

        return make

    def log(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def log(logs: dict[str, float], *args: Any, **kwargs: Any) -> Any:
            if self.val is not None:  # evaluate() logs its metrics once its loop is over
                self.val.close()
                self.val = None
            with _default.timed("log"):
                if _default.is_enabled():
                    logs.update(metrics())  # before log_history and every callback see them
                return original(logs, *args, **kwargs)

        return log

    def evaluate(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def evaluate(*args: Any, **kwargs: Any) -> Any:
            with _default.timed("eval"):
                self.val = Beats(_default, self.val_phase, self.loader_of.get(self.val_phase))
                self.val.wait()
                try:
                    return original(*args, **kwargs)
                finally:
                    if self.val is not None:
                        self.val.close()
                        self.val = None

        return evaluate

    def prediction_step(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def prediction_step(*args: Any, **kwargs: Any) -> Any:
            val = self.val
            if val is None:  # predict(), or evaluate() called some other way
                return original(*args, **kwargs)
            val.go()
            try:
                return original(*args, **kwargs)
            finally:
                val.wait()

        return prediction_step

    # -- the optimizer and the end, through a callback -----------------------------------------------------

    def optimizer_started(self) -> None:
        self.optimizer_block = _default.timed("optimizer")
        self.optimizer_block.__enter__()

    def optimizer_ended(self) -> None:
        block, self.optimizer_block = self.optimizer_block, None
        if block is not None:
            block.__exit__(None, None, None)

    def start(self) -> None:
        if not _default.is_enabled():
            _default.reset()  # what it holds is an earlier run's, saved then: this run starts empty
            _default.enable()
            self.enabled_here = True
        _default.window_end.stop_with = self.stop_training  # stepwatch.enable(active=N, stop=True) ends train()

    def stop_training(self) -> None:
        """The measured window closed with ``stop``: the Trainer ends ``train`` after this step, as a callback
        setting ``control.should_training_stop`` would."""
        self.trainer.control.should_training_stop = True

    def finish(self, crashed: bool = False) -> None:
        """At the end of ``train``, however it ends (normally, an exception, Ctrl-C): closes the loop, saves
        the run (the part recorded, if it failed), prints the report, and leaves stepwatch as it found it.
        Once per train; a train that failed before its first batch only puts stepwatch back."""
        if self.train is not None:
            self.train.close()
            self.train = None
            self.summary = _default.summary()
            out = self.out or os.path.join(self.trainer.args.output_dir or os.getcwd(), "stepwatch.json")
            os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
            # in a job of several ranks, rank 0 gathers, unless this rank failed (the others may still train)
            written, gathered = save_run(_default, out, gather=not crashed)
            self.out = out
            if is_rank_zero():
                sys.stderr.write(end_report(_default.report(), written, gathered, out))
        self.take_off_loaders()
        _default.window_end.stop_with = None
        if self.enabled_here:
            _default.disable()
            self.enabled_here = False

    def run_train(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``trainer.train``: each call is a run of its own (a second train's file holds its steps only), and
        whatever way it ends, its run is saved and stepwatch left as found."""

        def train(*args: Any, **kwargs: Any) -> Any:
            if self.summary is not None:  # a previous train of this trainer was recorded and saved
                _default.reset()
                self.summary = None
            try:
                result = original(*args, **kwargs)
            except BaseException:
                self.finish(crashed=True)
                raise
            self.finish()
            return result

        return train

    def take_off_loaders(self) -> None:
        for loader in self.loaders:
            uninstrument(loader)
        self.loaders.clear()

    def detach(self) -> None:
        """Puts the trainer's own methods, its accelerator's backward, its callbacks and its DataLoaders back
        as they were."""
        self.take_off_loaders()
        if self.trainer.__dict__.get(_ATTACHED) is self:
            del self.trainer.__dict__[_ATTACHED]
        for name, own in self.originals.items():
            if own is None:
                self.trainer.__dict__.pop(name, None)
            else:
                setattr(self.trainer, name, own)
        self.originals.clear()
        accelerator = self.trainer.accelerator
        if self.backward_before is None:
            accelerator.__dict__.pop("backward", None)
        else:
            accelerator.backward = self.backward_before
        if self.callback is not None:
            self.trainer.remove_callback(self.callback)
            self.callback = None


def metrics() -> dict[str, float]:
    """The current figures of the training phase, flat, for a logger."""
    summary = _default.summary()
    phase = summary.phases.get(DEFAULT_PHASE)
    if phase is None or not phase.steps:
        return {}
    figures: dict[str, float] = {}
    for stage in ("loader", "step", "step/h2d", "step/forward", "step/backward", "step/optimizer"):
        if stage in phase.stages:
            figures[f"stepwatch/{stage.rsplit('/', 1)[-1]}_ms"] = phase.stages[stage].mean * 1e3
    figures["stepwatch/input_share"] = phase.share("loader") if "loader" in phase.stages else 0.0
    for unit, rate in phase.throughput.items():
        figures[f"stepwatch/{unit}_per_s"] = rate
    flops = flops_of(summary, phase)
    if flops is not None:
        figures["stepwatch/flops_per_s"] = flops.per_s
        if flops.mfu is not None:
            figures["stepwatch/mfu"] = flops.mfu
    return figures


def attach(trainer: Any, out: str | os.PathLike[str] | None = None, *, val_phase: str = "val") -> Attachment:
    """Record ``trainer.train()`` with stepwatch (see the module's docstring); returns the attachment, whose
    ``summary`` holds the run once training ends and whose ``detach()`` puts the trainer back."""
    import transformers

    missing = [name for name in _WRAPPED if not callable(getattr(trainer, name, None))]
    accelerator: Any = getattr(trainer, "accelerator", None)
    if missing or not callable(getattr(accelerator, "backward", None)):
        names = ", ".join(missing or ["accelerator.backward"])
        raise RuntimeError(
            f"stepwatch cannot attach to this Trainer: transformers {transformers.__version__} has no {names};"
            " stepwatch.integrations.transformers supports transformers 4.40 to 5.x"
        )
    existing = trainer.__dict__.get(_ATTACHED)
    if isinstance(existing, Attachment) and existing.originals:
        return existing  # attached already: the same attachment (stages would otherwise nest in themselves)
    attachment = Attachment(trainer, None if out is None else os.fspath(out), val_phase)
    attachment.wrap("train", attachment.run_train)
    attachment.wrap("get_batch_samples", attachment.get_batch_samples)
    for name, phase in (("get_train_dataloader", DEFAULT_PHASE), ("get_eval_dataloader", val_phase)):
        if callable(getattr(trainer, name, None)):
            attachment.wrap(name, attachment.dataloader(phase))
    attachment.wrap("_prepare_inputs", attachment.timed("h2d"))
    attachment.wrap("compute_loss", attachment.timed("forward"))
    attachment.wrap("log", attachment.log)
    attachment.wrap("evaluate", attachment.evaluate)
    if callable(getattr(trainer, "prediction_step", None)):
        attachment.wrap("prediction_step", attachment.prediction_step)
    if callable(getattr(trainer, "_save_checkpoint", None)):
        attachment.wrap("_save_checkpoint", attachment.timed("save"))
    backward = accelerator.backward
    attachment.backward_before = accelerator.__dict__.get("backward")
    accelerator.backward = functools.wraps(backward)(attachment.timed("backward")(backward))
    attachment.callback = _callback_class(transformers)(attachment)
    trainer.add_callback(attachment.callback)
    trainer.__dict__[_ATTACHED] = attachment
    return attachment


def _callback_class(transformers: Any) -> type:
    class StepwatchCallback(transformers.TrainerCallback):  # type: ignore[misc]
        """Times the optimizer step between the Trainer's two callbacks around it; ends the run."""

        def __init__(self, attachment: Attachment) -> None:
            self.attachment = attachment

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.attachment.optimizer_started()

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.attachment.optimizer_ended()

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.attachment.finish()

    return StepwatchCallback
