"""CachedDataset: decode once, keep one shared copy per node (imports torch, not Lightning)."""

from lightning_speedpack.data.cached_dataset import CacheBudgetWarning, CachedDataset, CacheInfo

__all__ = ["CacheBudgetWarning", "CacheInfo", "CachedDataset"]
