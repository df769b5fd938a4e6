"""Training strategies: ``strategy="ddp_speedpack"`` and ``"ddp_speedpack_spawn"``.

Each Lightning namespace has its own strategy class (a Trainer accepts only its own), with one
behaviour (:class:`~lightning_speedpack.strategies.ddp.SpeedpackDDPMixin`):

- ``lightning_speedpack.strategies.pytorch_lightning.DDPSpeedpackStrategy`` for
  ``pytorch_lightning.Trainer``;
- ``lightning_speedpack.strategies.lightning.DDPSpeedpackStrategy`` for
  ``lightning.pytorch.Trainer``.

``DDPSpeedpackStrategy`` here (and in :mod:`lightning_speedpack`) is the first of the two whose
namespace is installed, ``pytorch_lightning`` first. The strategy *names* work in both: importing
the pack registers them in each namespace's ``StrategyRegistry`` as soon as it is imported.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lightning_speedpack.strategies.registration import STRATEGY_MODULES, register_when_imported

if TYPE_CHECKING:
    from lightning_speedpack.strategies.pytorch_lightning import DDPSpeedpackStrategy

__all__ = ["DDPSpeedpackStrategy"]


def __getattr__(name: str) -> Any:
    if name == "DDPSpeedpackStrategy":
        from lightning_speedpack.core.lightning import installed_namespaces

        module = importlib.import_module(STRATEGY_MODULES[installed_namespaces()[0]])
        return module.DDPSpeedpackStrategy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


register_when_imported()
