"""Dataset wrappers."""

from lightning_speedpack.data.cached_dataset import CacheBudgetWarning, CachedDataset, CacheInfo

__all__ = ["CacheBudgetWarning", "CacheInfo", "CachedDataset"]
