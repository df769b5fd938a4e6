"""BatchSizeTuner: the largest (or fastest) batch size that fits, a multiple of 8, DDP-agreed."""

from lightning_speedpack.batch_size.callback import BatchSizeTuner, BatchSizeTuningError

__all__ = ["BatchSizeTuner", "BatchSizeTuningError"]
