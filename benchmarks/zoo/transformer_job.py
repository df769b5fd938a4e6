"""A small language-model fit in the shape of Lightning's transformer example, for the report.

``benchmarks/report_layout.py`` runs it under ``speedpack doctor`` with the report going to a
file. Like Lightning's ``examples/pytorch/basics/transformer.py`` it trains
``lightning.pytorch.demos.Transformer`` (2 encoder and 2 decoder layers, ``nhead=2`` over 200
dimensions: ``head_dim=100`` in 6 attention layers) with SGD, batch 20, gradient clipping,
validation every epoch and the Trainer's defaults otherwise; the tokens are random (WikiText-2
would need the network), the vocabulary 3,001 words and the fit 3 epochs of 10 steps.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule, Trainer, seed_everything
from lightning.pytorch.demos import Transformer
from torch.utils.data import DataLoader, Dataset


class Tokens(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Blocks of ``block_size`` random tokens and the same shifted by one."""

    def __init__(self, samples: int, vocab: int, block_size: int = 35) -> None:
        data = torch.randint(vocab, (samples * block_size + 1,), generator=torch.Generator())
        self.data, self.block_size, self.samples = data, block_size, samples

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.block_size
        block = self.data[start : start + self.block_size + 1]
        return block[:-1], block[1:]


class LanguageModel(LightningModule):
    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.model = Transformer(vocab_size=vocab_size)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        inputs, target = batch
        loss = F.nll_loss(self.model(inputs, target), target.reshape(-1))
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        inputs, target = batch
        loss = F.nll_loss(self.model(inputs, target), target.reshape(-1))
        self.log("val_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=20.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=3001)
    args = parser.parse_args()
    seed_everything(42)
    train, val = Tokens(200, args.vocab), Tokens(40, args.vocab)
    model = LanguageModel(args.vocab)
    trainer = Trainer(
        accelerator="cpu", gradient_clip_val=0.25, max_epochs=args.epochs, log_every_n_steps=5
    )
    trainer.fit(model, DataLoader(train, batch_size=20, shuffle=True), DataLoader(val, 20))


if __name__ == "__main__":
    main()
