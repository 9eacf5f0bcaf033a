"""Achieved FLOP/s and MFU of a phase, from the FLOPs counted on one step (``_flops``) and the measured time per
step: the figures model trainers quote, beside the verdict. Reads a summary only."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._peaks import flops_text, known_peak

if TYPE_CHECKING:
    from ._summary import PhaseSummary, Summary

FORWARD_STAGES = ("step/forward", "step/loss")
BACKWARD_STAGE = "step/backward"


@dataclass(frozen=True)
class Flops:
    """A phase's FLOPs per step and what it achieved per second; MFU against ``peak`` when one is known."""

    per_step: float
    per_s: float
    forward_per_s: float | None
    backward_per_s: float | None
    at_step: int
    dtype: str | None
    device: str | None
    peak: float | None
    peak_name: str | None

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilization: achieved FLOP/s over the device's peak."""
        return None if not self.peak else self.per_s / self.peak

    def note(self) -> str:
        """What the verdict's first line carries: `` · 41% MFU (H100 bf16)`` or `` · 2.1 TFLOP/s``."""
        if self.mfu is not None:
            return f" · {percent(self.mfu)} MFU ({self.peak_name})"
        return f" · {flops_text(self.per_s)}FLOP/s"

    def describe(self) -> str:
        """The report's line."""
        parts = [f"{flops_text(self.per_step)}FLOP a step, counted on step {self.at_step} (kept out of the timing)"]
        rate = f"{flops_text(self.per_s)}FLOP/s"
        split = [
            f"{name} {flops_text(value)}FLOP/s"
            for name, value in (("forward", self.forward_per_s), ("backward", self.backward_per_s))
            if value is not None
        ]
        if split:
            rate += f" ({', '.join(split)})"
        parts.append(rate)
        if self.mfu is not None:
            parts.append(f"{percent(self.mfu)} MFU of {self.peak_name} ({flops_text(self.peak or 0)}FLOP/s)")
        elif self.device is None:
            parts.append("no MFU on a CPU (give peak_flops= to read it against a peak)")
        else:
            parts.append(f"no MFU: no known peak for {self.device} in {self.dtype} (give peak_flops=)")
        return "FLOPs: " + "; ".join(parts)


def percent(share: float) -> str:
    """A share as the report shows MFU: whole percents from 10%, two significant digits below (0.014%,
    0.000057%), never in exponent notation, so that the figure reads the same way at any size."""
    if share >= 0.1:
        return f"{share:.0%}"
    value = share * 100
    if not value > 0 or math.isinf(value):
        return f"{value:.2g}%"
    return f"{value:.{max(0, 1 - math.floor(math.log10(value)))}f}%"


def flops_of(summary: Summary, phase: PhaseSummary) -> Flops | None:
    """The phase's FLOP figures, or None when no step of it was counted or it measured no step."""
    record: Any = (summary.metadata.get("flops") or {}).get(phase.name)
    if not record or not phase.steps or not phase.measured_ns:
        return None
    per_step = float(record["step"])
    per_s = per_step / (phase.measured / phase.steps)
    forward_s = sum(phase.stages[path].total for path in FORWARD_STAGES if path in phase.stages) / phase.steps
    backward_s = phase.stages[BACKWARD_STAGE].total / phase.steps if BACKWARD_STAGE in phase.stages else 0.0
    forward = float(record["forward"]) / forward_s if forward_s and record["forward"] else None
    backward = float(record["backward"]) / backward_s if backward_s and record["backward"] else None
    given = summary.metadata.get("peak_flops")
    found = known_peak(record.get("device"), record.get("dtype"))
    if given:
        peak, name = float(given), f"the given peak, {record.get('dtype') or 'any dtype'}"
    elif found is not None:
        peak, name = found
    else:
        peak, name = None, None
    return Flops(
        per_step,
        per_s,
        forward,
        backward,
        int(record["at_step"]),
        record.get("dtype"),
        record.get("device"),
        peak,
        name,
    )
