"""The cache: CachedDataset (decode once, one shared copy per node) and CachedStream.

Names load on first use (PEP 562), so ``speedpack cache`` and :func:`node_id` import no torch,
and the cache (what a spawned DataLoader worker unpickles) imports torch but not Lightning.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_speedpack.core.lazy import lazy_names

if TYPE_CHECKING:
    from lightning_speedpack.cache.cached_dataset import CachedDataset
    from lightning_speedpack.cache.node import node_id
    from lightning_speedpack.cache.options import CacheBudgetWarning, CacheInfo
    from lightning_speedpack.cache.stream import CachedStream

__all__ = ["CacheBudgetWarning", "CacheInfo", "CachedDataset", "CachedStream", "node_id"]

_WHERE = {
    "CacheBudgetWarning": ".options",
    "CacheInfo": ".options",
    "CachedDataset": ".cached_dataset",
    "CachedStream": ".stream",
    "node_id": ".node",
}


__getattr__, __dir__ = lazy_names(__name__, _WHERE, globals())
