"""Models and datasets for the WhatIf tests: a tiny conv net over a dataset of known cost.

Importable by name (spawned DataLoader workers and DDP ranks unpickle them).
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from tests.helpers.namespaces import NAMESPACE_IDS, load


class NappingImages(Dataset[tuple[torch.Tensor, int]]):
    """Deterministic 3x16x16 images; each ``__getitem__`` sleeps ``nap`` seconds first."""

    def __init__(self, n: int = 256, nap: float = 0.0) -> None:
        self.n, self.nap = n, nap

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.nap:
            time.sleep(self.nap)
        g = torch.Generator().manual_seed(i)
        return torch.randn(3, 16, 16, generator=g), i % 10


class Stream(IterableDataset[torch.Tensor]):
    """A stream of ``n`` numbered items; ``shards=False`` ignores ``get_worker_info()``."""

    def __init__(self, n: int = 64, shards: bool = True) -> None:
        self.n, self.shards = n, shards

    def __iter__(self) -> Any:
        info = get_worker_info()
        start, step = 0, 1
        if self.shards and info is not None:
            start, step = info.id, info.num_workers
        for i in range(start, self.n, step):
            yield torch.full((3, 16, 16), float(i))


@functools.cache
def conv_model(name: str) -> type[Any]:
    """A tiny conv net (a LightningModule of namespace ``name``) whose loader comes from it.

    Keyword arguments: ``batch_size``, ``n`` (samples), ``nap`` (seconds per sample),
    ``stream`` (an :class:`Stream` instead), ``shards``, ``workers``, ``context`` (the
    DataLoader's multiprocessing context), ``fail`` (``training_step`` raises),
    ``oom_channels_last`` (an out-of-memory error on channels_last input), ``step_nap``
    (seconds each ``training_step`` sleeps: a model step of known cost).
    """
    ns = load(name)

    class ConvNet(ns.LightningModule):  # type: ignore[misc, name-defined]
        def __init__(
            self,
            batch_size: int = 16,
            n: int = 128,
            nap: float = 0.0,
            stream: bool = False,
            shards: bool = True,
            workers: int = 0,
            context: str | None = None,
            fail: bool = False,
            oom_channels_last: bool = False,
            step_nap: float = 0.0,
        ) -> None:
            super().__init__()
            self.net = nn.Sequential(
                nn.Conv2d(3, 8, 3),
                nn.ReLU(),
                nn.AdaptiveAvgPool2d(1),
                nn.Flatten(),
                nn.Linear(8, 10),
            )
            self.batch_size, self.n, self.nap = batch_size, n, nap
            self.stream, self.shards, self.workers, self.context = stream, shards, workers, context
            self.fail, self.oom_channels_last = fail, oom_channels_last
            self.step_nap = step_nap
            self.first_batches: list[Any] = []

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)  # type: ignore[no-any-return]

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if self.fail:
                raise ValueError("planted: training_step fails")
            if self.step_nap:
                time.sleep(self.step_nap)
            x = batch if self.stream else batch[0]
            channels_last = x.is_contiguous(memory_format=torch.channels_last)
            if self.oom_channels_last and channels_last and not x.is_contiguous():
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
            y = torch.zeros(len(x), dtype=torch.long) if self.stream else batch[1]
            return nn.functional.cross_entropy(self(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

        def train_dataloader(self) -> DataLoader[Any]:
            dataset: Any = (
                Stream(self.n, self.shards) if self.stream else NappingImages(self.n, self.nap)
            )
            kwargs: dict[str, Any] = {"batch_size": self.batch_size, "num_workers": self.workers}
            if self.workers and self.context:
                kwargs["multiprocessing_context"] = self.context
            return DataLoader(dataset, shuffle=not self.stream, **kwargs)

    ConvNet.__qualname__ = f"ConvNet_{NAMESPACE_IDS[name]}"
    globals()[ConvNet.__qualname__] = ConvNet  # picklable by name
    return ConvNet
