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
from dataclasses import dataclass, field
from typing import Any

from ._summary import PhaseSummary, StageStats, Summary

HIGHLY = 0.20
MODERATELY = 0.05
HOST_BOUND = 0.50
COMPUTE = 0.50
WAIT, BODY, FIRST = "loader", "step", "first_batch"
_COPY_NAMES = re.compile(r"h2d|to_device|copy|transfer|to_gpu|to_cuda", re.IGNORECASE)
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
    """The verdict on the main phase of ``summary``."""
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
        advice.extend(_input_advice(phase, figures, cores, on_device, config, gpu))
        return Verdict("input-bound", degree, headline, tuple(advice + _common_advice(phase, config)), figures)

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
        return Verdict("host-bound", None, headline, tuple(advice + _common_advice(phase, config)), figures)

    if on_device:
        headline = (
            f"compute-bound: the GPU was busy {1 - phase.device.idle_share:.1%} of its time between steps"
            f" (the loop waited for data {input_share:.1%} of the time)"
        )
        advice.append(
            "the device is the limit: mixed precision, torch.compile or a more efficient model; the data"
            " pipeline keeps up"
        )
        return Verdict("compute-bound", None, headline, tuple(advice + _common_advice(phase, config)), figures)

    if compute >= COMPUTE:
        headline = (
            f"compute-bound: the step's computation fills {compute:.1%} of the loop"
            f" (the loop waited for data {input_share:.1%} of the time)"
        )
        advice.append(
            "the model's own compute is the limit: optimize it (torch.compile, a smaller or quantized model) or"
            " use an accelerator; the data pipeline keeps up"
        )
        return Verdict("compute-bound", None, headline, tuple(advice + _common_advice(phase, config)), figures)

    largest = _largest_part(phase)
    headline = f"balanced: no single cause dominates (data wait {input_share:.1%}, computation {compute:.1%})"
    if largest is not None:
        headline += f"; the largest part is {largest.path} at {phase.share(largest.path):.1%}"
    return Verdict("balanced", None, headline, tuple(advice + _common_advice(phase, config)), figures)


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


def _input_advice(
    phase: PhaseSummary, figures: dict[str, float], cores: int, on_device: bool, config: Mapping[str, Any], gpu: bool
) -> list[str]:
    advice: list[str] = []
    step = phase.stages[BODY]
    step_s = step.mean
    if on_device and step.device is not None:
        step_s = max(step_s, step.device.mean)  # the loop can take a batch this often
    workers = phase.workers
    configured = config.get("num_workers")
    worker_stages = [s for s in phase.stages.values() if s.in_workers and s.depth >= 1 and s.name != "other"]
    needed: int | None = None
    current = configured if isinstance(configured, int) else len(workers)
    if workers:
        batches = sum(w.batches for w in workers.values())
        busy_per_batch = sum(w.busy_ns for w in workers.values()) / batches / 1e9 if batches else math.nan
        utilization = sum(w.busy_ns for w in workers.values()) / max(sum(w.wall_ns for w in workers.values()), 1)
        figures["worker_busy_per_batch_s"] = busy_per_batch
        figures["worker_utilization"] = utilization
        rate = f"each batch takes a worker {busy_per_batch * 1e3:.1f} ms, the step {step_s * 1e3:.1f} ms"
        if step_s > 0 and not math.isnan(busy_per_batch):
            needed = math.ceil(busy_per_batch / step_s)
            figures["workers_needed"] = needed
        if utilization < 0.7:  # the workers are not the limit: more of them would not help
            advice.append(
                f"the {current} workers are busy only {utilization:.0%} of their time while the loop waits:"
                + ("" if _at_least(config.get("prefetch_factor"), 4) else " raise prefetch_factor, and")
                + " look for cost outside the workers (the main process receiving large batches, pin_memory)"
            )
            needed = None
    elif WAIT in phase.stages and step_s > 0:
        wait_s = phase.stages[WAIT].mean
        # with workers but no per-worker figures (timed_iter over the loader), they give a batch per wait+step
        needed = math.ceil(current * (wait_s + step_s) / step_s) if current else max(1, math.ceil(wait_s / step_s))
        rate = f"the wait is {wait_s * 1e3:.1f} ms per batch, the step {step_s * 1e3:.1f} ms"
    if needed is not None:
        figures.setdefault("workers_needed", needed)
        text = _workers_advice(needed, current, cores, config.get("torch_threads"), not gpu and not on_device, rate)
        if text:
            advice.append(text)
    slowest = max(worker_stages or _main_pipeline_stages(phase), key=lambda s: s.total_ns, default=None)
    if slowest is not None:
        where = "in the workers" if slowest.in_workers else "in the loader"
        advice.append(
            f"the slowest part of the pipeline is {slowest.path} ({slowest.mean * 1e3:.2f} ms per call,"
            f" {slowest.calls:,} calls {where}): make it cheaper"
            + (", or move it to the GPU, after the batch is on the device" if on_device else "")
        )
    return advice


def _at_least(value: Any, limit: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= limit


def _workers_advice(needed: int, current: int, cores: int, threads: Any, cpu_only: bool, rate: str) -> str | None:
    """One recommendation about the number of workers, with its reason; never fewer than configured."""
    if needed <= current:
        return None
    spare = max(cores - 1, 0) if cores else None  # one core stays with the training process
    if spare is not None and spare <= current:
        return (
            f"the pipeline would need {needed} workers to keep up ({rate}), and this {cores}-core machine has no"
            f" core to spare beyond the {current} it runs: make the pipeline cheaper"
        )
    target = needed if spare is None else min(needed, spare)
    if cpu_only:
        plural = "" if threads == 1 else "s"
        computing = f"torch's {threads} compute thread{plural}" if isinstance(threads, int) else "torch's threads"
        text = f"try num_workers={target} (now {current})"
        if isinstance(threads, int) and cores and threads + target > cores:
            text += f" with torch.set_num_threads({max(cores - target, 1)})"
        return (
            f"{text}: on the CPU, workers share the {cores or 'available'} cores with {computing}, so keep it only"
            f" if `stepwatch compare` shows a shorter time per step ({rate}; {needed} workers would hide the wait)"
        )
    if target == needed:
        return f"use DataLoader(num_workers={target}) (now {current}): {rate}"
    return (
        f"use DataLoader(num_workers={target}) (now {current}), the most this {cores}-core machine can spare beside"
        f" the training process; hiding the wait fully would take {needed} ({rate}), so also make the pipeline"
        " cheaper"
    )


def _main_pipeline_stages(phase: PhaseSummary) -> list[StageStats]:
    return [s for s in phase.stages.values() if s.path.startswith(f"{WAIT}/") and s.name != "other"]


def _common_advice(phase: PhaseSummary, config: Mapping[str, Any]) -> list[str]:
    advice = []
    first, wait = phase.stages.get(FIRST), phase.stages.get(WAIT)
    persistent = config.get("persistent_workers") is True
    slow_start = first is not None and wait is not None and first.mean > max(5 * wait.mean, 0.05)
    if first is not None and wait is not None and slow_start and phase.workers and not persistent:
        advice.append(
            f"each epoch's first batch waits {first.mean * 1e3:.0f} ms (workers starting), against"
            f" {wait.mean * 1e3:.1f} ms for the others: persistent_workers=True keeps the workers between epochs"
        )
    for stage in phase.stages.values():
        if stage.depth == 1 and stage.path.startswith(f"{BODY}/") and _COPY_NAMES.search(stage.name):
            share = phase.share(stage.path)
            if share >= MODERATELY:
                pinned = config.get("pin_memory") is True
                advice.append(
                    f"host-to-device copies ({stage.path}) take {share:.1%} of the loop: "
                    + (
                        ".to(device, non_blocking=True) (pin_memory is already on)"
                        if pinned
                        else "pin_memory=True in the DataLoader and .to(device, non_blocking=True)"
                    )
                )
    return advice


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
    phase: str = "train"

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
    return sorted(names, key=lambda name: name != "train")


def compare(before: Summary, after: Summary, phase: str | None = None) -> Comparison:
    """``phase`` of both runs (default: the first of :func:`common_phases`, else each run's main phase)."""
    if phase is None:
        common = common_phases(before, after)
        phase = common[0] if common else before.main_phase.name
    empty = PhaseSummary(phase, {}, {}, 0, 0)
    a, b = before.phases.get(phase, empty), after.phases.get(phase, empty)
    paths = list(a.stages) + [p for p in b.stages if p not in a.stages]
    changes = tuple(StageChange(path, _mean(a, path), _mean(b, path)) for path in paths)
    step = StageChange("time per step", _per_step(a), _per_step(b))
    units = list(a.throughput) + [u for u in b.throughput if u not in a.throughput]
    throughput = {unit: (a.throughput.get(unit), b.throughput.get(unit)) for unit in units}
    main = phase == before.main_phase.name == after.main_phase.name
    return Comparison(changes, step, throughput, (analyze(before), analyze(after)) if main else None, phase)


def _mean(phase: PhaseSummary, path: str) -> float | None:
    return phase.stages[path].mean if path in phase.stages else None


def _per_step(phase: PhaseSummary) -> float | None:
    return phase.measured / phase.steps if phase.steps else None
