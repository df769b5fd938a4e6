"""Dense peak FLOP/s of common NVIDIA GPUs per compute precision, for MFU.

The figures are the vendors' *dense* tensor-core peaks (datasheets quote "with sparsity"
figures that are twice as large; those are never reached by dense training). Sources:
V100, A100, A10, L4, L40S, H100, H200 and HGX B200 datasheets and the Ada architecture
whitepaper (RTX 4090, with FP32 accumulate as mixed-precision training uses).

Matching is by whole words of ``torch.cuda.get_device_name()``, most specific pattern first,
so ``"NVIDIA L40S"`` is an L40S (not an L4) and ``"NVIDIA H100 PCIe"`` is not an H100 SXM.
"""

from __future__ import annotations

import re
from typing import Literal

__all__ = [
    "PEAK_FLOPS",
    "Dtype",
    "chip_of",
    "dtype_of_precision",
    "peak_flops",
]

Dtype = Literal["fp32", "tf32", "bf16", "fp16"]

_T = 1e12
# chip -> dtype -> dense peak FLOP/s. A dtype the chip has no tensor cores for is absent.
PEAK_FLOPS: dict[str, dict[Dtype, float]] = {
    "v100 sxm": {"fp32": 15.7 * _T, "fp16": 125 * _T},
    "v100 pcie": {"fp32": 14.0 * _T, "fp16": 112 * _T},
    "v100s": {"fp32": 16.4 * _T, "fp16": 130 * _T},
    "a100": {"fp32": 19.5 * _T, "tf32": 156 * _T, "bf16": 312 * _T, "fp16": 312 * _T},
    "a10g": {"fp32": 31.2 * _T, "tf32": 62.5 * _T, "bf16": 125 * _T, "fp16": 125 * _T},
    "l4": {"fp32": 30.3 * _T, "tf32": 60 * _T, "bf16": 121 * _T, "fp16": 121 * _T},
    "l40s": {"fp32": 91.6 * _T, "tf32": 183 * _T, "bf16": 362.05 * _T, "fp16": 362.05 * _T},
    "rtx 4090": {"fp32": 82.6 * _T, "tf32": 82.6 * _T, "bf16": 165.2 * _T, "fp16": 165.2 * _T},
    "h100 sxm": {"fp32": 66.9 * _T, "tf32": 494.7 * _T, "bf16": 989.4 * _T, "fp16": 989.4 * _T},
    "h100 pcie": {"fp32": 51.2 * _T, "tf32": 378 * _T, "bf16": 756 * _T, "fp16": 756 * _T},
    "h100 nvl": {"fp32": 60 * _T, "tf32": 417.5 * _T, "bf16": 835.5 * _T, "fp16": 835.5 * _T},
    "h200 sxm": {"fp32": 66.9 * _T, "tf32": 494.7 * _T, "bf16": 989.4 * _T, "fp16": 989.4 * _T},
    "h200 nvl": {"fp32": 60 * _T, "tf32": 417.5 * _T, "bf16": 835.5 * _T, "fp16": 835.5 * _T},
    "b200": {"fp32": 75 * _T, "tf32": 1125 * _T, "bf16": 2250 * _T, "fp16": 2250 * _T},
}

# (pattern over the lower-cased device name, chip); the first match wins.
_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"\bb200\b", "b200"),
    (r"\bh200\b.*\bnvl\b", "h200 nvl"),
    (r"\bh200\b", "h200 sxm"),
    (r"\bh100\b.*\bnvl\b", "h100 nvl"),
    (r"\bh100\b.*\bpcie\b", "h100 pcie"),
    (r"\bh100\b", "h100 sxm"),  # "NVIDIA H100 80GB HBM3" is the SXM part
    (r"\ba100\b", "a100"),
    (r"\ba10g\b", "a10g"),
    (r"\bl40s\b", "l40s"),
    (r"\bl4\b", "l4"),
    (r"\brtx 4090\b", "rtx 4090"),
    (r"\bv100s\b", "v100s"),
    (r"\bv100\b.*\bpcie\b", "v100 pcie"),
    (r"\bv100\b", "v100 sxm"),
)


def chip_of(device_name: str) -> str | None:
    """Return the :data:`PEAK_FLOPS` key for a ``torch.cuda.get_device_name()``, or None.

    Example:
        >>> chip_of("NVIDIA L40S"), chip_of("NVIDIA L4"), chip_of("NVIDIA H100 PCIe")
        ('l40s', 'l4', 'h100 pcie')
    """
    name = device_name.lower().replace("-", " ").replace("_", " ")
    for pattern, chip in _PATTERNS:
        if re.search(pattern, name):
            return chip
    return None


def dtype_of_precision(precision: str | int, float32_matmul_precision: str = "highest") -> Dtype:
    """Return the compute dtype of a Trainer ``precision`` (``"bf16-mixed"``, ``"32-true"``, ...).

    FP32 runs on TF32 tensor cores when ``torch.get_float32_matmul_precision()`` is not
    ``"highest"``; pass it as ``float32_matmul_precision``.

    Raises:
        ValueError: the precision is not one of Lightning's 16/bf16/32 settings.
    """
    text = str(precision).lower()
    if text.startswith("bf16"):
        return "bf16"
    if text.startswith("16"):
        return "fp16"
    if text.startswith("32"):
        return "fp32" if float32_matmul_precision == "highest" else "tf32"
    raise ValueError(f"no peak FLOPs for precision {precision!r}; known: 16-*, bf16-*, 32-*")


def peak_flops(
    device_name: str, precision: str | int, float32_matmul_precision: str = "highest"
) -> float | None:
    """Return the dense peak FLOP/s of one device at a Trainer precision, or None if unknown.

    A chip without TF32 tensor cores (V100) falls back to its FP32 peak.

    Example:
        >>> peak_flops("NVIDIA A100-SXM4-80GB", "bf16-mixed")
        312000000000000.0
        >>> peak_flops("NVIDIA H100 80GB HBM3", "32-true", "high") / 1e12
        494.7
        >>> peak_flops("some CPU", "32-true") is None
        True
    """
    chip = chip_of(device_name)
    if chip is None:
        return None
    try:
        dtype = dtype_of_precision(precision, float32_matmul_precision)
    except ValueError:
        return None
    table = PEAK_FLOPS[chip]
    if dtype == "tf32" and "tf32" not in table:
        dtype = "fp32"
    return table.get(dtype)
