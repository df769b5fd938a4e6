"""Small real models for tests: Lightning's BoringModel plus a tiny CNN and an MLP."""

from __future__ import annotations

from typing import Any

import torch
from pytorch_lightning import LightningModule
from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset
from pytorch_lightning.profilers import PassThroughProfiler
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset


class SizedBoringModel(BoringModel):
    """BoringModel whose dataloaders use ``self.batch_size`` (what batch-size tuners change)."""

    def __init__(self, batch_size: int = 8, length: int = 64) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.length = length

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(RandomDataset(32, self.length), batch_size=self.batch_size)

    def val_dataloader(self) -> DataLoader[Any]:
        return DataLoader(RandomDataset(32, self.length), batch_size=self.batch_size)


class ImageDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Deterministic random 3x32x32 images with labels in [0, 10)."""

    def __init__(self, n: int = 64, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 3, 32, 32, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class TinyCNN(LightningModule):
    """A small conv net on 32x32 images: the 'small CNN' of the tests and benchmarks."""

    def __init__(self, batch_size: int = 16, n: int = 64, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.batch_size = batch_size
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(32, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(ImageDataset(self.hparams.n), batch_size=self.batch_size)

    def val_dataloader(self) -> DataLoader[Any]:
        return DataLoader(ImageDataset(self.hparams.n // 2, seed=1), batch_size=self.batch_size)


class TinyMLP(LightningModule):
    """The worst case for per-step overhead: a step that does almost nothing."""

    def __init__(self, width: int = 32, n: int = 256, batch_size: int = 16) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.n = n
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


def quiet_trainer_kwargs(tmp_path: Any, **overrides: Any) -> dict[str, Any]:
    """Trainer arguments for a fast, quiet CPU test run writing under ``tmp_path``."""
    kwargs: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "max_epochs": 1,
        "default_root_dir": str(tmp_path),
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "logger": False,
        "enable_checkpointing": False,
    }
    kwargs.update(overrides)
    return kwargs


class ProfiledNames(PassThroughProfiler):
    """Lightning's default profiler that also keeps the names of the actions it times."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def start(self, action_name: str) -> None:
        self.names.append(action_name)
