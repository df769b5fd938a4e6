"""A realistic, deliberately slow image classifier: the patient for ``speedpack doctor``.

Everything here is a mistake that real training scripts make, on purpose:

* JPEGs are decoded and resized in ``__getitem__`` on every access, every epoch;
* ``num_workers=0``: the training loop waits while the main process decodes;
* batch size 100, not a multiple of 8;
* ``loss.item()`` inside ``training_step``: a GPU->CPU synchronisation every step;
* every loss appended to a list on the module: each graph stays alive.

Run it as ``python examples/slow_training.py`` or under the doctor::

    speedpack doctor examples/slow_training.py --json out.json

``fast_training.py`` is the same job with each problem fixed using the pack.
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


class SlowClassifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = SmallCNN()
        self.losses: list[torch.Tensor] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        pixels, labels = batch
        loss = F.cross_entropy(self.model(to_float(pixels)), labels)
        self.losses.append(loss)  # keeps every step's graph alive
        self.log("train_loss", loss.item())  # waits for the GPU every step
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def main() -> None:
    args = common_args(__doc__.splitlines()[0]).parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = args.data_dir or Path(tmp) / "jpegs"
        write_jpegs(data_dir, args.images)
        loader = DataLoader(JpegDataset(data_dir), batch_size=100, shuffle=True, num_workers=0)
        trainer = demo_trainer(args, "slow")
        trainer.fit(SlowClassifier(), loader)
        finish_wandb(trainer)


if __name__ == "__main__":
    main()
