"""lightning-speedpack: find and remove the reasons a Lightning training run is slow.

Every public name is importable from here, for ``pytorch_lightning`` and ``lightning.pytorch``
alike::

    from lightning_speedpack import ThroughputLogger, SyncPointWarnings

Design (two Lightning namespaces, one install):

- **What you import.** One name per tool: ``lightning_speedpack.ThroughputLogger`` serves a
  ``pytorch_lightning.Trainer`` and a ``lightning.pytorch.Trainer`` alike. Only the strategy
  has a class per namespace (a Trainer accepts only its own ``Strategy`` subclasses):
  ``strategy="ddp_speedpack"`` resolves in both registries, and
  ``lightning_speedpack.strategies.lightning.DDPSpeedpackStrategy`` is the object for
  ``lightning.pytorch`` (``DDPSpeedpackStrategy`` here is ``pytorch_lightning``'s, or
  ``lightning.pytorch``'s when it is the only one installed).
- **isinstance.** Each callback subclasses one base whose MRO holds the ``Callback`` of every
  installed namespace, so ``isinstance(cb, pytorch_lightning.Callback)`` and
  ``isinstance(cb, lightning.pytorch.Callback)`` are both true and LightningCLI's config parser
  accepts it in either.
- **Pickling and checkpoints.** A callback pickles by its one public name, so ``ddp_spawn``
  works in both. Its checkpoint state is stored under its ``state_key`` (the class name plus
  its arguments), which does not mention the namespace: a checkpoint written under one loads
  under the other.
- **Imports.** The package imports nothing heavy until a name is used (PEP 562), and only the
  namespaces that are installed: a spawned DataLoader worker that unpickles a ``CachedDataset``
  imports torch and the data tool, not Lightning. Fabric is not supported.

Importing a tool registers its diagnostic with ``speedpack doctor``. Optional dependencies
(``wandb``, ``nvidia-ml-py``) are imported only when used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lightning_speedpack.__about__ import __version__
from lightning_speedpack.strategies import registration as _registration

if TYPE_CHECKING:
    from lightning_speedpack.advisor import AdvisorFinding, DeviceInfo, SpeedAdvisor
    from lightning_speedpack.batch_size import (
        BatchSizeTuner,
        BatchSizeTuningError,
        BatchSizeWarning,
    )
    from lightning_speedpack.cache import CacheBudgetWarning, CachedDataset, CachedStream, CacheInfo
    from lightning_speedpack.comm import CommMonitor
    from lightning_speedpack.core.findings import Finding
    from lightning_speedpack.data_xray import DataPipelineProfiler, stage
    from lightning_speedpack.retention import (
        LossRetentionDetector,
        RetainedGraph,
        RetainedGraphError,
        RetainedGraphWarning,
    )
    from lightning_speedpack.strategies import DDPSpeedpackStrategy
    from lightning_speedpack.sync_points import SyncFinding, SyncPointError, SyncPointWarnings
    from lightning_speedpack.throughput import ThroughputLogger
    from lightning_speedpack.timeline import StepTimeline
    from lightning_speedpack.wall_time import WallTimeLedger
    from lightning_speedpack.what_if import WhatIf, WhatIfError

#: Public name -> the room (subpackage) that defines it.
_ROOMS = {
    "AdvisorFinding": "advisor",
    "BatchSizeTuner": "batch_size",
    "BatchSizeTuningError": "batch_size",
    "BatchSizeWarning": "batch_size",
    "CacheBudgetWarning": "cache",
    "CacheInfo": "cache",
    "CachedDataset": "cache",
    "CachedStream": "cache",
    "CommMonitor": "comm",
    "DataPipelineProfiler": "data_xray",
    "DDPSpeedpackStrategy": "strategies",
    "DeviceInfo": "advisor",
    "Finding": "core.findings",
    "LossRetentionDetector": "retention",
    "RetainedGraph": "retention",
    "RetainedGraphError": "retention",
    "RetainedGraphWarning": "retention",
    "SpeedAdvisor": "advisor",
    "StepTimeline": "timeline",
    "SyncFinding": "sync_points",
    "SyncPointError": "sync_points",
    "SyncPointWarnings": "sync_points",
    "ThroughputLogger": "throughput",
    "WallTimeLedger": "wall_time",
    "WhatIf": "what_if",
    "WhatIfError": "what_if",
    "stage": "data_xray",
}

__all__ = [
    "AdvisorFinding",
    "BatchSizeTuner",
    "BatchSizeTuningError",
    "BatchSizeWarning",
    "CacheBudgetWarning",
    "CacheInfo",
    "CachedDataset",
    "CachedStream",
    "CommMonitor",
    "DDPSpeedpackStrategy",
    "DataPipelineProfiler",
    "DeviceInfo",
    "Finding",
    "LossRetentionDetector",
    "RetainedGraph",
    "RetainedGraphError",
    "RetainedGraphWarning",
    "SpeedAdvisor",
    "StepTimeline",
    "SyncFinding",
    "SyncPointError",
    "SyncPointWarnings",
    "ThroughputLogger",
    "WallTimeLedger",
    "WhatIf",
    "WhatIfError",
    "__version__",
    "stage",
]


def __getattr__(name: str) -> Any:
    room = _ROOMS.get(name)
    if room is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{room}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


# `Trainer(strategy="ddp_speedpack")` works once the pack is imported, whichever namespace the
# script imports and in whatever order (no Lightning is imported here).
_registration.register_when_imported()
