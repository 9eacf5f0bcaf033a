"""When the measured window closes: the report and the saved run right then, and, if asked, the program stopped.

A schedule with ``active`` steps (and no ``every``) closes its window once when the training loop's last
measured step ends. With an output path (``enable(out=...)``, ``stepwatch run``) the run is saved at that moment
(the ranks of a job gathered, as ``gather_every`` does) and the report printed on stderr, so the answer comes
after the window, not at the end of a training that may run for hours; the report at exit then says where it
was printed instead of printing it twice. With ``stop``, the program is then ended as Ctrl-C would end it
(the exception unwinds the training loop, its ``finally`` blocks and DataLoader workers), but as ``sys.exit(0)``:
exit status 0, the run saved. A framework that has its own way to stop (Lightning's ``Trainer.should_stop``,
the Hugging Face ``Trainer``'s control) plugs it in as :attr:`WindowEnd.stop_with`.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from ._schedule import check_flag

if TYPE_CHECKING:
    from ._all_ranks import AllRanks
    from ._recorder import Stopwatch
    from ._schedule import Schedule

logger = logging.getLogger("stepwatch")


def check_stop(stop: object, schedule: Schedule) -> bool:
    """``stop`` is a bool, and True only with a window that closes."""
    stopping = check_flag(stop, "stop")
    if stopping and not schedule.closes:
        raise ValueError("stop needs active=N without every: a measured window that closes")
    return stopping


class StoppedByStepwatch(SystemExit):
    """Raised from the training loop's ``next()`` when the measured window closed with ``stop=True``: the
    program ends with exit status 0, as ``sys.exit(0)`` ends it, after its ``finally`` blocks ran."""

    def __init__(self, step: int) -> None:
        super().__init__(0)
        self.step = step


class WindowEnd:
    """What a stopwatch does when its measured window closes (see the module's docstring)."""

    def __init__(self) -> None:
        self.stop = False  # end the program after the window's report
        self.report = True  # print the report when the window closes (not with stepwatch run --quiet)
        self.stop_with: Callable[[], None] | None = None  # a framework's own way to stop, instead of raising
        self.closed_at: int | None = None  # the step after which the window closed
        self.reported_at: int | None = None  # the step at which the report was printed (once per run)
        self.stopped_at: int | None = None

    def clear(self) -> None:
        """A new run (``reset()``): its window closes anew."""
        self.closed_at = self.reported_at = self.stopped_at = None

    def closed(self, stopwatch: Stopwatch, step: int) -> None:
        """The window closed after ``step`` steps of the training loop: save and report (with an output path),
        then stop if asked. Never raises but to stop; a failing save or report is one line on the log."""
        if self.closed_at is not None:
            return
        self.closed_at = step
        if stopwatch.out is not None:
            self.reported_at = step
            gathered = _save(stopwatch)
            if self.report:
                _print(stopwatch, gathered, step, self.stop)
        if not self.stop:
            return
        self.stopped_at = step
        if self.stop_with is not None:  # a framework's trainer, which reports and saves as the training ends
            _say(f"stepwatch: the measured window closed at step {step}: ending the training")
            self.stop_with()
            return
        if stopwatch.out is None:
            _say(f"stepwatch: stopped the program at step {step}: its measured window closed")
        raise StoppedByStepwatch(step)


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _save(stopwatch: Stopwatch) -> AllRanks | None:
    from ._results import save_run

    out = stopwatch.out
    assert out is not None
    try:
        _, gathered = save_run(stopwatch, out, gather=True, tag=f"{out}#window", among=out)
    except Exception as error:
        logger.error("stepwatch: could not save the run to %s when the window closed: %s", out, error)
        return None
    return gathered


def _print(stopwatch: Stopwatch, gathered: AllRanks | None, step: int, stopping: bool) -> None:
    """The report on stderr (on rank 0 of a job, with the all-ranks report), and what happens next."""
    try:
        from ._all_ranks import end_report
        from ._job import is_rank_zero, rank_path

        if not is_rank_zero():
            return
        out = stopwatch.out
        assert out is not None
        text = end_report(stopwatch.report(), rank_path(out), gathered, out)
        then = "stopping the program" if stopping else "the program goes on, no longer measured"
        sys.stderr.write(f"stepwatch: the measured window closed at step {step}; {then}\n{text}")
        sys.stderr.flush()
    except Exception as error:  # the training must go on whatever happens here
        logger.error("stepwatch: no report when the window closed: %s", error)


def end_line(stopwatch: Stopwatch) -> str | None:
    """At exit, instead of the report printed when the window closed: where it was, and where the run is."""
    window = stopwatch.window_end
    if window.reported_at is None:
        return None
    where = f"; the run is saved to {os.path.relpath(stopwatch.out)}" if stopwatch.out is not None else ""
    if window.stopped_at is not None:
        return f"stepwatch: stopped the program at step {window.stopped_at}, after the report above{where}\n"
    return f"stepwatch: the report was printed at step {window.reported_at}, when the window closed{where}\n"
