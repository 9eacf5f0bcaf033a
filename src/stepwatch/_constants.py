"""Names and sizes that several modules share, defined once here. Imports nothing, so any module can use them."""

from __future__ import annotations

FOLD = 1024
"""Measurements buffered per stage before they are folded into the running statistics. The hot path compares
a buffer's length with it on every block's exit."""

DEFAULT_PHASE = "train"
"""The phase of a loop that names none: training."""
VAL_PHASE = "val"
"""The phase auto-instrumentation gives to evaluation loops and evaluation forwards."""

FIRST_BATCH = "first_batch"
"""Where the wait for the first item of each epoch goes, apart from the steady-state ``loader`` wait."""
FIRST_STEP = "first_step"
"""Where the body of the first step of each epoch goes: the whole first step (wait, body and counts) is a
one-off, reported apart from the steady state."""
ONE_OFF = (FIRST_BATCH, FIRST_STEP)
"""The first step of each epoch (its wait and its body), recorded apart from the loop's steady state."""

OTHER = "other"
"""Name of the synthetic child that holds the part of a parent stage no nested block covers."""
OVERFLOW = "(overflow)"
"""The row that collects the stages past :data:`MAX_STAGES` distinct ones."""
MAX_STAGES = 10_000
"""Distinct stages (and stage names) kept; more are folded into :data:`OVERFLOW`, so memory stays bounded."""

NS_PER_S = 1e9
