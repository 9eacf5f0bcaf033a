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
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, NoReturn

from ._job import in_job
from ._results import save_run

if TYPE_CHECKING:
    from ._all_ranks import AllRanks
    from ._recorder import Stopwatch

logger = logging.getLogger("stepwatch")

_installed: dict[int, Stopwatch] = {}
"""Stopwatches to save, held strongly: one enabled with ``out=`` inside a function that has returned is still
saved at exit."""
_reports: dict[int, tuple[Stopwatch, bool]] = {}
"""Stopwatches whose report goes to stderr when the program ends (``stepwatch run``, ``STEPWATCH=auto``), each
with whether a run with nothing recorded is skipped (neither saved nor reported: a helper process that
inherited ``STEPWATCH=auto``)."""
_at_end: list[Callable[[], None]] = []
"""Called before the final save: what must close for the run to add up (auto-instrumentation's steps)."""
_hooks_lock = threading.Lock()
_hooks_installed = False
_previous_signal_handlers: dict[int, Any] = {}
_previous_excepthook = sys.excepthook
_owner_pid = 0
"""The process that installed the hooks: a forked child (a DataLoader worker) inherits them, but must never
write its stale copy of the parent's recording over the parent's file."""
_crashed = False
"""An uncaught exception ended this process: its saves gather nothing (see :func:`save_all`)."""
_original_os_exit: Callable[[int], NoReturn] = os._exit
_replacing: dict[str, None] = {}
"""Run files that held an earlier run when recording into them began."""


def install(stopwatch: Stopwatch, report: bool = False, skip_empty: bool = False) -> None:
    """Registers ``stopwatch`` for saving to ``stopwatch.out``; the process-wide hooks are installed once.
    With ``report``, its report is also printed on stderr when the program ends (once)."""
    global _hooks_installed
    _installed[id(stopwatch)] = stopwatch
    if stopwatch.out is not None and os.path.exists(stopwatch.out):
        _replacing[stopwatch.out] = None  # an earlier run is there: the end says it was replaced
    if report:
        _reports[id(stopwatch)] = (stopwatch, skip_empty)
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
        global _original_os_exit
        _original_os_exit = os._exit
        os._exit = _os_exit  # a program that ends with os._exit(n) keeps its code, and its run
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                _previous_signal_handlers[signum] = signal.getsignal(signum)
                signal.signal(signum, _on_signal)
        else:
            logger.warning("stepwatch: enabled outside the main thread; runs are not saved on SIGTERM/SIGINT")


def before_final_save(callback: Callable[[], None]) -> None:
    """Runs ``callback`` as the program ends, before the final save and the report (once, however often
    registered)."""
    if callback not in _at_end:
        _at_end.append(callback)


def _os_exit(status: int) -> NoReturn:
    """``os._exit`` while runs are to be saved: this process's runs are saved (and reported) first, without
    gathering the ranks (the process ends at once: its own file is what there is), then it ends as asked.
    Forked children (multiprocessing ends them with ``os._exit``) save nothing, as always."""
    try:
        save_all("os._exit", gather=False)
    finally:
        _original_os_exit(status)


def save_all(reason: str, final: bool = True, gather: bool = True) -> None:
    """Saves every registered stopwatch that has an output path; never raises. ``final``: the program ends
    now, so the reports asked for are printed (once). Does nothing in a child process: the run file belongs to
    the process that started the run, not to its DataLoader workers or other children, forked (which inherit
    these hooks and a stale copy of the recording) or spawned (which inherit ``STEPWATCH_OUT``). In a job of
    several ranks, a final save also gathers the ranks onto rank 0, unless this rank crashed (an uncaught
    exception: the others are likely still training, and rank 0 would wait for them in vain)."""
    if os.getpid() != _owner_pid or multiprocessing.parent_process() is not None:
        return
    if final:
        for callback in _at_end:
            try:
                callback()
            except Exception as error:  # the save must still happen
                logger.error("stepwatch: at %s: %s", reason, error)
    gathered: dict[int, AllRanks | None] = {}
    gather = gather and final and not _crashed and in_job()
    for stopwatch in list(_installed.values()):
        if stopwatch.out is None or (_reports.get(id(stopwatch), (None, False))[1] and not stopwatch.tree.phases):
            continue
        try:
            # at the end, each rank of a job also sends its summary to rank 0, which writes the all-ranks file
            _, gathered[id(stopwatch)] = save_run(
                stopwatch, stopwatch.out, gather=gather, tag=f"{stopwatch.out}#end", among=stopwatch.out
            )
        except Exception as error:  # a failing save must not hide the program's own outcome
            logger.error("stepwatch: could not save the run to %s at %s: %s", stopwatch.out, reason, error)
    if final:
        for key, (stopwatch, skip_empty) in list(_reports.items()):
            del _reports[key]
            if not (skip_empty and not stopwatch.tree.phases):
                _print_report(stopwatch, gathered.get(key))


def _print_report(stopwatch: Stopwatch, gathered: AllRanks | None) -> None:
    """The report on stderr; in a job of several ranks, rank 0's own and the all-ranks report, on rank 0 only."""
    try:
        from ._all_ranks import end_report
        from ._job import is_rank_zero, rank_path

        if not is_rank_zero():
            return
        from ._window_end import end_line

        line = end_line(stopwatch)
        if line is not None:  # the report was printed when the window closed
            sys.stderr.write(line)
            sys.stderr.flush()
            return
        text = stopwatch.report()
        written = None if stopwatch.out is None else rank_path(stopwatch.out)
        if stopwatch.out is not None and written is not None and os.path.exists(written):
            text = end_report(text, written, gathered, stopwatch.out, replaced=stopwatch.out in _replacing)
        sys.stderr.write(text)
        sys.stderr.flush()
    except Exception as error:  # the program's own outcome must show, whatever happens here
        logger.error("stepwatch: no report: %s", error)


def _excepthook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    global _crashed
    for stopwatch in list(_installed.values()):
        if logger.isEnabledFor(logging.DEBUG):
            try:
                logger.debug("stepwatch report at uncaught %s:\n%s", kind.__name__, stopwatch.report())
            except Exception as error:  # the program's own exception is what must show
                logger.debug("stepwatch: no report at uncaught %s: %s", kind.__name__, error)
    try:
        _previous_excepthook(kind, value, tb)  # the traceback first; the report, if asked for, below it
    finally:
        _crashed = True  # the save at exit that follows gathers nothing either
        save_all(f"uncaught {kind.__name__}")


def _on_signal(signum: int, frame: FrameType | None) -> None:
    previous = _previous_signal_handlers.get(signum, signal.SIG_DFL)
    # the program ends now unless a handler of its own (Python's KeyboardInterrupt included) takes over
    # or the signal was ignored
    save_all(signal.Signals(signum).name, final=previous == signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    # SIG_IGN: the signal was ignored before stepwatch and stays ignored
