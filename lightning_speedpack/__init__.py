"""lightning-speedpack: find and remove the reasons a Lightning training run is slow.

Every public name is importable from here::

    from lightning_speedpack import ThroughputLogger, SyncPointWarnings

Importing the package registers each diagnostic with ``speedpack doctor``. Optional
dependencies (``wandb``, ``nvidia-ml-py``) are imported only when used.
"""

from lightning_speedpack.__about__ import __version__
from lightning_speedpack.callbacks.batch_size_tuner import BatchSizeTuner, BatchSizeTuningError
from lightning_speedpack.callbacks.loss_retention import (
    LossRetentionDetector,
    RetainedGraph,
    RetainedGraphError,
    RetainedGraphWarning,
)
from lightning_speedpack.callbacks.speed_advisor import AdvisorFinding, DeviceInfo, SpeedAdvisor
from lightning_speedpack.callbacks.sync_points import SyncFinding, SyncPointError, SyncPointWarnings
from lightning_speedpack.callbacks.throughput import ThroughputLogger
from lightning_speedpack.data.cached_dataset import CacheBudgetWarning, CachedDataset, CacheInfo
from lightning_speedpack.doctor import Finding
from lightning_speedpack.strategies.ddp import DDPSpeedpackStrategy

__all__ = [
    "AdvisorFinding",
    "BatchSizeTuner",
    "BatchSizeTuningError",
    "CacheBudgetWarning",
    "CacheInfo",
    "CachedDataset",
    "DDPSpeedpackStrategy",
    "DeviceInfo",
    "Finding",
    "LossRetentionDetector",
    "RetainedGraph",
    "RetainedGraphError",
    "RetainedGraphWarning",
    "SpeedAdvisor",
    "SyncFinding",
    "SyncPointError",
    "SyncPointWarnings",
    "ThroughputLogger",
    "__version__",
]
