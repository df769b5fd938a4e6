"""Training strategies."""

from lightning_speedpack.strategies.ddp import DDPSpeedpackStrategy

__all__: list[str] = ["DDPSpeedpackStrategy"]
