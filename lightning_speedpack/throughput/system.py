"""ThroughputLogger's glue to the world around the step: devices, system statistics and W&B.

Everything here runs once per fit or once per logged step, never per training step: the
device's peak FLOP/s, which CUDA devices NVML should sample, CPU and RAM figures from psutil,
and the W&B run's step axis, config and summary (through the ``WandbLogger`` of either
Lightning namespace).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from lightning_speedpack.core.lightning import classes, rank_zero_info
from lightning_speedpack.throughput import nvml
from lightning_speedpack.throughput.peak_flops import peak_flops

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = [
    "cpu_stats",
    "device_peak_flops",
    "local_cuda_indices",
    "prime_cpu_stats",
    "start_nvml_sampler",
    "system_metrics",
    "wandb_runs",
    "wandb_setup",
    "wandb_summary",
]


def device_peak_flops(trainer: pl.Trainer) -> float | None:
    """Dense peak FLOP/s of the trainer's device at its precision (None off CUDA or unknown)."""
    device = trainer.strategy.root_device
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    peak = peak_flops(name, str(trainer.precision), torch.get_float32_matmul_precision())
    if peak is None:
        rank_zero_info(f"ThroughputLogger: no peak FLOPs known for {name!r}; MFU not logged")
    return peak


def local_cuda_indices(trainer: pl.Trainer) -> list[int] | str:
    """The CUDA indices of this node's training devices, or why there are none."""
    if trainer.strategy.root_device.type != "cuda":
        return "training does not run on a CUDA GPU"
    return list(trainer.device_ids)


def start_nvml_sampler(indices: Sequence[int] | str) -> nvml.NvmlSampler | None:
    """Start sampling NVML on ``indices`` (CUDA indices), or say once why not and return None."""
    if isinstance(indices, str):
        rank_zero_info(f"ThroughputLogger: system/gpu/* not logged: {indices}")
        return None
    functions = nvml.load_functions()
    if isinstance(functions, str):
        rank_zero_info(f"ThroughputLogger: system/gpu/* not logged: {functions}")
        return None
    sampler = nvml.NvmlSampler(functions, nvml.nvml_indices(indices))
    sampler.start()
    return sampler


def prime_cpu_stats() -> None:
    """Start psutil's CPU-time interval, so the first :func:`cpu_stats` covers this fit."""
    import psutil

    psutil.cpu_percent(interval=None)


def cpu_stats() -> dict[str, float]:
    """``system/cpu_util`` (percent since the previous call) and ``system/ram_used_gb``."""
    import psutil

    return {
        "system/cpu_util": float(psutil.cpu_percent(interval=None)),
        "system/ram_used_gb": psutil.virtual_memory().used / 1e9,
    }


def system_metrics(
    sampler: nvml.NvmlSampler | None, cpu: bool, global_zero: bool
) -> dict[str, float]:
    """Rank 0's NVML figures since the sampler's last read, and psutil's if ``cpu``.

    Example:
        >>> system_metrics(None, cpu=False, global_zero=True)
        {}
    """
    metrics: dict[str, float] = {}
    if not global_zero:
        return metrics
    if sampler is not None:
        metrics.update(nvml.summarize(sampler.read()))
    if cpu:  # psutil costs ~50 us: read only what a logger gets
        metrics.update(cpu_stats())
    return metrics


def wandb_runs(trainer: pl.Trainer) -> list[Any]:
    """The W&B runs of the trainer's W&B loggers (of either Lightning namespace)."""
    loggers = trainer.loggers
    if not loggers:
        return []
    wandb_loggers = classes("loggers.WandbLogger")
    return [lg.experiment for lg in loggers if isinstance(lg, wandb_loggers)]


def wandb_setup(trainer: pl.Trainer, prefix: str, settings: dict[str, Any]) -> None:
    """Put every key on the ``trainer/global_step`` axis; record ``settings`` in the config."""
    for run in wandb_runs(trainer):
        run.define_metric("trainer/global_step")
        for pattern in (f"{prefix}*", "system/*"):
            run.define_metric(pattern, step_metric="trainer/global_step")
        run.config.update({"throughput_logger": settings}, allow_val_change=True)


def wandb_summary(trainer: pl.Trainer, prefix: str, figures: dict[str, Any]) -> None:
    """Write the whole-run means (and the GPU memory peak) into every W&B run's summary."""
    names = {
        "samples_per_sec": f"{prefix}mean_samples_per_sec",
        "data_wait_fraction": f"{prefix}mean_data_wait_fraction",
        "mfu": f"{prefix}mean_mfu",
        "peak_gpu_mem_used_gb": "system/gpu/peak_mem_used_gb",
    }
    summary = {key: figures[name] for name, key in names.items() if name in figures}
    for run in wandb_runs(trainer):
        run.summary.update(summary)
