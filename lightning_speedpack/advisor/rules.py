"""The speed-up guides' checklist as pure functions: one check per finding id.

Each ``check_*`` function takes plain inputs (a dataloader's settings, a module, a
:class:`DeviceInfo`, measured seconds) and returns a list of :class:`AdvisorFinding` (empty when
the run is fine). :class:`~lightning_speedpack.SpeedAdvisor` only gathers the inputs from a
Lightning run and calls these, so every finding can be tested here without a Trainer, and the
GPU-only ones without a GPU (pass ``DeviceInfo(type="cuda", has_tensor_cores=True)``).

This module is the checklist's one import path; the checks live by concern:

- :mod:`~lightning_speedpack.advisor.vocabulary`: :data:`FINDING_IDS`, :data:`GPU_ONLY_IDS`,
  :class:`AdvisorFinding`, :class:`DeviceInfo`, :class:`LoaderSettings`.
- :mod:`~lightning_speedpack.advisor.data_loading`: ``dataloader-workers``, ``pin-memory``,
  ``persistent-workers``, ``data-wait``, and the measured figures that revise them
  (``with_measured_*``).
- :mod:`~lightning_speedpack.advisor.shapes`: ``batch-size-multiple``, ``layer-dims-multiple``,
  ``conv-bias-before-bn``.
- :mod:`~lightning_speedpack.advisor.gpu`: ``precision``, ``cudnn-benchmark``,
  ``channels-last``.
- :mod:`~lightning_speedpack.advisor.training_loop`: ``dataparallel``, ``zero-grad``,
  ``eval-grad``, ``sync-batchnorm``.
- :mod:`~lightning_speedpack.advisor.measured`: every finding with the gain ``WhatIf`` measured
  for its remedy (:func:`with_measured_gains`, :data:`FINDING_KNOBS`).
"""

from lightning_speedpack.advisor.data_loading import (
    check_data_wait,
    check_dataloader_workers,
    check_persistent_workers,
    check_pin_memory,
    with_measured_copy,
    with_measured_wait,
    with_measured_workers,
    with_own_data_wait,
)
from lightning_speedpack.advisor.gpu import (
    as_if_on_gpu,
    check_channels_last,
    check_cudnn_benchmark,
    check_precision,
    for_gpu,
    gpu_skip_reason,
    has_conv,
)
from lightning_speedpack.advisor.measured import FINDING_KNOBS, with_measured_gains
from lightning_speedpack.advisor.shapes import (
    check_batch_size_multiple,
    check_conv_bias_before_bn,
    check_layer_dims,
)
from lightning_speedpack.advisor.training_loop import (
    check_dataparallel,
    check_eval_grad,
    check_sync_batchnorm,
    check_zero_grad,
)
from lightning_speedpack.advisor.vocabulary import (
    FINDING_IDS,
    GPU_ONLY_IDS,
    AdvisorFinding,
    DeviceInfo,
    LoaderSettings,
)

__all__ = [
    "FINDING_IDS",
    "FINDING_KNOBS",
    "GPU_ONLY_IDS",
    "AdvisorFinding",
    "DeviceInfo",
    "LoaderSettings",
    "as_if_on_gpu",
    "check_batch_size_multiple",
    "check_channels_last",
    "check_conv_bias_before_bn",
    "check_cudnn_benchmark",
    "check_data_wait",
    "check_dataloader_workers",
    "check_dataparallel",
    "check_eval_grad",
    "check_layer_dims",
    "check_persistent_workers",
    "check_pin_memory",
    "check_precision",
    "check_sync_batchnorm",
    "check_zero_grad",
    "for_gpu",
    "gpu_skip_reason",
    "has_conv",
    "with_measured_copy",
    "with_measured_gains",
    "with_measured_wait",
    "with_measured_workers",
    "with_own_data_wait",
]
