"""The checklist in order: which checks run at train start, which at the report, how listed.

:class:`~lightning_speedpack.SpeedAdvisor` gathers the inputs from the run (the loaders'
settings, the module, the seconds it measured) and hands them here; these functions pick the
checks of :mod:`~lightning_speedpack.advisor.rules` that run on them and revise their findings
with what was measured. Plain functions: no Trainer, no hooks, no device synchronisation.

Example:
    >>> from lightning_speedpack.advisor.rules import DeviceInfo
    >>> found = start_checks(torch.nn.Linear(10, 3), [], DeviceInfo("cpu"), precision="32-true",
    ...                      cores=4, devices=1, world_size=1, epochs=1)
    >>> [f.id for f in in_table_order(found)]
    ['layer-dims-multiple']
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lightning_speedpack.advisor import rules as _advice
from lightning_speedpack.advisor.rules import AdvisorFinding, DeviceInfo, LoaderSettings
from lightning_speedpack.core.events import DataVerdict

__all__ = [
    "gpu_report_checks",
    "gpu_start_checks",
    "in_table_order",
    "report_checks",
    "start_checks",
]

_ORDER = {finding_id: i for i, finding_id in enumerate(_advice.FINDING_IDS)}


def start_checks(
    module: torch.nn.Module,
    loaders: Sequence[LoaderSettings],
    device: DeviceInfo,
    *,
    precision: str,
    cores: int,
    devices: int,
    world_size: int,
    epochs: int | None,
) -> list[AdvisorFinding]:
    """The checks that need no measurement, run at train start on the run's own device.

    Args:
        module: the LightningModule.
        loaders: the train dataloaders' settings; the first one's batch size is the run's.
        device: where the run trains.
        precision: the Trainer's precision, as text (``"32-true"``).
        cores: CPU cores this process may use.
        devices: devices per node (``trainer.num_devices``).
        world_size: processes in the run.
        epochs: epochs the fit plans to run (None: unknown).
    """
    found: list[AdvisorFinding] = []
    for loader in loaders:
        found += _advice.check_dataloader_workers(loader, cores, devices)
        found += _advice.check_pin_memory(loader, device)
        found += _advice.check_persistent_workers(loader, epochs)
    batch_size = loaders[0].batch_size if loaders else None
    where = loaders[0].name if loaders else "train_dataloader"
    found += _advice.check_batch_size_multiple(batch_size, device, where)
    found += _advice.check_layer_dims(module, device)
    found += _advice.check_conv_bias_before_bn(module)
    found += _advice.check_precision(precision, device)
    found += _advice.check_channels_last(module, device)
    found += _advice.check_dataparallel(module)
    found += _advice.check_sync_batchnorm(module, world_size, batch_size)
    return found


def gpu_start_checks(
    module: torch.nn.Module,
    loaders: Sequence[LoaderSettings],
    device: DeviceInfo,
    *,
    precision: str,
) -> list[AdvisorFinding]:
    """The GPU-only checks read as if this run were on a tensor-core GPU, for later.

    Kept as ``info`` labelled "on GPU" (``pays_on``): what pays once the model moves to a
    GPU, listed after what pays here. ``cudnn-benchmark`` needs the measured shapes and is
    added at the report (:func:`gpu_report_checks`).
    """
    gpu = _advice.as_if_on_gpu(device)
    found: list[AdvisorFinding] = []
    for loader in loaders:
        found += _advice.check_pin_memory(loader, gpu)
    found += _advice.check_precision(precision, gpu)
    found += _advice.check_channels_last(module, gpu)
    return _advice.for_gpu(found)


def report_checks(
    static: Sequence[AdvisorFinding],
    module: torch.nn.Module,
    device: DeviceInfo,
    *,
    wait_s: float,
    step_s: float,
    steps: int,
    threshold: float,
    cudnn_benchmark: bool,
    fixed_shapes: bool | None,
    stale_param: str | None,
    stale_step: int | None,
    eval_grad: str | None,
    measured: DataVerdict | None,
    data_wait_fraction: float | None,
) -> list[AdvisorFinding]:
    """``static`` (:func:`start_checks`) with the measured checks, revised by what was measured.

    Adds ``data-wait`` (``wait_s`` against ``step_s`` over ``steps``), ``cudnn-benchmark``,
    ``zero-grad`` and ``eval-grad``; then revises the data-loading findings by the data
    profiler's verdict (``measured``) and by this advisor's own ``data_wait_fraction``. The
    measured copy (``pin-memory``) is the caller's last step: it changes after the report.
    """
    found = list(static)
    found += _advice.check_data_wait(wait_s, step_s, steps, threshold)
    found += _advice.check_cudnn_benchmark(module, cudnn_benchmark, fixed_shapes, device)
    found += _advice.check_zero_grad(stale_param, stale_step)
    found += _advice.check_eval_grad(eval_grad)
    found = _advice.with_measured_workers(found, measured)
    found = _advice.with_measured_wait(found, measured, threshold)
    return _advice.with_own_data_wait(found, data_wait_fraction, steps)


def gpu_report_checks(
    module: torch.nn.Module, device: DeviceInfo, fixed_shapes: bool | None
) -> list[AdvisorFinding]:
    """``cudnn-benchmark`` read for a GPU (a run off CUDA), labelled "on GPU"."""
    gpu = _advice.as_if_on_gpu(device)
    return _advice.for_gpu(_advice.check_cudnn_benchmark(module, False, fixed_shapes, gpu))


def in_table_order(found: Sequence[AdvisorFinding]) -> list[AdvisorFinding]:
    """``found`` sorted as the table lists them: by :data:`~.rules.FINDING_IDS`, unknown last."""
    return sorted(found, key=lambda f: _ORDER.get(f.id, len(_ORDER)))
