"""Auto-instrumentation: the step breakdown of a program nobody edited.

``stepwatch.auto()`` (or ``STEPWATCH=auto``, or ``stepwatch run train.py``) patches torch (see ``_patches``) so
that every loop over a DataLoader is watched as ``watch(loader)`` would watch it, and the outermost forward,
the loss module, backward, the optimizer step, ``zero_grad`` and host-to-device copies inside its steps are
timed blocks of the default stopwatch. A loop that runs a backward is the ``train`` phase, one that does not is
``val``; without any DataLoader, a step ends at each optimizer step. Switching it on and off is in
``_autostart``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing
import sys
import weakref
from collections.abc import Callable, Generator, Iterator
from threading import get_ident
from types import ModuleType
from typing import TYPE_CHECKING, Any

from . import _patches
from ._auto_found import WhatAutoFound
from ._auto_steps import auto_steps
from ._batch_size import uniform_batches
from ._block_base import AutoState
from ._constants import DEFAULT_PHASE, VAL_PHASE
from ._external_loops import DrivenLoop, is_empty, rename_phase
from ._module_calls import ModuleCalls

if TYPE_CHECKING:
    from ._blocks import Block
    from ._recorder import Stopwatch

logger = logging.getLogger("stepwatch")

_SITE_DEPTH = 3
"""Frames above ``DataLoader.__iter__`` that tell one loop from another (the same progress-bar library line
serves every loop that uses it)."""
_MAX_REMEMBERED = 1000


class _Plain:
    """A DataLoader iterated by its own ``__iter__``, for the watch() that auto-instrumentation builds."""

    def __init__(self, loader: Any, original_iter: Callable[[Any], Iterator[Any]]) -> None:
        self.loader = loader
        self._iter = original_iter

    def __iter__(self) -> Iterator[Any]:
        return self._iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)


class AutoSession(AutoState):  # type: ignore[misc]
    """One auto-instrumentation of a stopwatch: its patches, what it found, and which thread's loop runs. Its
    attributes read by every wrapped call (``busy``, ``loop_thread``...) are C fields of ``AutoState`` where
    the speedups are built."""

    def __init__(self, stopwatch: Stopwatch, val_phase: str = VAL_PHASE, device: Any = "auto") -> None:
        self.sw = stopwatch
        self.val_phase = val_phase
        self.device_choice = device
        self.patches = _patches.Patches()
        self.module_calls = ModuleCalls(self.patches)
        self.outer_classes = self.module_calls.outer  # read by the C wrappers without the attribute lookups
        # the stopwatch's compiled timed() and count() (None where not compiled): the C wrappers and loop read the
        # blocks by name, stacks and tree these keep (re-pointed with the stopwatch's state) without lookups
        self.kept_lookup = stopwatch._blocks.lookup
        self.kept_counter = stopwatch._blocks.count
        self.found = WhatAutoFound()
        self.loop_thread: int | None = None  # the thread whose loop's steps are broken down
        self.loop_depth = 0
        self.steps_to_next_check = 1  # counted down by the loop's steps to the next check_module_calls()
        self.instrumented: weakref.WeakSet[Any] = weakref.WeakSet()  # the DataLoaders watched, to undo
        self.busy = 0  # auto blocks open (nested patched calls are plain)
        self.open_blocks: list[Block] = []  # optimizer blocks opened by the pre-step hook
        self.backward_calls = 0
        self.training_blocks = 0  # forward, loss and backward blocks of training (not evaluation) so far
        self.zero_grads = 0  # zero_grad blocks so far
        self.trained: weakref.WeakSet[Any] = weakref.WeakSet()  # models whose forward ran for training
        self.evaluation: Generator[Any, None, None] | None = None  # the val loop of an evaluation in a step
        self.evaluation_thread: int | None = None
        self.driven: DrivenLoop | None = None
        self.sites: dict[tuple[Any, ...], str] = {}  # where a loop runs -> "train" or "val", learned
        self.last_model: weakref.ref[Any] | None = None
        # the module calls whose stage is known until something changes (module_stage's fast path, in the wrapper)
        self.steady_forward: weakref.ref[Any] | None = None  # the last model, last called for training
        self.steady_loss: weakref.ref[Any] | None = None  # the last loss module, last called for training
        self._last_trained: weakref.ref[Any] | None = None  # the last module added to ``trained``
        self._classes: dict[type, tuple[str, bool]] = {}  # module class -> its name, whether a loss module
        self.accelerator = False
        self.torch: ModuleType | None = None

    # -- installing ----------------------------------------------------------------------------------------

    def install(self, torch: ModuleType) -> None:
        """Patches torch, now imported; in a child process (a DataLoader worker, a spawned process) nothing."""
        if self.torch is not None or multiprocessing.parent_process() is not None:
            return
        self.torch = torch
        if self.device_choice not in ("auto", None, "none", "cpu"):
            self._use_device(self.device_choice)
        _patches.install(self.patches, torch, self.accelerator)
        self.module_calls.install(torch)

    def uninstall(self) -> None:
        self.end_evaluation()
        if self.driven is not None:
            self.driven.close()
            self.driven = None
        self.patches.undo()
        from ._dataloader.watch import uninstrument

        for loader in list(self.instrumented):
            uninstrument(loader)
        self.instrumented.clear()
        self.loop_thread, self.loop_depth, self.busy = None, 0, 0
        self.open_blocks.clear()

    # -- what the wrappers ask -------------------------------------------------------------------------------

    def module_stage(self, module: Any) -> str:
        """The stage of an outermost module call: ``loss`` for a loss module, else ``forward``. A forward of
        the model being trained made under ``no_grad``/``inference_mode`` or in eval mode, inside a training
        step, is an evaluation: a step of the val phase, taken out of the training step. Called once per
        outermost call: what it learns of a class or a module it learns once."""
        torch = self.torch
        cls = type(module)
        known = self._classes.get(cls)
        if known is None:
            known = self._classes[cls] = self._describe(cls)
        name, is_loss = known
        modules = getattr(module, "_modules", None)
        inner = (modules.get("_orig_mod") or modules.get("module")) if type(modules) is dict else None
        if inner is not None:  # compiled, DDP, DP
            name = f"{name}({type(inner).__name__})"
        grad = torch is None or (torch.is_grad_enabled() and not torch.is_inference_mode_enabled())
        if is_loss:
            self.found.loss.setdefault(name, None)
            self.steady_loss = None
            if grad and self.evaluation is None:
                self.training_blocks += 1
                with contextlib.suppress(TypeError):
                    self.steady_loss = weakref.ref(module)
            return "loss"
        self.found.forward.setdefault(name, None)
        last = self.last_model
        if last is None or last() is not module:
            last = self.last_model = weakref.ref(module)
        self.steady_forward = None
        if grad and getattr(module, "training", True):
            if self.evaluation is not None:
                self.end_evaluation()
            self.training_blocks += 1
            if self._last_trained is None or self._last_trained() is not module:
                with contextlib.suppress(TypeError):
                    self.trained.add(module)
                    self._last_trained = weakref.ref(module)
            self.steady_forward = last
        elif self._trained(module):
            self._evaluation_step()
        return "forward"

    def _describe(self, cls: type) -> tuple[str, bool]:
        """A module class's name in the report, and whether it is a loss module."""
        torch = self.torch
        is_loss = torch is not None and issubclass(cls, torch.nn.modules.loss._Loss)
        if len(self._classes) >= _MAX_REMEMBERED:
            self._classes.clear()
        return cls.__name__, is_loss

    def _trained(self, module: Any) -> bool:
        try:
            return module in self.trained
        except TypeError:
            return False

    def _evaluation_step(self) -> None:
        """An evaluation forward inside a training step: the next step of the val loop that takes the
        evaluation out of the step (its first forward starts that loop)."""
        if self.evaluation is not None:
            next(self.evaluation)
            return
        if self.sw.stacks.phase_name() != DEFAULT_PHASE:
            return  # already in another phase: a validation DataLoader loop of its own
        from ._loops import iterate

        self.evaluation = iterate(self.sw, itertools.repeat(None), "loader", "step", self.val_phase, driven=True)
        self.evaluation_thread = get_ident()
        self.found.evaluations += 1
        next(self.evaluation)
        self.sw.auto_hooks.end_evaluation = self.end_evaluation

    def end_evaluation(self) -> bool:
        """Ends the evaluation under way on this thread, if any: its last forward's step is counted (training
        resumed, or an enclosing block is closing). Returns whether one was ended."""
        evaluation = self.evaluation
        if evaluation is None or self.evaluation_thread != get_ident():
            return False
        self.evaluation = self.evaluation_thread = None
        self.sw.auto_hooks.end_evaluation = None
        with contextlib.suppress(StopIteration):
            next(evaluation)
        evaluation.close()
        return True

    def training_call(self) -> None:
        """Backward, an optimizer step or zero_grad on the loop's thread: training resumed."""
        if self.evaluation is not None:
            self.end_evaluation()

    def optimizer_stepped(self) -> None:
        """After an optimizer step outside any DataLoader loop, the step ends (the first starts the loop)."""
        self.training_call()
        if self.driven is not None:
            if self.driven.thread == get_ident() and self.loop_depth == 1:
                self.driven.tick()
                self._step_ended()
            return
        if self.loop_thread is None and self.sw.is_enabled():
            self._prepare_device()
            self.loop_thread, self.loop_depth = get_ident(), 1
            self.found.driven = True
            self.driven = DrivenLoop(self)

    def _step_ended(self) -> None:
        self.steps_to_next_check -= 1
        if self.steps_to_next_check <= 0:
            self.check_module_calls()

    def check_module_calls(self) -> None:
        """A step of the loop being broken down ended and :attr:`steps_to_next_check` fell to 0: every step
        while learning the outermost module classes, every ``RELEARN_EVERY`` steps once narrowed."""
        self.steps_to_next_check = self.module_calls.step_ended()

    def _end_driven(self) -> None:
        self.end_evaluation()
        if self.driven is not None:
            self.driven.close()
            self.driven = None
            self.loop_thread, self.loop_depth = None, 0

    # -- DataLoader loops ------------------------------------------------------------------------------------

    def loop(self, loader: Any, original_iter: Callable[[Any], Iterator[Any]]) -> Iterator[Any]:
        """What ``for batch in loader`` iterates while auto-instrumenting: the watched loop."""
        site = _site(sys._getframe(2))
        here = get_ident()
        self.end_evaluation()  # a DataLoader loop starting is no longer an evaluation made of bare forwards
        nested = self.loop_thread == here and self.driven is None  # inside a DataLoader loop's step
        kind = self._guess(site, nested)
        if self.loop_thread in (None, here) and (not nested or site not in self.sites):
            # a loop starting anew (an epoch, a validation loop): its steps may call other modules
            self.steps_to_next_check = self.module_calls.loop_started()
        if kind == "train" and self.driven is not None and self.driven.thread == here:
            self._end_driven()  # a DataLoader training loop takes over the steps
        if self.loop_thread is None:
            self._prepare_device()
        # a nested training loop (micro-batches) is part of the enclosing step, as with timed_iter
        name = None if nested and kind == "train" else DEFAULT_PHASE if kind == "train" else self.val_phase
        existing = self.sw.tree.phases.get(name) if name is not None else None
        created = name is not None and (existing is None or is_empty(existing))
        if len(self.found.loaders) < _MAX_REMEMBERED:
            self.found.loaders.setdefault(id(loader), int(getattr(loader, "num_workers", 0) or 0))
        watched = self.sw.watch(_Plain(loader, original_iter), phase=name, loaders=[loader])
        watched.counts_samples = False  # counted by _auto_steps, and not in a nested loop
        watched.for_frame = False  # the program's frame is not the one calling next() on it: _auto_steps is
        with contextlib.suppress(TypeError):  # a loader without weak references stays instrumented (and works)
            self.instrumented.add(loader)
        return self._steps(watched, site, kind, name, created, loader)

    def _steps(
        self, watched: Any, site: tuple[Any, ...], kind: str, name: str | None, created: bool, loader: Any
    ) -> Iterator[Any]:
        """The loop's batches (``_auto_steps``): it starts at its first batch and ends however it ends."""
        backward_before = 0
        steps: Iterator[Any] | None = None

        def begin() -> tuple[Iterator[Any], bool, int | None, int]:
            nonlocal backward_before, steps
            thread = get_ident()
            tracked = self.loop_thread in (None, thread)
            if tracked:
                self.loop_thread = thread
                self.loop_depth += 1
            backward_before = self.backward_calls
            uniform, full = uniform_batches(loader)
            steps = iter(watched)
            return steps, tracked, uniform, full

        def end(tracked: bool, batches: int) -> None:
            self.end_evaluation()
            close = getattr(steps, "close", None)
            if close is not None:
                close()
            if tracked:
                self.loop_depth -= 1
                if self.loop_depth == 0:
                    self.loop_thread = None
            if batches:
                self._learn(site, kind, name, created, self.backward_calls > backward_before)

        # a nested loop's batches are the enclosing one's: counted there
        return auto_steps(self, begin, end, self.sw if name is not None else None)

    def _guess(self, site: tuple[Any, ...], nested: bool) -> str:
        """Train or val, as the loop starts: val under ``no_grad``/``inference_mode``; else what this loop
        did before; else val if the model last called is in eval mode; else train, or val for a loop inside
        another loop's step (validation every N steps)."""
        torch = self.torch
        if torch is not None and (not torch.is_grad_enabled() or torch.is_inference_mode_enabled()):
            return "val"
        known = self.sites.get(site)
        if known is not None:
            return known
        model = self.last_model() if self.last_model is not None else None
        if model is not None and not getattr(model, "training", True):
            return "val"
        return "val" if nested else "train"

    def _learn(self, site: tuple[Any, ...], kind: str, name: str | None, created: bool, backward: bool) -> None:
        """After a loop: remember what it was; if guessed wrong and its phase is its own, rename the phase."""
        actual = "train" if backward else "val"
        if len(self.sites) < _MAX_REMEMBERED:
            self.sites[site] = actual
        if actual == kind or not created or name is None:
            return
        rename_phase(self.sw, name, DEFAULT_PHASE if actual == "train" else self.val_phase)

    # -- the device ------------------------------------------------------------------------------------------

    def _prepare_device(self) -> None:
        """Before a loop starts: time the device once the program uses an accelerator (CUDA initialized, or
        the model last called lives on one), and patch host-to-device copies."""
        if self.accelerator or self.device_choice != "auto" or self.torch is None:
            return
        torch = self.torch
        device = None
        cuda = getattr(torch, "cuda", None)
        if cuda is not None and cuda.is_available() and cuda.is_initialized():
            device = f"cuda:{cuda.current_device()}"
        else:
            model = self.last_model() if self.last_model is not None else None
            parameter = next(model.parameters(), None) if model is not None else None
            if parameter is not None and parameter.device.type == "cuda":
                device = str(parameter.device)
        if device is not None:
            self._use_device(device)
            _patches.install_h2d(self.patches, torch)

    def _use_device(self, device: Any) -> None:
        self.accelerator = True
        self.found.device = str(device)
        try:
            self.sw.use_device(device)
        except Exception as error:  # device timing is extra: the program runs on without it
            self.found.device = None
            logger.warning("stepwatch: no device timing on %s: %s", device, error)


def _site(frame: Any) -> tuple[Any, ...]:
    site = []
    for _ in range(_SITE_DEPTH):
        if frame is None:
            break
        site.append((frame.f_code, frame.f_lineno))
        frame = frame.f_back
    return tuple(site)
