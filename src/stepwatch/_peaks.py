"""Dense peak FLOP/s of common accelerators per dtype, for MFU (model FLOPs utilization): what the device could do
at best, read against ``torch.cuda.get_device_name()`` and the dtype the step's matrix products ran in.

Figures are the vendors' dense (not 2:4-sparse) tensor-core peaks; a figure a datasheet does not give is left out
(no MFU then, unless ``peak_flops=`` is given).
"""

from __future__ import annotations

import math

PEAKS: tuple[tuple[str, dict[str, float]], ...] = (
    # NVIDIA A100 datasheet (SXM and PCIe alike): BF16/FP16 312 TF, TF32 156 TF, FP32 19.5 TF, dense
    ("A100", {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12}),
    # NVIDIA H100 datasheet, PCIe: BF16/FP16 756 TF, TF32 378 TF (the sparse figures halved), FP32 51 TF
    ("H100 PCIe", {"bf16": 756e12, "fp16": 756e12, "tf32": 378e12, "fp32": 51e12}),
    # NVIDIA H100 datasheet, NVL: BF16/FP16 835 TF, TF32 417.5 TF (sparse halved), FP32 60 TF
    ("H100 NVL", {"bf16": 835e12, "fp16": 835e12, "tf32": 417.5e12, "fp32": 60e12}),
    # NVIDIA H100 datasheet, SXM: BF16/FP16 989 TF, TF32 494.5 TF (sparse halved), FP32 67 TF
    ("H100", {"bf16": 989e12, "fp16": 989e12, "tf32": 494.5e12, "fp32": 67e12}),
    # NVIDIA H200 datasheet, NVL: as the H100 NVL's compute
    ("H200 NVL", {"bf16": 835e12, "fp16": 835e12, "tf32": 417.5e12, "fp32": 60e12}),
    # NVIDIA H200 datasheet, SXM: as the H100 SXM's compute (more and faster memory)
    ("H200", {"bf16": 989e12, "fp16": 989e12, "tf32": 494.5e12, "fp32": 67e12}),
    # NVIDIA HGX B200 datasheet, per GPU: BF16/FP16 2.25 PF, TF32 1.1 PF (sparse halved); FP32 not used here
    ("B200", {"bf16": 2250e12, "fp16": 2250e12, "tf32": 1100e12}),
    # NVIDIA L40S datasheet: BF16/FP16 362 TF, TF32 183 TF (sparse halved), FP32 91.6 TF
    ("L40S", {"bf16": 362e12, "fp16": 362e12, "tf32": 183e12, "fp32": 91.6e12}),
    # NVIDIA L4 datasheet: BF16/FP16 121 TF, TF32 60 TF (sparse halved), FP32 30.3 TF
    ("L4", {"bf16": 121e12, "fp16": 121e12, "tf32": 60e12, "fp32": 30.3e12}),
    # AMD Instinct MI300X datasheet: BF16/FP16 1307.4 TF, TF32 653.7 TF, FP32 (matrix) 163.4 TF, dense
    ("MI300X", {"bf16": 1307.4e12, "fp16": 1307.4e12, "tf32": 653.7e12, "fp32": 163.4e12}),
)
"""(a part of the device's name, peak FLOP/s per dtype), the more specific names first."""


def known_peak(device_name: str | None, dtype: str | None) -> tuple[float, str] | None:
    """The dense peak FLOP/s of ``device_name`` in ``dtype`` (``bf16``, ``fp16``, ``tf32``, ``fp32``) and how the
    report names it (``"H100 bf16"``), or None for an unknown device or dtype."""
    if not device_name or not dtype:
        return None
    name = device_name.upper()
    for part, peaks in PEAKS:
        if part.upper() in name:
            peak = peaks.get(dtype)
            return None if peak is None else (peak, f"{part} {dtype}")
    return None


def check_peak(value: object) -> float | None:
    """A peak in FLOP/s given by the user (``peak_flops=``): a positive finite number, or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"peak_flops must be a positive number of FLOP/s (e.g. 989e12), got {value!r}")
    return float(value)


def flops_text(value: float) -> str:
    """``2.1 TFLOP/s``-style: FLOPs with an SI prefix (no unit)."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}"
    return f"{value:.3g} "
