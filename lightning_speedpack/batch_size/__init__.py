"""BatchSizeTuner: the largest, fastest or nearest batch size that fits, a multiple of 8."""

from lightning_speedpack.batch_size.callback import (
    BatchSizeTuner,
    BatchSizeTuningError,
    BatchSizeWarning,
)

__all__ = ["BatchSizeTuner", "BatchSizeTuningError", "BatchSizeWarning"]
