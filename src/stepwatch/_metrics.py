"""A run's current figures as one flat dict of numbers, for any logger (W&B, MLflow, TensorBoard, a progress
bar): ``stepwatch/<phase>/<figure>``. The keys are part of the public surface; the README lists them."""

from __future__ import annotations

from ._constants import ONE_OFF, OTHER
from ._mfu import flops_of
from ._summary import Summary

PREFIX = "stepwatch"


def flat_metrics(summary: Summary, prefix: str = PREFIX) -> dict[str, float]:
    """Per phase: ``steps``, ``time_per_step_ms`` (the loop's wait + step per step), ``input_share`` (the
    wait's share of the loop), ``<unit>_per_s`` per counter, ``flops_per_step``, ``flops_per_s`` and ``mfu``
    where FLOPs were counted (MFU against a known or given peak), ``device_idle_share`` where the device was
    timed, and ``<stage path>_ms`` (ms per call) for every stage of the steady state."""
    figures: dict[str, float] = {}
    for phase in summary.phases.values():
        base = f"{prefix}/{phase.name}"
        figures[f"{base}/steps"] = phase.steps
        if phase.steps:
            figures[f"{base}/time_per_step_ms"] = phase.measured / phase.steps * 1e3
        if "loader" in phase.stages and phase.loop_ns:
            figures[f"{base}/input_share"] = phase.share("loader")
        for unit, rate in phase.throughput.items():
            figures[f"{base}/{unit}_per_s"] = rate
        flops = flops_of(summary, phase)
        if flops is not None:
            figures[f"{base}/flops_per_step"] = flops.per_step
            figures[f"{base}/flops_per_s"] = flops.per_s
            if flops.mfu is not None:
                figures[f"{base}/mfu"] = flops.mfu
        device = phase.device
        if device.busy_ns + device.idle_ns:
            figures[f"{base}/device_idle_share"] = device.idle_ns / (device.busy_ns + device.idle_ns)
        for path, stage in phase.stages.items():
            if path.split("/", 1)[0] in ONE_OFF or path.rsplit("/", 1)[-1] == OTHER or not stage.calls:
                continue
            figures[f"{base}/{path}_ms"] = stage.total / stage.calls * 1e3
    return figures
