"""``DDPSpeedpackStrategy`` for ``pytorch_lightning`` Trainers (``import pytorch_lightning``)."""

from __future__ import annotations

from pytorch_lightning.strategies import DDPStrategy, StrategyRegistry

from lightning_speedpack.strategies.ddp import SpeedpackDDPMixin

__all__ = ["DDPSpeedpackStrategy"]


class DDPSpeedpackStrategy(SpeedpackDDPMixin, DDPStrategy):
    """``pytorch_lightning``'s DDP with the guides' settings; see :class:`SpeedpackDDPMixin`.

    Example:
        >>> from pytorch_lightning import Trainer
        >>> import lightning_speedpack  # registers the strategy names
        >>> trainer = Trainer(strategy="ddp_speedpack", accelerator="cpu", devices=2, logger=False)
        >>> type(trainer.strategy).__module__
        'lightning_speedpack.strategies.pytorch_lightning'
        >>> trainer.strategy.ddp_kwargs["gradient_as_bucket_view"]
        True
    """


DDPSpeedpackStrategy.register_strategies(StrategyRegistry)
