"""The data tools under one name: the cache and the data X-ray, each in its own room.

:mod:`lightning_speedpack.cache` and :mod:`lightning_speedpack.data_xray` hold them.

``from lightning_speedpack.data import CachedDataset`` keeps working. Names load on first use
(PEP 562): :func:`node_id` imports no torch, the cache and :func:`stage` import torch but not
Lightning; only :class:`DataPipelineProfiler`, a callback, imports Lightning.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_speedpack.core.lazy import lazy_names

if TYPE_CHECKING:
    from lightning_speedpack.cache.cached_dataset import (
        CacheBudgetWarning,
        CachedDataset,
        CacheInfo,
    )
    from lightning_speedpack.cache.node import node_id
    from lightning_speedpack.cache.stream import CachedStream
    from lightning_speedpack.core.stages import stage
    from lightning_speedpack.data_xray.profiler import DataPipelineProfiler

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
    "CacheBudgetWarning": "lightning_speedpack.cache.options",
    "CacheInfo": "lightning_speedpack.cache.options",
    "CachedDataset": "lightning_speedpack.cache.cached_dataset",
    "CachedStream": "lightning_speedpack.cache.stream",
    "DataPipelineProfiler": "lightning_speedpack.data_xray.profiler",
    "node_id": "lightning_speedpack.cache.node",
    "stage": "lightning_speedpack.core.stages",
}


__getattr__, __dir__ = lazy_names(__name__, _WHERE, globals())
