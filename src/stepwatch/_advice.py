"""Advice that follows from a phase's figures: the input pipeline (workers, prefetching, the slowest part),
persistent workers, pinned copies. Called by :func:`stepwatch._analysis.analyze`; reads a summary only.

The number of workers advised comes from the workers' own figures: how long a batch takes a worker against how
long the step takes, and how much of a worker's busy time needs a core: its process's CPU clock against its
wall time per batch, plus the time it was runnable but waiting for a core (the kernel's scheduler statistics,
so that workers starved of cores are not taken for workers waiting on I/O). Workers that mostly wait (I/O, a
remote read, ``sleep``) are not limited by the cores, so more of them help beyond the machine's spare cores;
workers that compute share the cores with training.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._constants import FIRST_BATCH

if TYPE_CHECKING:
    from ._figures import StageStats
    from ._summary import PhaseSummary

MODERATELY = 0.05
"""A share of the loop above which a cause is worth acting on (TensorFlow's "moderately")."""
WAITING_WORKERS = 0.5
"""Workers that need a core (computing, or runnable and waiting for one) for less than this share of their
busy time mostly wait (I/O, a remote read, ``sleep``): cores do not limit them."""
WAIT, BODY, FIRST = "loader", "step", FIRST_BATCH
_COPY_NAMES = re.compile(r"h2d|to_device|copy|transfer|to_gpu|to_cuda", re.IGNORECASE)


def plural(count: int, noun: str) -> str:
    """``1 worker``, ``2 workers``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def input_advice(
    phase: PhaseSummary, figures: dict[str, float], cores: int, on_device: bool, config: Mapping[str, Any], gpu: bool
) -> list[str]:
    """Advice for an input-bound phase: how many workers, why, and the slowest part of the pipeline. A number
    of workers is said to be the current one ("now N") only when the loader's configuration is known."""
    advice: list[str] = []
    step = phase.stages[BODY]
    step_s = step.mean
    if on_device and step.device is not None:
        step_s = max(step_s, step.device.mean)  # the loop can take a batch this often
    workers = phase.workers
    configured = config.get("num_workers")
    known = isinstance(configured, int) and not isinstance(configured, bool)
    worker_stages = [s for s in phase.stages.values() if s.in_workers and s.depth >= 1 and s.name != "other"]
    needed: int | None = None
    current = int(configured or 0) if known else len(workers)
    waiting = math.nan
    if workers:
        batches = sum(w.batches for w in workers.values())
        busy_per_batch = sum(w.busy_ns for w in workers.values()) / batches / 1e9 if batches else math.nan
        utilization = sum(w.busy_ns for w in workers.values()) / max(sum(w.wall_ns for w in workers.values()), 1)
        figures["worker_busy_per_batch_s"] = busy_per_batch
        figures["worker_utilization"] = utilization
        measured = [w for w in workers.values() if w.cpu_ns >= 0]
        if measured and sum(w.busy_ns for w in measured):
            busy = sum(w.busy_ns for w in measured)
            figures["worker_cpu_share"] = min(sum(w.cpu_ns for w in measured) / busy, 1.0)
            # a core was needed while computing, and while runnable but waiting for one (oversubscribed cores)
            queued = sum(max(w.queued_ns, 0) for w in measured)
            figures["worker_queued_share"] = min(queued / busy, 1.0)
            waiting = min((sum(w.cpu_ns for w in measured) + queued) / busy, 1.0)
        rate = f"each batch takes a worker {busy_per_batch * 1e3:.1f} ms, the step {step_s * 1e3:.1f} ms"
        if not math.isnan(waiting):
            rate += f"; a worker needs a core {waiting:.0%} of its busy time"
        if step_s > 0 and not math.isnan(busy_per_batch):
            needed = math.ceil(busy_per_batch / step_s)
            figures["workers_needed"] = needed
        if utilization < 0.7:  # the workers are not the limit: more of them would not help
            seen = plural(current, "worker") if known else f"{plural(len(workers), 'worker')} seen"
            advice.append(
                f"the {seen} {'is' if current == 1 and known else 'are'} busy only {utilization:.0%} of their time"
                " while the loop waits:"
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
        cpu_only = not gpu and not on_device
        mostly_waiting = not math.isnan(waiting) and waiting < WAITING_WORKERS
        text = _workers_advice(
            needed, current if known else None, cores, config.get("torch_threads"), cpu_only, rate, mostly_waiting
        )
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


def _workers_advice(
    needed: int, current: int | None, cores: int, threads: Any, cpu_only: bool, rate: str, waiting: bool
) -> str | None:
    """One recommendation about the number of workers, with its reason; never fewer than configured.
    ``current`` is None when the loader's configuration is unknown; ``waiting``: the workers mostly wait
    (little of their busy time on the CPU), so the machine's cores do not cap how many help."""
    now = f" (now {current})" if current is not None else ""
    if needed <= (current or 0):
        return None
    if waiting:
        return (
            f"use DataLoader(num_workers={needed}){now}: the workers mostly wait rather than compute (I/O, a remote"
            f" read, sleep), so more workers than cores help ({rate})"
        )
    spare = max(cores - 1, 0) if cores else None  # one core stays with the training process
    if spare is not None and current is not None and spare <= current:
        return (
            f"the pipeline would need {plural(needed, 'worker')} to keep up ({rate}), and this {cores}-core machine"
            f" has no core to spare beyond the {current} it runs: make the pipeline cheaper"
        )
    target = needed if spare is None else max(min(needed, spare), 1)
    if cpu_only:
        computing = f"torch's {plural(threads, 'compute thread')}" if isinstance(threads, int) else "torch's threads"
        text = f"try num_workers={target}{now}"
        if isinstance(threads, int) and cores and threads + target > cores:
            text += f" with torch.set_num_threads({max(cores - target, 1)})"
        return (
            f"{text}: on the CPU, workers share the {cores or 'available'} cores with {computing}, so keep it only"
            f" if `stepwatch compare` shows a shorter time per step ({rate}; {plural(needed, 'worker')} would hide"
            " the wait)"
        )
    if target == needed:
        return f"use DataLoader(num_workers={target}){now}: {rate}"
    return (
        f"use DataLoader(num_workers={target}){now}, the most this {cores}-core machine can spare beside the"
        f" training process; hiding the wait fully would take {needed} ({rate}), so also make the pipeline cheaper"
    )


def _main_pipeline_stages(phase: PhaseSummary) -> list[StageStats]:
    return [s for s in phase.stages.values() if s.path.startswith(f"{WAIT}/") and s.name != "other"]


def common_advice(phase: PhaseSummary, config: Mapping[str, Any]) -> list[str]:
    """Advice for any verdict: persistent workers, when the run shows the cost they save (more than one epoch
    or iterator start whose first batch waited: one endless epoch starts its workers once), and pinned
    copies."""
    advice = []
    first, wait = phase.stages.get(FIRST), phase.stages.get(WAIT)
    persistent = config.get("persistent_workers") is True
    restarts = first.calls - 1 if first is not None else 0
    slow_start = first is not None and wait is not None and first.mean > max(5 * wait.mean, 0.05)
    if first is not None and wait is not None and slow_start and restarts and phase.workers and not persistent:
        advice.append(
            f"each epoch's first batch waits {first.mean * 1e3:.0f} ms (workers starting; {first.calls} epochs or"
            f" iterator starts), against {wait.mean * 1e3:.1f} ms for the others: persistent_workers=True keeps"
            " the workers between epochs"
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
