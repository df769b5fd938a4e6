"""The pack's Lightning callbacks, one public class per module."""

from lightning_speedpack.callbacks.batch_size_tuner import BatchSizeTuner, BatchSizeTuningError
from lightning_speedpack.callbacks.loss_retention import (
    LossRetentionDetector,
    RetainedGraph,
    RetainedGraphError,
    RetainedGraphWarning,
)
from lightning_speedpack.callbacks.speed_advisor import SpeedAdvisor
from lightning_speedpack.callbacks.sync_points import SyncFinding, SyncPointError, SyncPointWarnings
from lightning_speedpack.callbacks.throughput import ThroughputLogger

__all__: list[str] = [
    "BatchSizeTuner",
    "BatchSizeTuningError",
    "LossRetentionDetector",
    "RetainedGraph",
    "RetainedGraphError",
    "RetainedGraphWarning",
    "SpeedAdvisor",
    "SyncFinding",
    "SyncPointError",
    "SyncPointWarnings",
    "ThroughputLogger",
]
