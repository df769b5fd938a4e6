"""``DDPSpeedpackStrategy`` for ``lightning.pytorch`` Trainers (``import lightning as L``)."""

from __future__ import annotations

from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry

from lightning_speedpack.strategies.ddp import SpeedpackDDPMixin

__all__ = ["DDPSpeedpackStrategy"]


class DDPSpeedpackStrategy(SpeedpackDDPMixin, DDPStrategy):
    """``lightning.pytorch``'s DDP with the guides' settings; see :class:`SpeedpackDDPMixin`.

    Example:
        >>> import lightning as L
        >>> import lightning_speedpack  # registers the strategy names
        >>> trainer = L.Trainer(strategy="ddp_speedpack", accelerator="cpu", devices=2,
        ...                     logger=False)
        >>> type(trainer.strategy).__module__
        'lightning_speedpack.strategies.lightning'
        >>> trainer.strategy.ddp_kwargs["find_unused_parameters"]
        False
    """


DDPSpeedpackStrategy.register_strategies(StrategyRegistry)
