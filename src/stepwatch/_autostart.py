"""Switching auto-instrumentation on and off: ``stepwatch.auto()``, ``STEPWATCH=auto`` (started by
``stepwatch-auto.pth`` in programs that never import stepwatch) and the default run file. The instrumentation
itself is in ``_auto`` and ``_patches``.

Torch is never imported here: when the program has not imported it yet, the patches go on when it does.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from . import _default_instance, _patches
from ._auto import AutoSession
from ._constants import DEFAULT_PHASE, VAL_PHASE

logger = logging.getLogger("stepwatch")


class _TorchImported(importlib.abc.MetaPathFinder):
    """Calls back once ``torch`` has been imported by the program, so that stepwatch never imports it."""

    def __init__(self, callback: Callable[[ModuleType], None]) -> None:
        self.callback = callback

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname != "torch":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        loader = getattr(spec, "loader", None)
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return None
        execute = loader.exec_module
        callback = self.callback

        def exec_module(module: ModuleType) -> None:
            execute(module)
            _remove_finder()
            try:
                callback(module)
            except Exception as error:  # the program's own import must succeed, instrumented or not
                logger.error("stepwatch: auto-instrumentation failed, the program runs uninstrumented: %s", error)

        loader.exec_module = exec_module
        return spec


_finder: _TorchImported | None = None


def _remove_finder() -> None:
    global _finder
    if _finder is not None and _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    _finder = None


def auto(on: bool = True, *, val_phase: str = VAL_PHASE, device: Any = "auto") -> None:
    """Instrument the program's training loop without changing its code (see the module's docstring), on
    the default stopwatch, which this enables. ``val_phase`` names the loops that run no backward; ``device``
    is ``"auto"`` (time the device once the program uses CUDA), ``"none"``, or a device to time from the
    start. ``auto(False)`` removes every patch and hook; what was recorded stays."""
    global _finder
    from ._blocks import check_name

    default = _default_instance.stopwatch

    current = _patches.session
    if current is not None:
        current.uninstall()
        current.found.active = False  # what it found still describes the run, until a reset
        _patches.session = None
    _remove_finder()
    if not on:
        return
    check_name(val_phase, "phase")
    if val_phase == DEFAULT_PHASE:
        raise ValueError(f"val_phase must differ from {DEFAULT_PHASE!r}, the phase of loops that run a backward")
    from ._save_at_exit import before_final_save

    before_final_save(_end_steps)
    session = AutoSession(default, val_phase, device)
    _patches.session = session
    default.auto_hooks.describe = session.found.describe
    if not default.is_enabled():
        default.enable()
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "utils"):
        session.install(torch)
    else:
        _finder = _TorchImported(session.install)
        sys.meta_path.insert(0, _finder)


def run_file(program: str, module: bool = False) -> str:
    """The default run file of a program: named after its script (``train.py`` -> ``train.stepwatch.json``)
    or module, in the current directory."""
    name = program if module else os.path.splitext(os.path.basename(program))[0]
    return os.path.abspath(f"{name or 'stepwatch'}.stepwatch.json")


def _main_program() -> tuple[str, bool]:
    """What ``python`` runs: a script's path, or a module's name (``-m``), as ``sys.orig_argv`` says."""
    argv = list(getattr(sys, "orig_argv", []))
    index = 1
    while index < len(argv):
        argument = argv[index]
        if argument == "-m" and index + 1 < len(argv):
            return argv[index + 1], True
        if argument in ("-c", "-") or not argument.startswith("-"):
            return ("" if argument.startswith("-") else argument), False
        index += 2 if argument in ("-X", "-W", "--check-hash-based-pycs") else 1  # options with a value
    return (sys.argv[0] if sys.argv and sys.argv[0] not in ("-c", "-m", "-") else ""), False


def start_from_env() -> None:
    """``STEPWATCH=auto``: record the program with auto-instrumentation, save the run to ``STEPWATCH_OUT``
    (else a file named after the program) and print the report when it ends. A process that records
    nothing (a helper launched with the variable inherited) writes nothing."""
    from . import _save_at_exit
    from ._config import OUT_VARIABLE, live_from_env, out_from_env

    default = _default_instance.stopwatch

    named = out_from_env()
    try:
        default.enable(out=named or run_file(*_main_program()), live=live_from_env() or None)
    except ValueError as error:  # said now, in one line, not after the run; the program runs unrecorded
        where = f"{OUT_VARIABLE}={named!r}" if named is not None else "the default run file"
        sys.stderr.write(f"stepwatch: {where}: {error}; not recording (set {OUT_VARIABLE} to a writable file)\n")
        return
    _save_at_exit.install(default, report=True, skip_empty=True)
    auto()


def _end_steps() -> None:
    """Before the final save, as the program ends: steps ended by optimizer steps are closed, so that the run
    adds up, and every patch comes off."""
    if _patches.session is not None:
        auto(False)


def _forget_in_child() -> None:
    """A forked child (a DataLoader worker) keeps the patches of its parent but never times with them."""
    _patches.session = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
