"""The data tool: CachedDataset (decode once, one shared copy per node) and the data X-ray.

Names load on first use (PEP 562), so ``speedpack cache`` and :func:`node_id` import no torch,
and the cache and :func:`stage` (what a spawned DataLoader worker unpickles) import torch but
not Lightning; only :class:`DataPipelineProfiler`, a callback, imports Lightning.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightning_speedpack.data.cached_dataset import (
        CacheBudgetWarning,
        CachedDataset,
        CacheInfo,
    )
    from lightning_speedpack.data.node import node_id
    from lightning_speedpack.data.profiler import DataPipelineProfiler
    from lightning_speedpack.data.stages import stage
    from lightning_speedpack.data.stream import CachedStream

__all__ = [
    "CacheBudgetWarning",
    "CacheInfo",
    "CachedDataset",
    "CachedStream",
    "DataPipelineProfiler",
    "node_id",
    "stage",
]

_WHERE = {
    "CacheBudgetWarning": "cached_dataset",
    "CacheInfo": "cached_dataset",
    "CachedDataset": "cached_dataset",
    "CachedStream": "stream",
    "DataPipelineProfiler": "profiler",
    "node_id": "node",
    "stage": "stages",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
