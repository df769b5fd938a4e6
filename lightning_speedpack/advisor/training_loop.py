"""The training-loop checks: how the model is replicated, and how gradients are handled.

``dataparallel``, ``zero-grad`` (gradients zero-filled instead of released), ``eval-grad``
(gradients recorded during validation) and ``sync-batchnorm`` (BatchNorm over tiny per-device
batches under DDP). The callback observes the run; these turn what it saw into findings.
"""

from __future__ import annotations

from torch import nn

from lightning_speedpack.advisor.vocabulary import _BATCHNORM, AdvisorFinding

__all__ = ["check_dataparallel", "check_eval_grad", "check_sync_batchnorm", "check_zero_grad"]


def check_dataparallel(module: nn.Module) -> list[AdvisorFinding]:
    """``dataparallel``: ``nn.DataParallel`` inside the model."""
    names = [name or "<root>" for name, m in module.named_modules() if type(m) is nn.DataParallel]
    return [
        AdvisorFinding(
            "dataparallel",
            "warning",
            "nn.DataParallel runs all GPUs from one Python process (GIL-bound, replicates the "
            "model every step)",
            f"{name} is nn.DataParallel",
            location=name,
            fix='remove nn.DataParallel and use Trainer(strategy="ddp") (one process per GPU)',
        )
        for name in names
    ]


def check_zero_grad(stale_param: str | None, step: int | None = None) -> list[AdvisorFinding]:
    """``zero-grad``: gradients zero-filled instead of set to None.

    Args:
        stale_param: the name of a parameter that still held a gradient tensor right before a
            backward that followed ``zero_grad``; None when every gradient was None.
        step: the global step where it was seen.
    """
    if stale_param is None:
        return []
    where = f" at step {step}" if step is not None else ""
    return [
        AdvisorFinding(
            "zero-grad",
            "warning",
            "zero_grad fills every gradient with zeros (a memory write per parameter) instead "
            "of releasing it",
            f"{stale_param} still held a gradient tensor before backward{where}",
            location=stale_param,
            fix="optimizer.zero_grad(set_to_none=True) (the default) in optimizer_zero_grad, "
            'or SpeedAdvisor(apply=("zero_grad_set_to_none",))',
        )
    ]


def check_eval_grad(evidence: str | None) -> list[AdvisorFinding]:
    """``eval-grad``: gradients recorded during validation.

    Args:
        evidence: what showed it (e.g. ``"validation_step output requires grad"``), or None.
    """
    if evidence is None:
        return []
    return [
        AdvisorFinding(
            "eval-grad",
            "warning",
            "validation records the autograd graph, costing memory and time for gradients "
            "nobody uses",
            evidence,
            location="validation_step",
            fix="remove torch.enable_grad()/set_grad_enabled(True) from validation, or "
            "detach what it computes",
        )
    ]


def check_sync_batchnorm(
    module: nn.Module, world_size: int, per_device_batch: int | None, tiny: int = 16
) -> list[AdvisorFinding]:
    """``sync-batchnorm``: BatchNorm over tiny per-device batches under DDP (informational).

    Args:
        module: the model.
        world_size: number of training processes.
        per_device_batch: the batch size each process sees, None when unknown.
        tiny: batches smaller than this are "tiny".
    """
    if world_size < 2 or per_device_batch is None or per_device_batch >= tiny:
        return []
    names = [name for name, m in module.named_modules() if isinstance(m, _BATCHNORM)]
    if not names:
        return []
    return [
        AdvisorFinding(
            "sync-batchnorm",
            "info",
            "BatchNorm normalises with statistics of each process's own tiny batch, which can "
            "hurt accuracy; SyncBatchNorm shares them across processes (at a collective per layer)",
            f"{len(names)} BatchNorm layer(s) (first: {names[0]}), per-device batch "
            f"{per_device_batch}, {world_size} processes",
            location=names[0],
            fix="Trainer(sync_batchnorm=True) if accuracy suffers",
            figures={"per_device_batch": per_device_batch, "world_size": world_size},
        )
    ]
