"""The cache: CachedDataset (decode once, one shared copy per node) and CachedStream.

Names load on first use (PEP 562), so ``speedpack cache`` and :func:`node_id` import no torch,
and the cache (what a spawned DataLoader worker unpickles) imports torch but not Lightning.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightning_speedpack.cache.cached_dataset import CachedDataset
    from lightning_speedpack.cache.node import node_id
    from lightning_speedpack.cache.options import CacheBudgetWarning, CacheInfo
    from lightning_speedpack.cache.stream import CachedStream

__all__ = ["CacheBudgetWarning", "CacheInfo", "CachedDataset", "CachedStream", "node_id"]

_WHERE = {
    "CacheBudgetWarning": "options",
    "CacheInfo": "options",
    "CachedDataset": "cached_dataset",
    "CachedStream": "stream",
    "node_id": "node",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
