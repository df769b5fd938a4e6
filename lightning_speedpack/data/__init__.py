"""CachedDataset: decode once, keep one shared copy per node (imports torch, not Lightning).

Names load on first use (PEP 562), so ``speedpack cache`` and :func:`node_id` import no torch.
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
    from lightning_speedpack.data.stream import CachedStream

__all__ = ["CacheBudgetWarning", "CacheInfo", "CachedDataset", "CachedStream", "node_id"]

_WHERE = {
    "CacheBudgetWarning": "cached_dataset",
    "CacheInfo": "cached_dataset",
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
