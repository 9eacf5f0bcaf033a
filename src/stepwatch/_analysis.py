"""Analysis: from a summary to a verdict (what bounds the training, why, what to do) and run comparisons.

Reads a :class:`~stepwatch._summary.Summary` only. The verdict looks at the steady state of the main phase
(``train``): warm-up steps, the first batch of each epoch (``first_batch``) and the validation phase are
recorded apart and do not move it.

Rules, in order (the thresholds are TensorFlow's Input Pipeline Analyzer's):

- **input-bound** when the share of time spent waiting for data is above ``HIGHLY`` (20%: "highly") or
  ``MODERATELY`` (5%: "moderately"). On a GPU that share is the device's idle time between steps; on the CPU
  it is the ``loader`` wait's share of the loop.
- **host-bound** (GPU only) when the device is rarely idle between steps, yet in at least ``HOST_BOUND`` (50%)
  of the steps it had already finished all the work issued at every stage boundary of the step and at its end:
  it sat waiting on the CPU issuing work all step long. A loop that synchronizes at each step's end
  (``loss.item()``) empties the device's queue there by construction; its device was behind at the stages
  before, busy, so it is compute-bound, not host-bound.
- **compute-bound** when the device is busy (GPU), or on the CPU when the step's computation fills at least
  ``COMPUTE`` (50%) of the loop: the step body, less its stages named as other work (copies to the device,
  logging, checkpoints). Stage names never make a step compute; they can only take work out of it.
- **balanced** otherwise: no single cause dominates; the largest stage is named.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ._advice import BODY, MODERATELY, WAIT, common_advice, input_advice
from ._compile_report import compile_advice
from ._constants import DEFAULT_PHASE
from ._mfu import flops_of

if TYPE_CHECKING:
    from ._figures import StageStats
    from ._summary import PhaseSummary, Summary

HIGHLY = 0.20
HOST_BOUND = 0.50
COMPUTE = 0.50
_NOT_COMPUTE_NAMES = re.compile(
    r"h2d|to_device|copy|transfer|to_gpu|to_cuda|log|checkpoint|save|metric|print|callback", re.IGNORECASE
)


@dataclass(frozen=True)
class Verdict:
    """What bounds the training, in one line with its numbers, and advice that follows from the figures."""

    kind: str
    """``input-bound``, ``host-bound``, ``compute-bound``, ``balanced`` or ``unknown``."""
    degree: str | None
    """``highly`` or ``moderately`` for input-bound; None otherwise."""
    headline: str
    advice: tuple[str, ...] = ()
    figures: Mapping[str, float] = field(default_factory=dict)
    """The numbers behind it: input_share, compute_share, device_idle_share, caught_up_share,
    workers_needed, ... (only those measured)."""

    @property
    def label(self) -> str:
        return f"{self.degree} {self.kind}" if self.degree else self.kind

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "degree": self.degree,
            "headline": self.headline,
            "advice": list(self.advice),
            "figures": {name: None if math.isnan(value) else value for name, value in self.figures.items()},
            "thresholds": {"highly": HIGHLY, "moderately": MODERATELY, "host_bound": HOST_BOUND, "compute": COMPUTE},
        }


def analyze(summary: Summary) -> Verdict:
    """The verdict on the main phase of ``summary``; with FLOPs counted, its achieved FLOP/s (and MFU against
    a known peak) beside the kind: ``compute-bound · 41% MFU (H100 bf16): ...``."""
    verdict = _verdict(summary)
    compiling = compile_advice(summary)
    if compiling is not None:
        verdict = replace(verdict, advice=(compiling, *verdict.advice))
    flops = flops_of(summary, summary.main_phase) if verdict.kind != "unknown" else None
    if flops is None:
        return verdict
    figures = {**verdict.figures, "flops_per_s": flops.per_s}
    if flops.mfu is not None:
        figures["mfu"] = flops.mfu
    label, _, rest = verdict.headline.partition(":")
    return replace(verdict, headline=f"{label}{flops.note()}:{rest}", figures=figures)


def _verdict(summary: Summary) -> Verdict:
    phase = summary.main_phase
    stages = phase.stages
    if BODY not in stages or not phase.measured_ns:
        return Verdict("unknown", None, "unknown: no training loop measured (use timed_iter or watch)")
    figures: dict[str, float] = {}
    input_share = phase.share(WAIT) if WAIT in stages else 0.0
    figures["input_share"] = input_share
    compute = _compute_share(phase)
    figures["compute_share"] = compute
    on_device = phase.device.steps > 0
    if on_device:
        figures["device_idle_share"] = phase.device.idle_share
        figures["caught_up_share"] = phase.device.caught_up_share
    advice: list[str] = []
    cores = int(summary.metadata.get("cpu_count") or 0)
    config: Mapping[str, Any] = (summary.metadata.get("loaders") or {}).get(phase.name) or {}
    gpu = any(str(device).startswith("cuda") for device in summary.metadata.get("devices") or ())

    waiting = phase.device.idle_share if on_device else input_share
    if waiting > MODERATELY:
        degree = "highly" if waiting > HIGHLY else "moderately"
        if on_device:
            why = (
                f"the GPU sat idle {waiting:.1%} of its time between steps"
                f" (the loop waited for data {input_share:.1%} of the time)"
            )
        else:
            why = f"the loop waited for data {input_share:.1%} of the time"
        headline = f"{degree} input-bound: {why} (thresholds: highly > {HIGHLY:.0%}, moderately > {MODERATELY:.0%})"
        advice.extend(input_advice(phase, figures, cores, on_device, config, gpu))
        return Verdict("input-bound", degree, headline, tuple(advice + common_advice(phase, config)), figures)

    if on_device and phase.device.caught_up_share >= HOST_BOUND:
        headline = (
            f"host-bound: in {phase.device.caught_up_share:.0%} of the steps the GPU had already finished all the"
            f" work issued at every stage boundary and at the step's end, so it waits on the CPU issuing work"
            f" (threshold: {HOST_BOUND:.0%} of the steps; GPU idle between steps: {phase.device.idle_share:.1%})"
        )
        advice.append(
            "cut the CPU's per-step cost of issuing work: a larger batch, torch.compile or CUDA graphs; look for"
            " Python work between kernels in the slowest stages"
        )
        return Verdict("host-bound", None, headline, tuple(advice + common_advice(phase, config)), figures)

    if on_device:
        headline = (
            f"compute-bound: the GPU was busy {1 - phase.device.idle_share:.1%} of its time between steps"
            f" (the loop waited for data {input_share:.1%} of the time)"
        )
        advice.append(
            "the device is the limit: mixed precision, torch.compile or a more efficient model; the data"
            " pipeline keeps up"
        )
        return Verdict("compute-bound", None, headline, tuple(advice + common_advice(phase, config)), figures)

    if compute >= COMPUTE:
        headline = (
            f"compute-bound: the step's computation fills {compute:.1%} of the loop"
            f" (the loop waited for data {input_share:.1%} of the time)"
        )
        advice.append(
            "the model's own compute is the limit: optimize it (torch.compile, a smaller or quantized model) or"
            " use an accelerator; the data pipeline keeps up"
        )
        return Verdict("compute-bound", None, headline, tuple(advice + common_advice(phase, config)), figures)

    largest = _largest_part(phase)
    headline = f"balanced: no single cause dominates (data wait {input_share:.1%}, computation {compute:.1%})"
    if largest is not None:
        headline += f"; the largest part is {largest.path} at {phase.share(largest.path):.1%}"
    return Verdict("balanced", None, headline, tuple(advice + common_advice(phase, config)), figures)


def _compute_share(phase: PhaseSummary) -> float:
    """The step's share of the loop, less its stages named as something other than computing (copies to the
    device, logging, checkpoints): the step body is compute unless the user's stages say otherwise."""
    step = phase.share(BODY) if BODY in phase.stages else 0.0
    other_work = sum(
        phase.share(stage.path)
        for stage in phase.stages.values()
        if stage.depth == 1 and stage.path.startswith(f"{BODY}/") and _NOT_COMPUTE_NAMES.search(stage.name)
    )
    return max(step - other_work, 0.0)


def _largest_part(phase: PhaseSummary) -> StageStats | None:
    parts = [s for s in phase.stages.values() if s.path == WAIT or (s.depth == 1 and s.path.startswith(f"{BODY}/"))]
    return max(parts, key=lambda s: s.total_ns, default=None)


# -- comparing runs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageChange:
    path: str
    before: float | None
    """Seconds per call before; None if the stage is only in the later run."""
    after: float | None

    @property
    def delta(self) -> float | None:
        return None if self.before is None or self.after is None else self.after - self.before

    @property
    def percent(self) -> float | None:
        if self.before is None or self.after is None or not self.before:
            return None
        return (self.after - self.before) / self.before * 100


@dataclass(frozen=True)
class Comparison:
    """Two runs side by side, one phase (the same in both): per stage ms/call, the time per step, throughput,
    and the verdicts when the phase is each run's main phase."""

    stages: tuple[StageChange, ...]
    step: StageChange
    """Loop time per step (data wait + step), the figure a training run's speed comes down to."""
    throughput: Mapping[str, tuple[float | None, float | None]]
    verdicts: tuple[Verdict, Verdict] | None
    phase: str = DEFAULT_PHASE

    def slower_than(self, percent: float, names: Sequence[str] = ()) -> list[str]:
        """What got slower by more than ``percent``: the step time, and each stage in ``names`` (a path like
        ``step/forward`` or a bare name matching any path that ends with it)."""
        failures = []
        if self.step.percent is not None and self.step.percent > percent:
            failures.append(f"time per step {self.step.percent:+.1f}%")
        for name in names:
            for change in self.stages:
                matches = change.path == name or change.path.endswith(f"/{name}")
                if matches and change.percent is not None and change.percent > percent:
                    failures.append(f"{change.path} {change.percent:+.1f}%")
        return failures


def common_phases(before: Summary, after: Summary) -> list[str]:
    """The phases both runs measured, the main one (``train``) first: compared like with like."""
    names = [name for name in before.phases if name in after.phases]
    return sorted(names, key=lambda name: name != DEFAULT_PHASE)


def compare(before: Summary, after: Summary, phase: str | None = None) -> Comparison:
    """``phase`` of both runs (default: the first of :func:`common_phases`, else each run's main phase)."""
    if phase is None:
        common = common_phases(before, after)
        phase = common[0] if common else before.main_phase.name
    a, b = before.phase_or_empty(phase), after.phase_or_empty(phase)
    paths = merged_order(list(a.stages), list(b.stages))
    changes = tuple(StageChange(path, _mean(a, path), _mean(b, path)) for path in paths)
    step = StageChange("time per step", _per_step(a), _per_step(b))
    units = list(a.throughput) + [u for u in b.throughput if u not in a.throughput]
    throughput = {unit: (a.throughput.get(unit), b.throughput.get(unit)) for unit in units}
    main = phase == before.main_phase.name == after.main_phase.name
    return Comparison(changes, step, throughput, (analyze(before), analyze(after)) if main else None, phase)


def merged_order(first: list[str], second: list[str]) -> list[str]:
    """The stage paths of two runs in one report order: the first run's, and each path only the second has
    placed after its parent's rows (a stage one run lacks sits under its parent, not at the end)."""
    order = list(first)
    known = set(order)
    for path in second:
        if path in known:
            continue
        parent = path.rsplit("/", 1)[0] if "/" in path else None
        position = len(order)
        if parent is not None:
            below = [i for i, other in enumerate(order) if other == parent or other.startswith(f"{parent}/")]
            if below:
                position = below[-1] + 1
                # its siblings' ``other`` row stays last among them
                if order[below[-1]] == f"{parent}/other" and not path.endswith("/other"):
                    position = below[-1]
        order.insert(position, path)
        known.add(path)
    return order


def _mean(phase: PhaseSummary, path: str) -> float | None:
    return phase.stages[path].mean if path in phase.stages else None


def _per_step(phase: PhaseSummary) -> float | None:
    return phase.measured / phase.steps if phase.steps else None
