"""Names and sizes that several modules share, defined once here. Imports nothing, so any module can use them."""

from __future__ import annotations

FOLD = 1024
"""Measurements buffered per stage before they are folded into the running statistics. The hot path compares
a buffer's length with it on every block's exit; a power of two (the C paths keep its exponent, beside what an
exit reads: ``_speedups.configure``)."""

DEFAULT_PHASE = "train"
"""The phase of a loop that names none: training."""
VAL_PHASE = "val"
"""The phase auto-instrumentation gives to evaluation loops and evaluation forwards."""

FIRST_BATCH = "first_batch"
"""Where the wait for the first item of each epoch goes, apart from the steady-state ``loader`` wait."""
FIRST_STEP = "first_step"
"""Where the body of the first step of each epoch goes: the whole first step (wait, body and counts) is a
one-off, reported apart from the steady state."""
COMPILE = "compile"
"""Where torch.compile's compilations go (``_compile``), taken out of the blocks they ran in."""
ONE_OFF = (FIRST_BATCH, FIRST_STEP, COMPILE)
"""What is recorded apart from the loop's steady state: the first step of each epoch (its wait and its body) and
compilations."""

PRE_SYNC = ("loader", "step/h2d", "step/forward")
"""Stages that run before the ranks synchronize: a rank slow there holds everyone back."""

OTHER = "other"
"""Name of the synthetic child that holds the part of a parent stage no nested block covers."""
OVERFLOW = "(overflow)"
"""The row that collects the stages past :data:`MAX_STAGES` distinct ones."""
MAX_STAGES = 10_000
"""Distinct stages (and stage names) kept; more are folded into :data:`OVERFLOW`, so memory stays bounded."""

NS_PER_S = 1e9
