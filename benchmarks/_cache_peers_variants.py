"""cache_peers.py's variants: the datasets it compares and the random transform after the cache.

Every variant decodes the very same ``JpegFolder`` (``benchmarks/cache.py``); ``build`` makes one
by name, ready for a DataLoader (MONAI's eager cache fills in its constructor, ``ours_filled``
in ``CachedDataset.fill()``).
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from monai.data import CacheDataset, partition_dataset
from monai.transforms import Compose, Transform
from torch.utils.data import Dataset

sys.path.insert(0, str(Path(__file__).parent))
from cache import JpegFolder, NaiveListCache

from lightning_speedpack import CachedDataset

__all__ = [
    "BATCH",
    "CROP",
    "DDP_VARIANTS",
    "PREFETCH",
    "SIZE",
    "SRC_PX",
    "VARIANTS",
    "DecodeItem",
    "Transformed",
    "augment",
    "augment_item",
    "augment_pair",
    "build",
]

VARIANTS = ("uncached", "monai_eager", "monai_runtime", "naive_list", "ours", "ours_filled")
DDP_VARIANTS = ("uncached", "monai_eager", "monai_partitioned", "ours", "ours_filled")
SIZE, CROP, BATCH, PREFETCH = 96, 88, 64, 2
SRC_PX = (64, 320)


def augment(x: torch.Tensor) -> torch.Tensor:
    """Random horizontal flip and random CROP x CROP crop of a cached 3xHxW uint8 tensor."""
    if random.random() < 0.5:
        x = x.flip(-1)
    i = random.randint(0, x.shape[-2] - CROP)
    j = random.randint(0, x.shape[-1] - CROP)
    return x[:, i : i + CROP, j : j + CROP].contiguous()


def augment_pair(sample: tuple[torch.Tensor, int]) -> tuple[torch.Tensor, int]:
    x, y = sample
    return augment(x), y


def augment_item(item: dict[str, Any]) -> dict[str, Any]:
    """The random part of the MONAI pipeline: a plain function, so MONAI caches before it."""
    return {"img": augment(item["img"]), "label": item["label"]}


class Transformed(Dataset[Any]):
    """``fn`` applied to each sample of ``dataset`` (the uncached and naive variants)."""

    def __init__(self, dataset: Any, fn: Callable[[Any], Any]) -> None:
        self.dataset = dataset
        self.fn = fn

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> Any:
        return self.fn(self.dataset[i])


class DecodeItem(Transform):  # type: ignore[misc]
    """MONAI's deterministic (cached) part: the very ``JpegFolder`` decode, as a dict."""

    def __init__(self, folder: JpegFolder) -> None:
        self.folder = folder

    def __call__(self, item: dict[str, Any]) -> dict[str, Any]:
        x, y = self.folder[item["index"]]
        return {"img": x, "label": y}


def build(
    variant: str, files: list[str], transform: bool, workers: int, rank: int = 0, world: int = 1
) -> Any:
    base = JpegFolder(files, SIZE)
    if variant == "uncached":
        return Transformed(base, augment_pair) if transform else base
    if variant == "naive_list":
        naive = NaiveListCache(base, len(base))
        return Transformed(naive, augment_pair) if transform else naive
    if variant in ("ours", "ours_filled"):
        cached = CachedDataset(base, transform=augment_pair if transform else None)
        if variant == "ours_filled":  # decode before training, in processes that exit
            cached.fill()
        return cached
    data = [{"index": i} for i in range(len(base))]
    if variant == "monai_partitioned":
        data = partition_dataset(data, num_partitions=world, shuffle=False, even_divisible=True)[
            rank
        ]
    runtime: bool | str = False
    if variant == "monai_runtime":
        runtime = "process" if workers > 0 else True
    pipeline = Compose([DecodeItem(base), augment_item] if transform else [DecodeItem(base)])
    return CacheDataset(
        data=data,
        transform=pipeline,
        cache_rate=1.0,
        num_workers=os.cpu_count(),
        progress=False,
        runtime_cache=runtime,
    )
