"""The GPU-only checks on the model and the Trainer: precision, cuDNN autotuning, memory format.

``precision``, ``cudnn-benchmark`` and ``channels-last`` only mean something on a CUDA GPU;
:func:`gpu_skip_reason` says why they do not apply to the run's own device (the advisor lists
them as skipped). On a run off CUDA the advisor still reads them against a tensor-core GPU
(:func:`as_if_on_gpu`) and keeps what they find for when the model moves to one, as ``info``
labelled "on GPU" (:func:`for_gpu`). Tests run them on a CPU machine with an injected
``DeviceInfo(type="cuda", has_tensor_cores=True)``.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from lightning_speedpack.advisor.vocabulary import _CONV, AdvisorFinding, DeviceInfo

__all__ = [
    "as_if_on_gpu",
    "check_channels_last",
    "check_cudnn_benchmark",
    "check_precision",
    "for_gpu",
    "gpu_skip_reason",
    "has_conv",
]


def as_if_on_gpu(device: DeviceInfo) -> DeviceInfo:
    """The tensor-core GPU the GPU-only checks are read against on a run off CUDA.

    Their advice is kept for when the model moves to a GPU (:func:`for_gpu`); the device's
    name says so in the evidence.

    Example:
        >>> as_if_on_gpu(DeviceInfo("cpu")).name
        'a GPU (this run is on the cpu)'
    """
    return DeviceInfo("cuda", f"a GPU (this run is on the {device.type})", (8, 0), True)


def for_gpu(found: list[AdvisorFinding]) -> list[AdvisorFinding]:
    """Findings read against :func:`as_if_on_gpu`: kept as ``info``, labelled ``pays_on="GPU"``.

    The report lists them after what pays on the run's own hardware, marked "on GPU".
    """
    return [replace(f, severity="info", pays_on="GPU") for f in found]


def gpu_skip_reason(device: DeviceInfo) -> str | None:
    """Why the GPU-only checks do not apply to ``device``, or None when they do."""
    if device.is_gpu:
        return None
    return f"the run trains on {device.type!r}, not a CUDA GPU"


def has_conv(module: nn.Module) -> bool:
    """True when ``module`` contains a 1-, 2- or 3-D convolution (transposed ones included)."""
    return any(isinstance(m, (*_CONV, nn.modules.conv._ConvTransposeNd)) for m in module.modules())


def check_precision(precision: str, device: DeviceInfo) -> list[AdvisorFinding]:
    """``precision``: 32-bit training on a GPU with tensor cores (GPU-only).

    Args:
        precision: ``trainer.precision`` (``"32-true"``, ``"bf16-mixed"``, ...).
        device: the device the run trains on.
    """
    if not device.has_tensor_cores or str(precision) not in ("32-true", "32", "64-true", "64"):
        return []
    suggestion = "bf16-mixed" if device.supports_bf16 else "16-mixed"
    return [
        AdvisorFinding(
            "precision",
            "warning",
            "full-precision training on a GPU with tensor cores, which run fp16/bf16 several "
            "times faster (2-3.5x reported) with about half the activation memory",
            f"Trainer(precision={precision!r}) on {device.name or 'a tensor-core GPU'}",
            location="Trainer(precision)",
            fix=f"Trainer(precision={suggestion!r})",
        )
    ]


def check_cudnn_benchmark(
    module: nn.Module, benchmark: bool, fixed_shapes: bool | None, device: DeviceInfo
) -> list[AdvisorFinding]:
    """``cudnn-benchmark``: conv model, fixed input shapes, cuDNN autotuning off (GPU-only).

    Args:
        module: the model.
        benchmark: ``torch.backends.cudnn.benchmark`` during the run.
        fixed_shapes: whether every measured batch had the same shapes (None: not measured).
        device: the device the run trains on.
    """
    if not device.is_gpu or benchmark or not fixed_shapes or not has_conv(module):
        return []
    return [
        AdvisorFinding(
            "cudnn-benchmark",
            "warning",
            "cuDNN picks its default convolution algorithms although the input shapes never "
            "change; autotuning them once is reported 1.27-1.70x faster",
            "torch.backends.cudnn.benchmark=False, fixed batch shapes in the measured steps",
            location="torch.backends.cudnn.benchmark",
            fix='Trainer(benchmark=True), or SpeedAdvisor(apply=("cudnn_benchmark",))',
        )
    ]


def check_channels_last(module: nn.Module, device: DeviceInfo) -> list[AdvisorFinding]:
    """``channels-last``: 2-D convolutions whose weights are not ``channels_last`` (GPU-only)."""
    if not device.is_gpu:
        return []
    names = [
        name
        for name, m in module.named_modules()
        if isinstance(m, nn.Conv2d)
        and m.weight.dim() == 4
        and not m.weight.is_contiguous(memory_format=torch.channels_last)
    ]
    if not names:
        return []
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return [
        AdvisorFinding(
            "channels-last",
            "warning",
            "4-D convolutions run in NCHW memory format; tensor cores prefer NHWC "
            "(channels_last, reported 8-35% faster with mixed precision)",
            f"{len(names)} Conv2d not channels_last: {shown}",
            location=names[0],
            fix="model.to(memory_format=torch.channels_last) and the same for the input "
            'batches, or SpeedAdvisor(apply=("channels_last",))',
            figures={"conv2d_not_channels_last": len(names)},
        )
    ]
