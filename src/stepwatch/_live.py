"""The live view (``stepwatch run --live``, ``STEPWATCH_LIVE=1``, ``Stopwatch(live=True)``): the answer while it trains.

On a terminal (stderr is a TTY) a panel at the bottom of the screen is drawn again about once a second, between
two steps of the training loop, never inside one: the phase, the step, the time per step and throughput, the
top-level stages and their children with their share of the loop as bars, the DataLoader workers' use, the
verdict so far, and the measured window ("measuring steps 20-220", "window closed at step 220"). The program's
own output is kept intact: while the panel is shown, ``sys.stdout`` and ``sys.stderr`` pass every write through,
erasing the panel before it and drawing it again after each completed line, so the program's lines scroll
above the panel. Off a terminal (a log file, CI) one plain line is written every :data:`PLAIN_EVERY_S` seconds.

It is drawn by stepwatch itself with ANSI escape codes, standard library only: Rich's ``Live`` cost 2.5 ms a
redraw here (0.25% of the time at one redraw a second, over the 0.2% this view may cost). The figures come
from the recording's running totals (no percentiles); the verdict and the workers' line come from a full
summary every :data:`VERDICT_EVERY_S` seconds. Output written by other means than ``sys.stdout`` and
``sys.stderr`` (a logging handler made before the panel, a subprocess) is not kept below the panel.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any, TextIO

from ._constants import ONE_OFF

if TYPE_CHECKING:
    from ._recorder import Stopwatch
    from ._tree import Node, Phase

logger = logging.getLogger("stepwatch")

REDRAW_S = 1.0
"""Seconds between two redraws of the panel (at the first step boundary after that)."""
PLAIN_EVERY_S = 30.0
"""Off a terminal: seconds between two plain lines."""
VERDICT_EVERY_S = 10.0
"""Seconds between two full summaries (the verdict and the workers' line), at least; more when a summary takes
long, so that they cost at most :data:`JUDGING_SHARE` of the time."""
JUDGING_SHARE = 0.0005
MAX_ROWS = 10
BAR = 20
NEVER = 2**63
"""``due_ns`` of a view that draws no more."""


class LiveView:
    """The live view of one stopwatch's training loop. ``due_ns`` is read by the loop at every step boundary
    (the only cost between redraws); :meth:`draw` is called when it has passed."""

    def __init__(self, stopwatch: Stopwatch, stream: TextIO | None = None) -> None:
        self._sw = stopwatch
        self._stream = stream if stream is not None else sys.stderr
        self.tty = _isatty(self._stream)
        self._every_ns = int((REDRAW_S if self.tty else PLAIN_EVERY_S) * 1e9)
        self.due_ns = 0 if self.tty else stopwatch.clock() + self._every_ns
        self._panel: BottomPanel | None = None
        self._verdict_due_ns = 0
        self._verdict = ""
        self._workers = ""
        self._last: tuple[Phase, int] | None = None
        self._before = 0  # steps of the training loops that ended (each epoch's loop counts from 0)
        self.closed = False

    def draw(self, now_ns: int, phase: Phase, step: int) -> None:
        """Between two steps of the training loop (its ``step``-th step of ``phase`` just ended): the panel drawn
        again, or off a terminal, a line. Never raises: a failure is logged once and the view stops."""
        self.due_ns = now_ns + self._every_ns
        step += self._before
        self._last = (phase, step)
        if self._panel is None and not self._shown_here():
            self.due_ns = NEVER  # another rank of the job shows it: one panel per terminal
            return
        try:
            if now_ns >= self._verdict_due_ns and self._judge(phase.name):  # else again at the next redraw
                took = self._sw.clock() - now_ns
                self._verdict_due_ns = now_ns + max(int(VERDICT_EVERY_S * 1e9), int(took / JUDGING_SHARE))
            lines = self.lines(phase, step)
            if not self.tty:
                self._stream.write(f"{lines[0]} · {self._verdict or 'verdict: not yet'}\n")
                self._stream.flush()
                return
            if self._panel is None:
                self._panel = BottomPanel(self._stream)
                from ._save_at_exit import before_final_save

                before_final_save(self.close)  # the report at exit comes below the last panel
            self._panel.show(lines)
        except Exception as error:
            logger.warning("stepwatch: the live view stopped: %s", error)
            self.due_ns = NEVER
            if self._panel is not None:
                self._panel.release()

    def _shown_here(self) -> bool:
        """Whether this process shows the view: rank 0 of a job, or a process outside any job."""
        from ._job import is_rank_zero

        return is_rank_zero()

    def close(self) -> None:
        """The program ends (or stepwatch is told to stop showing): the panel is drawn a last time and left on
        the screen, the program's streams given back."""
        if self.closed:
            return
        self.closed = True
        self.due_ns = NEVER
        panel = self._panel
        if panel is None:
            return
        try:
            if self._last is not None:
                panel.show(self.lines(*self._last))
        except Exception as error:
            logger.warning("stepwatch: the live view's last panel: %s", error)
        panel.release()

    # -- what is shown -------------------------------------------------------------------------------------

    def lines(self, phase: Phase, step: int) -> list[str]:
        """The panel: a headline, a row per stage (loader, step and their children), the workers, the verdict."""
        sw = self._sw
        with sw.tree.lock:
            loop_ns, steps = phase.loop_ns, phase.steps
            counters = dict(phase.counted())
            rows = [(depth, node.path, _total(node), node.in_workers) for depth, node in _shown(phase.root)]
        per_step = f"{loop_ns / steps / 1e6:.2f} ms/step" if steps else "no step measured yet"
        rates = "".join(f" · {value / (loop_ns / 1e9):,.1f} {unit}/s" for unit, value in counters.items() if loop_ns)
        head = f"stepwatch · {phase.name} · step {step:,} · {per_step}{rates} · {self._window(step)}"
        lines = [head]
        width = max((len(path.rsplit("/", 1)[-1]) + 2 * depth for depth, path, _, _ in rows), default=0)
        for depth, path, total, in_workers in rows[:MAX_ROWS]:
            name = ("  " * depth + path.rsplit("/", 1)[-1]).ljust(width)
            per = f"{total / steps / 1e6:8.3f} ms/step" if steps else ""
            if in_workers:  # beside the loop, in the workers: no share of the loop's time
                lines.append(f"  {name}  {'in DataLoader workers':<{BAR + 7}}  {per}")
                continue
            share = total / loop_ns if loop_ns else 0.0
            filled = min(BAR, round(share * BAR))
            lines.append(f"  {name}  {'█' * filled}{'░' * (BAR - filled)} {share:6.1%}  {per}")
        if len(rows) > MAX_ROWS:
            lines.append(f"  ... {len(rows) - MAX_ROWS} more stages (stepwatch report lists them)")
        if self._workers:
            lines.append(f"  {self._workers}")
        lines.append(f"  {self._verdict or 'verdict: after the first summary'}")
        return lines

    def _window(self, step: int) -> str:
        sw = self._sw
        closed = sw.window_end.closed_at
        schedule = sw.schedule
        if closed is not None:
            return f"window closed at step {closed:,}"
        if schedule.active is None:
            return (
                f"measuring every step after {schedule.warmup} of warm-up"
                if schedule.warmup
                else "measuring every step"
            )
        first, last = schedule.warmup + 1, schedule.warmup + schedule.active
        if schedule.every is None:
            return f"measuring steps {first:,}-{last:,}"
        return f"measuring {schedule.active:,} of every {schedule.every:,} steps"

    def _judge(self, phase_name: str) -> bool:
        """The verdict and the workers' use, from a full summary (every :data:`VERDICT_EVERY_S` seconds once a
        step was measured). Returns whether there was one to judge."""
        summary = self._sw.summary()
        measured = summary.phases.get(phase_name)
        if measured is None or not measured.steps:
            return False
        from ._analysis import analyze

        self._verdict = f"verdict: {analyze(summary).headline}"
        if measured.workers:
            busy = [worker.utilization for worker in measured.workers.values()]
            mean = sum(busy) / len(busy)
            self._workers = f"DataLoader workers: {len(busy)}, busy {mean:.0%} of the time on average"
        return True

    def loop_ended(self, phase: Phase, steps: int) -> None:
        """A training loop (an epoch) ended after ``steps`` steps: the next one's count on from there."""
        self._before += steps
        self._last = (phase, self._before)


def _shown(root: Node) -> list[tuple[int, Node]]:
    """The stages shown: the root's children but the one-off first step, and their children."""
    shown = []
    for name, node in root.children.items():
        if name in ONE_OFF:
            continue
        shown.append((0, node))
        shown.extend((1, child) for child in node.children.values())
    return shown


def _total(node: Node) -> int:
    return int(node.stats.total_ns + sum(node.buf))


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class BottomPanel:
    """Lines kept at the bottom of a terminal: drawn with ANSI escape codes on ``stream`` (the terminal), erased
    before every write of the program to ``sys.stdout`` or ``sys.stderr`` and drawn again after each line it
    completes. Only the process that made it draws (a forked DataLoader worker writes straight through)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._pid = os.getpid()
        self._height = 0  # lines drawn now
        self._lines: list[str] = []
        self._streams: dict[str, _Through] = {}
        for name in ("stdout", "stderr"):
            original = getattr(sys, name)
            if _isatty(original):
                through = _Through(original, self)
                setattr(sys, name, through)
                self._streams[name] = through

    def show(self, lines: list[str]) -> None:
        self._lines = lines
        self._draw()

    def _draw(self) -> None:
        width = _width(self._stream)
        text = "".join(_fit(line, width) + "\n" for line in self._lines)
        self._raw(self._erase() + text)
        self._height = len(self._lines)

    def _erase(self) -> str:
        return f"\x1b[{self._height}F\x1b[J" if self._height else ""

    def _raw(self, text: str) -> None:
        """Written at once (one system call: a line-buffered stream makes one a line)."""
        stream = self._stream
        stream.flush()
        try:
            os.write(stream.fileno(), text.encode(getattr(stream, "encoding", None) or "utf-8", "replace"))
        except (AttributeError, ValueError, OSError):
            stream.write(text)
            stream.flush()

    def hide(self) -> None:
        """Before a write of the program: the panel is erased (the cursor is where it began)."""
        if self._height and os.getpid() == self._pid:
            self._raw(self._erase())
            self._height = 0

    def redraw(self) -> None:
        """After a line the program completed: the panel again, below it."""
        if self._lines and not self._height and os.getpid() == self._pid:
            self._draw()

    def release(self) -> None:
        """Leaves the panel on the screen and gives the program's streams back (those still ours)."""
        for name, through in self._streams.items():
            if getattr(sys, name) is through:
                setattr(sys, name, through.original)
        self._streams.clear()
        self._height = 0
        self._lines = []


class _Through:
    """``sys.stdout`` or ``sys.stderr`` while the panel is shown: each write passes through, around the panel."""

    def __init__(self, original: TextIO, panel: BottomPanel) -> None:
        self.original = original
        self._panel = panel

    def write(self, text: str) -> int:
        panel = self._panel
        panel.hide()
        written = self.original.write(text)
        if text.endswith("\n"):
            self.original.flush()
            panel.redraw()
        return written

    def flush(self) -> None:
        self.original.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.original, name)


def _width(stream: Any) -> int:
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        columns = 0
    return columns or 100  # a terminal that gives no size (a fresh pseudo-terminal)


def _fit(line: str, width: int) -> str:
    """A line cut to the terminal's width (a wrapped line would break the count of lines to erase)."""
    return line if len(line) < width else line[: max(width - 2, 1)] + "…"
