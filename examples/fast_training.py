"""The same job as ``slow_training.py`` with each problem fixed using the pack.

* :class:`~lightning_speedpack.CachedDataset` decodes each JPEG once into shared memory; the
  random flip still runs on every access, after the cache;
* no hand-set DataLoader workers: :class:`~lightning_speedpack.WhatIf` measures
  ``num_workers`` and ``persistent_workers`` on this model, data and machine before the first
  step and applies the winners for the fit; a setting that did not gain in every round stays
  as it is, and the printed table says why;
* batch size 128, a multiple of 8;
* the loss is logged as a tensor (``self.log`` reduces it without a sync), nothing is kept;
* :class:`~lightning_speedpack.ThroughputLogger` reports samples/s and data wait.

Same model, same data, same number of epochs.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from jpeg_common import (
    JpegDataset,
    SmallCNN,
    common_args,
    demo_trainer,
    finish_wandb,
    to_float,
    write_jpegs,
)
from torch.nn import functional as F
from torch.utils.data import DataLoader

from lightning_speedpack import CachedDataset, ThroughputLogger, WhatIf


def random_flip(sample: tuple[torch.Tensor, int]) -> tuple[torch.Tensor, int]:
    """Random augmentation: runs on every access, after the cache."""
    pixels, label = sample
    if torch.rand(()) < 0.5:
        pixels = pixels.flip(-1)
    return pixels, label


class FastClassifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = SmallCNN()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        pixels, labels = batch
        loss = F.cross_entropy(self.model(to_float(pixels)), labels)
        self.log("train_loss", loss)  # a tensor: no host-device sync here
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def main() -> None:
    args = common_args(__doc__.splitlines()[0]).parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = args.data_dir or Path(tmp) / "jpegs"
        write_jpegs(data_dir, args.images)
        dataset = CachedDataset(JpegDataset(data_dir), transform=random_flip, key="demo-jpegs-32")
        loader = DataLoader(
            dataset, batch_size=128, shuffle=True, pin_memory=torch.cuda.is_available()
        )
        # No hand-set workers: WhatIf measures the worker settings on this model, data and
        # machine before the first step and applies the winners for the fit (one printed line
        # each), by rebuilding the fit's DataLoader with them. Only these two knobs are tried,
        # for at most 30 s: the trials run inside the fit, and the default budget (5% of a fit
        # this short) would not fit a single worker trial.
        workers = ["num_workers", "persistent_workers"]
        what_if = WhatIf(knobs=workers, apply=workers, budget_s=30.0)
        trainer = demo_trainer(args, "fast", callbacks=[what_if, ThroughputLogger()])
        trainer.fit(FastClassifier(), loader)
        print(f"cache: {dataset.cache_info()}")
        finish_wandb(trainer)


if __name__ == "__main__":
    main()
