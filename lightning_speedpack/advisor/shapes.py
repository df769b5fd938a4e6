"""The shape checks: sizes that tensor cores cannot use fully, and a bias BatchNorm undoes.

``batch-size-multiple`` and ``layer-dims-multiple`` (read from the module's structure through
:mod:`lightning_speedpack.advisor.dims`), and ``conv-bias-before-bn``. Nothing runs: the checks
read the batch size and the registered layers.
"""

from __future__ import annotations

import itertools
from typing import Any

from torch import nn

from lightning_speedpack.advisor.dims import find_unaligned_dims, round_up
from lightning_speedpack.advisor.vocabulary import _BATCHNORM, _CONV, AdvisorFinding, DeviceInfo

__all__ = ["check_batch_size_multiple", "check_conv_bias_before_bn", "check_layer_dims"]


def check_batch_size_multiple(
    batch_size: int | None,
    device: DeviceInfo,
    where: str = "train_dataloader",
    multiple_of: int = 8,
) -> list[AdvisorFinding]:
    """``batch-size-multiple``: a batch size that is not a multiple of 8.

    Severity ``warning`` on a tensor-core GPU, where it costs speed, ``info`` elsewhere.
    """
    if batch_size is None or batch_size % multiple_of == 0:
        return []
    return [
        AdvisorFinding(
            "batch-size-multiple",
            "warning" if device.has_tensor_cores else "info",
            f"the batch size is not a multiple of {multiple_of}, so fp16/bf16 matrix products "
            "cannot use tensor cores fully",
            f"{where}: batch_size={batch_size}",
            location=where,
            fix=f"batch_size={_nearest_multiples(batch_size, multiple_of)}, or let "
            "lightning_speedpack.BatchSizeTuner pick the largest multiple that fits",
            figures={"batch_size": batch_size},
            pays_on=_pays_on(device),
        )
    ]


def _pays_on(device: DeviceInfo) -> str | None:
    # Tensor-core multiples pay on a CUDA GPU only: on a CPU run the advice is for later.
    return None if device.type == "cuda" else "GPU"


def _nearest_multiples(value: int, multiple_of: int) -> str:
    up, down = round_up(value, multiple_of), value // multiple_of * multiple_of
    return str(up) if down < multiple_of else f"{up} or {down}"


def check_layer_dims(
    module: nn.Module, device: DeviceInfo, multiple_of: int = 8
) -> list[AdvisorFinding]:
    """``layer-dims-multiple``: layer dimensions not multiples of 8, one finding per module.

    Dimensions smaller than ``multiple_of`` (3 RGB input channels, a 1-unit regression head)
    are not reported: padding them would cost more than it saves. Severity ``warning`` on a
    tensor-core GPU, ``info`` elsewhere; an output vocabulary is called out in the message.
    """
    by_module: dict[str, list[Any]] = {}
    for dim in find_unaligned_dims(module, multiple_of):
        if dim.value >= multiple_of:
            by_module.setdefault(dim.module, []).append(dim)
    return [
        _layer_dims_finding(name, dims, device, multiple_of) for name, dims in by_module.items()
    ]


def _layer_dims_finding(
    name: str, dims: list[Any], device: DeviceInfo, multiple_of: int
) -> AdvisorFinding:
    # The message names no layer (the evidence and location do), so the report can fold the
    # same advice over many layers into one finding ("6 MultiheadAttention layers: head_dim=100").
    where = name or "<root>"
    vocab_only = all(d.vocab for d in dims) and len({d.suggested for d in dims}) == 1
    if vocab_only:
        message = f"the output vocabulary is not a multiple of {multiple_of}"
        fix = f"pad the vocabulary to {dims[0].suggested} (extra rows are never predicted)"
    else:
        what = "the output vocabulary" if any(d.vocab for d in dims) else "layer dimensions"
        message = f"{what} ({dims[0].layer}) not a multiple of {multiple_of}"
        fix = "pad to " + ", ".join(f"{d.param}={d.suggested}" for d in dims)
        if any(d.vocab for d in dims):
            fix += " (extra vocabulary rows are never predicted)"
    return AdvisorFinding(
        "layer-dims-multiple",
        "warning" if device.has_tensor_cores else "info",
        f"{message}, so fp16/bf16 tensor cores are not used fully",
        f"{where}: " + ", ".join(f"{d.param}={d.value}" for d in dims),
        location=where,
        fix=fix,
        figures={"layer": dims[0].layer, **{d.param: d.value for d in dims}},
        pays_on=_pays_on(device),
    )


def check_conv_bias_before_bn(module: nn.Module) -> list[AdvisorFinding]:
    """``conv-bias-before-bn``: a convolution with a bias directly followed by BatchNorm.

    "Directly followed" is read from registration order: a Conv child immediately followed by a
    BatchNorm sibling over the same channels (``nn.Sequential``, and the ``conv1``/``bn1``
    pattern of ResNet-style blocks). A model that registers them apart is not detected.
    """
    findings = []
    for parent_name, parent in module.named_modules():
        children = list(parent.named_children())
        for (conv_name, conv), (bn_name, bn) in itertools.pairwise(children):
            if not (isinstance(conv, _CONV) and isinstance(bn, _BATCHNORM)):
                continue
            if conv.bias is None or bn.num_features != conv.out_channels:
                continue
            full = f"{parent_name}.{conv_name}" if parent_name else conv_name
            bn_full = f"{parent_name}.{bn_name}" if parent_name else bn_name
            findings.append(
                AdvisorFinding(
                    "conv-bias-before-bn",
                    "info",
                    "a convolution's bias is followed by BatchNorm, which subtracts it again: "
                    "wasted compute and memory",
                    f"{full} ({type(conv).__name__}, bias=True) -> {bn_full} ({type(bn).__name__})",
                    location=full,
                    fix=f"{type(conv).__name__}(..., bias=False) for {full}",
                )
            )
    return findings
