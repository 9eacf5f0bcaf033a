"""Each rank's time before the ranks synchronize, per step, in each ``gather_every`` window: what tells a
persistent straggler (one rank the slowest window after window: a bad node) from rotating noise.

At every gather a rank notes, from its own summary, how long a step of the main phase spent in the stages that
run before the ranks synchronize (:data:`~stepwatch._constants.PRE_SYNC`) since the previous gather. The list goes
into the rank's saved run (``metadata.windows``), so the all-ranks report compares the ranks window by window, from
a gather or from the per-rank files alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._constants import PRE_SYNC

if TYPE_CHECKING:
    from ._summary import Summary

MAX_WINDOWS = 10_000
"""Windows kept (the most recent); a window is one float."""


class Windows:
    """The windows of one stopwatch: the pre-synchronization seconds per step of each, oldest first."""

    def __init__(self) -> None:
        self.per_step: list[float] = []
        self._before = (0.0, 0)  # (pre-synchronization seconds, steps) at the previous gather

    def note(self, summary: Summary) -> None:
        """A gather: the window since the previous one (nothing when no step was measured in it)."""
        if not summary.phases:
            return
        phase = summary.main_phase
        seconds = sum(phase.stages[path].total for path in PRE_SYNC if path in phase.stages)
        before_seconds, before_steps = self._before
        if phase.steps < before_steps:  # the run was reset: start again
            before_seconds, before_steps = 0.0, 0
        self._before = (seconds, phase.steps)
        if phase.steps > before_steps:
            self.per_step.append((seconds - before_seconds) / (phase.steps - before_steps))
            del self.per_step[:-MAX_WINDOWS]
