"""The data and model shared by ``slow_training.py`` and ``fast_training.py``.

Both scripts train the same small CNN on the same synthetic JPEG files; only the way they are
trained differs. The images are written once per run to a temporary folder (or ``--data-dir``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import Dataset

IMAGE_SIZE = 32
NUM_CLASSES = 10


def write_jpegs(directory: Path, n: int, seed: int = 0) -> None:
    """Write ``n`` JPEGs of varied sizes whose colour depends on the class (so it is learnable)."""
    directory.mkdir(parents=True, exist_ok=True)
    done = directory / f".complete-{n}-{seed}"
    if done.exists():
        return  # already written by an earlier run with the same settings
    rng = np.random.default_rng(seed)
    palette = rng.integers(40, 215, (NUM_CLASSES, 3))
    for i in range(n):
        w, h = int(rng.integers(800, 1200)), int(rng.integers(600, 900))
        noise = rng.integers(-40, 40, (h // 8, w // 8, 3))
        small = np.clip(palette[i % NUM_CLASSES] + noise, 0, 255).astype(np.uint8)
        Image.fromarray(small).resize((w, h), Image.BILINEAR).save(
            directory / f"{i:05d}_{i % NUM_CLASSES}.jpg", quality=90
        )
    done.touch()  # last: a reader that sees it sees every file whole


def wait_for_jpegs(directory: Path, n: int, seed: int = 0, timeout: float = 600.0) -> None:
    """Wait until another process (local rank 0) has finished :func:`write_jpegs`."""
    deadline = time.monotonic() + timeout
    while not (directory / f".complete-{n}-{seed}").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no complete set of {n} JPEGs in {directory} after {timeout} s")
        time.sleep(0.2)


class JpegDataset(Dataset[tuple[torch.Tensor, int]]):
    """Decode and resize a JPEG per access: the expensive, deterministic part of each sample."""

    def __init__(self, directory: Path) -> None:
        self.files = sorted(Path(directory).glob("*.jpg"))

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path = self.files[index]
        with Image.open(path) as img:
            img = img.convert("RGB").resize((IMAGE_SIZE, IMAGE_SIZE), Image.BILINEAR)
            pixels = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1)  # uint8 CHW
        return pixels, int(path.stem.rsplit("_", 1)[1])


def to_float(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 [0, 255] -> float [-1, 1] (on the device, after the copy: 4x fewer bytes moved)."""
    return pixels.float().div_(127.5).sub_(1.0)


class SmallCNN(nn.Module):
    """The model both scripts train."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 32, 3, padding=1, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(32, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def common_args(description: str) -> argparse.ArgumentParser:
    """The command-line options both scripts share."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--images", type=int, default=2000, help="number of JPEG files")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--data-dir", type=Path, default=None, help="default: a temporary folder")
    parser.add_argument("--out", type=Path, default=Path("demo-output"), help="logs and W&B run")
    parser.add_argument("--wandb", action="store_true", help="log to W&B (offline unless set up)")
    return parser


def wandb_logger(out: Path, project: str, name: str | None = None) -> Any:
    """A ``WandbLogger`` writing under ``out`` (offline unless W&B is set up)."""
    from pytorch_lightning.loggers import WandbLogger

    out.mkdir(parents=True, exist_ok=True)
    return WandbLogger(project=project, name=name, save_dir=str(out))


def demo_trainer(args: argparse.Namespace, name: str, callbacks: Sequence[Any] = ()) -> Any:
    """The Trainer both demo scripts use: identical settings, so only the fixes differ."""
    import pytorch_lightning as pl

    logger = wandb_logger(args.out, "speedpack-demo", name) if args.wandb else False
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=args.epochs,
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=5,
        default_root_dir=str(args.out),
        callbacks=list(callbacks),
    )


def finish_wandb(trainer: Any) -> None:
    """Close the W&B run, if the trainer has one, so its files are complete."""
    for logger in trainer.loggers:
        if hasattr(logger, "experiment") and type(logger).__name__ == "WandbLogger":
            logger.experiment.finish()
