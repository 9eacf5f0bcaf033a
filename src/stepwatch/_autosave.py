"""Nothing lost: save the run at normal exit, on an uncaught exception and on SIGTERM/SIGINT.

Each handler saves, then hands over to what was there before, so the process still dies from SIGTERM or
raises ``KeyboardInterrupt`` exactly as it would without stepwatch.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import signal
import sys
import threading
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._recorder import Stopwatch

logger = logging.getLogger("stepwatch")

_installed: dict[int, Stopwatch] = {}
"""Stopwatches to save, held strongly: one enabled with ``out=`` inside a function that has returned is still
saved at exit."""
_hooks_lock = threading.Lock()
_hooks_installed = False
_previous_signal_handlers: dict[int, Any] = {}
_previous_excepthook = sys.excepthook
_owner_pid = 0
"""The process that installed the hooks: a forked child (a DataLoader worker) inherits them, but must never
write its stale copy of the parent's recording over the parent's file."""


def install(stopwatch: Stopwatch) -> None:
    """Registers ``stopwatch`` for saving to ``stopwatch.out``; the process-wide hooks are installed once."""
    global _hooks_installed
    _installed[id(stopwatch)] = stopwatch
    with _hooks_lock:
        if _hooks_installed:
            return
        _hooks_installed = True
        global _owner_pid
        _owner_pid = os.getpid()
        atexit.register(save_all, "exit")
        global _previous_excepthook
        _previous_excepthook = sys.excepthook
        sys.excepthook = _excepthook
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                _previous_signal_handlers[signum] = signal.getsignal(signum)
                signal.signal(signum, _on_signal)
        else:
            logger.warning("stepwatch: enabled outside the main thread; runs are not saved on SIGTERM/SIGINT")


def save_all(reason: str) -> None:
    """Saves every registered stopwatch that has an output path; never raises. Does nothing in a child
    process: the run file belongs to the process that started the run, not to its DataLoader workers or other
    children, forked (which inherit these hooks and a stale copy of the recording) or spawned (which inherit
    ``STEPWATCH_OUT``)."""
    if os.getpid() != _owner_pid or multiprocessing.parent_process() is not None:
        return
    for stopwatch in list(_installed.values()):
        if stopwatch.out is None:
            continue
        try:
            stopwatch.save(stopwatch.out)
        except Exception as error:  # a failing save must not hide the program's own outcome
            logger.error("stepwatch: could not save the run to %s at %s: %s", stopwatch.out, reason, error)


def _excepthook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    for stopwatch in list(_installed.values()):
        if logger.isEnabledFor(logging.DEBUG):
            try:
                logger.debug("stepwatch report at uncaught %s:\n%s", kind.__name__, stopwatch.report())
            except Exception as error:  # the program's own exception is what must show
                logger.debug("stepwatch: no report at uncaught %s: %s", kind.__name__, error)
    save_all(f"uncaught {kind.__name__}")
    _previous_excepthook(kind, value, tb)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    save_all(signal.Signals(signum).name)
    previous = _previous_signal_handlers.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    # SIG_IGN: the signal was ignored before stepwatch and stays ignored
