"""What torch.compile cost a run, from the compilations in its metadata (``_compile``): the report's line and, when
it is a significant share of the run, the verdict's advice. Reads a summary only."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._summary import Summary

SIGNIFICANT = 0.10
"""A share of the run's wall time past which the verdict names compiling."""
LISTED = 8
"""Recompilation steps named in the report's line."""


def compile_line(summary: Summary) -> str | None:
    """``torch.compile: 2 compilations, 3 recompilations (at steps 1, 57, 58): 11.2 s, 14% of the run``; None
    when nothing was compiled."""
    events = summary.metadata.get("compiles") or []
    if not events:
        return None
    seconds = sum(event[2] for event in events)
    recompiled = [event[0] for event in events if event[3]]
    text = f"torch.compile: {_count(len(events) - len(recompiled), 'compilation')}"
    if recompiled:
        named = [str(step) if step else "warm-up" for step in recompiled[:LISTED]]  # 0: a warm-up step's
        steps = ", ".join(named) + (", ..." if len(recompiled) > LISTED else "")
        at = "step" if len(recompiled) == 1 else "steps"
        text += f", {_count(len(recompiled), 'recompilation')} (at {at} {steps})"
    text += f": {seconds:.1f} s"
    if summary.elapsed:
        text += f", {seconds / summary.elapsed:.0%} of the run"
    return text + " (its own row, compile; taken out of the steps it ran in)"


def compile_advice(summary: Summary) -> str | None:
    """The verdict's advice when compiling is a significant share of the run."""
    events = summary.metadata.get("compiles") or []
    if not events or not summary.elapsed:
        return None
    recompiling = sum(event[2] for event in events if event[3]) / summary.elapsed
    compiling = sum(event[2] for event in events) / summary.elapsed
    if recompiling >= SIGNIFICANT:
        return (
            f"recompiling is {recompiling:.0%} of the run: look for changing shapes (a short last batch, sequence"
            " lengths that vary: pad them, drop_last=True, or torch._dynamo.mark_dynamic)"
        )
    if compiling >= SIGNIFICANT:
        return (
            f"compiling is {compiling:.0%} of the run: it is paid once, so a longer run amortizes it; the figures"
            " above leave it out"
        )
    return None


def _count(number: int, what: str) -> str:
    return f"{number} {what}" + ("" if number == 1 else "s")
