"""Shared pieces for the benchmark scripts: small models and an alternating timer.

Benchmarks here compare variants inside one process, alternating them round by round and
reporting medians, because the machines are shared and noisy: only ratios are meaningful.
"""

from __future__ import annotations

import logging
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from pytorch_lightning import LightningModule, Trainer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

__all__ = [
    "SmallCNN",
    "TinyMLP",
    "alternate",
    "alternate_samples",
    "fit_seconds",
    "paired_ratio",
    "print_table",
    "quiet_one_thread",
    "quiet_trainer",
]


class TinyMLP(LightningModule):
    """Worst case for per-step overhead: a step that does almost nothing."""

    def __init__(self, width: int = 32, n: int = 2048, batch_size: int = 16) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.net = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1))
        g = torch.Generator().manual_seed(0)
        self.data = TensorDataset(
            torch.randn(n, width, generator=g), torch.randn(n, 1, generator=g)
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.data, batch_size=self.batch_size)


class SmallCNN(LightningModule):
    """A small conv net on 3x32x32 images: a realistic step of a few milliseconds on a CPU."""

    def __init__(self, n: int = 512, batch_size: int = 32) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.net = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(64, 10),
        )
        g = torch.Generator().manual_seed(0)
        self.data = TensorDataset(
            torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.data, batch_size=self.batch_size)


def quiet_trainer(**overrides: Any) -> Trainer:
    """A CPU Trainer that prints and writes nothing."""
    kwargs: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "max_epochs": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
    kwargs.update(overrides)
    return Trainer(**kwargs)


def fit_seconds(model_factory: Callable[[], LightningModule], **trainer_kwargs: Any) -> float:
    """Wall seconds of one ``fit`` of a fresh model (trainer construction excluded)."""
    trainer = quiet_trainer(**trainer_kwargs)
    model = model_factory()
    start = time.perf_counter()
    trainer.fit(model)
    return time.perf_counter() - start


def alternate(variants: dict[str, Callable[[], float]], repeats: int = 5) -> dict[str, float]:
    """Run each variant once per round, in rotating order, ``repeats`` rounds; return medians."""
    return {n: statistics.median(v) for n, v in alternate_samples(variants, repeats).items()}


def alternate_samples(
    variants: dict[str, Callable[[], float]], repeats: int = 5
) -> dict[str, list[float]]:
    """:func:`alternate`'s rounds themselves: each variant's value per round, in round order."""
    names = list(variants)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            samples[name].append(variants[name]())
    return samples


def paired_ratio(samples: dict[str, list[float]], name: str, base: str) -> float:
    """Median over rounds of ``name``'s value over ``base``'s in the same round.

    Each round's two runs are neighbours in time, so a slow spell of the machine weighs on both;
    the median of these ratios is steadier than the ratio of the two medians.
    """
    return statistics.median(a / b for a, b in zip(samples[name], samples[base], strict=True))


def quiet_one_thread() -> None:
    """Silence warnings and the pack's and Lightning's logs; one torch thread (a rank a core)."""
    warnings.filterwarnings("ignore")
    for name in ("pytorch_lightning", "lightning.pytorch", "lightning_speedpack"):
        logging.getLogger(name).setLevel(logging.ERROR)
    torch.set_num_threads(1)


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print a plain markdown table (pasteable into BENCHMARKS.md)."""
    print(f"\n### {title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        cells = [f"{c:.3f}" if isinstance(c, float) else str(c) for c in row]
        print("| " + " | ".join(cells) + " |")
