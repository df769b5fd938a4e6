"""Learning-rate scaling for :class:`~lightning_speedpack.BatchSizeTuner` (``scale_lr=True``).

The linear scaling rule: when the batch size changes by a factor, so do the learning rates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from lightning_speedpack.core.lightning import rank_zero_info

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = ["scale_learning_rates"]


def scale_learning_rates(trainer: pl.Trainer, ratio: float) -> None:
    """Multiply every learning rate of ``trainer`` by ``ratio``, in place, and say so on rank 0.

    The ``lr`` and ``initial_lr`` of every optimizer param group (tensors are scaled in place)
    and the ``base_lrs`` of every LR scheduler.
    """

    def scaled(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.mul_(ratio)
        return value * ratio

    for optimizer in trainer.optimizers:
        for group in optimizer.param_groups:
            for key in ("lr", "initial_lr"):
                if key in group:
                    group[key] = scaled(group[key])
    for config in trainer.lr_scheduler_configs:
        base = getattr(config.scheduler, "base_lrs", None)
        if isinstance(base, list):
            config.scheduler.base_lrs = [scaled(lr) for lr in base]
    rank_zero_info(f"BatchSizeTuner: scaled the learning rates by {ratio:g}.")
