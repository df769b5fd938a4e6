"""DDP recipe: the whole pack on several processes, logging world throughput to W&B.

Every component works per rank; this is what each does under DDP:

* ``CachedDataset``: all ranks of a node attach to one shared-memory arena (local rank 0 creates
  it); each sample is decoded once for the whole node.
* ``BatchSizeTuner``: every rank tries the same sizes; one small collective per trial agrees on
  "fits on all ranks", so the chosen size is identical everywhere.
* ``ThroughputLogger``: each rank counts its own samples; on logging steps one small collective
  sums them, and rank 0 logs world samples/s (not rank 0 x world size).
* ``SyncPointWarnings`` and ``LossRetentionDetector``: each rank records its own findings;
  rank 0 prints.
* ``SpeedAdvisor``: checks run on every rank; rank 0 prints the table.

Single node, Lightning's own launcher (it starts the other ranks itself)::

    python examples/ddp_recipe.py --devices 2 --strategy ddp_speedpack

``torchrun`` (one process per device, started by torchrun)::

    torchrun --nproc_per_node 2 examples/ddp_recipe.py --devices 2

Several nodes, SLURM (one task per device; Lightning reads the SLURM environment)::

    srun --nodes 2 --ntasks-per-node 2 python examples/ddp_recipe.py --devices 2 --nodes 2
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from jpeg_common import (
    JpegDataset,
    SmallCNN,
    common_args,
    finish_wandb,
    to_float,
    wait_for_jpegs,
    wandb_logger,
    write_jpegs,
)
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

from lightning_speedpack import (
    BatchSizeTuner,
    CachedDataset,
    LossRetentionDetector,
    SpeedAdvisor,
    SyncPointWarnings,
    ThroughputLogger,
)


def random_flip(sample: tuple[torch.Tensor, int]) -> tuple[torch.Tensor, int]:
    """Random augmentation, after the cache."""
    pixels, label = sample
    return (pixels.flip(-1) if torch.rand(()) < 0.5 else pixels), label


class RecipeClassifier(pl.LightningModule):
    """The demo CNN; ``batch_size`` is the attribute ``BatchSizeTuner`` sets."""

    def __init__(self, dataset: Dataset[Any], batch_size: int = 16, workers: int = 1) -> None:
        super().__init__()
        self.model = SmallCNN()
        self.dataset = dataset
        self.batch_size = batch_size
        self.workers = workers

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        pixels, labels = batch
        loss = F.cross_entropy(self.model(to_float(pixels)), labels)
        self.log("train_loss", loss, sync_dist=False)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    def train_dataloader(self) -> DataLoader[Any]:
        # Lightning adds the DistributedSampler: each rank reads its own shard.
        return DataLoader(
            self.dataset,
            batch_size=self.batch_size,
            shuffle=True,
            num_workers=self.workers,
            persistent_workers=self.workers > 0,
            pin_memory=torch.cuda.is_available(),
        )


def main() -> None:
    parser = common_args(__doc__.splitlines()[0])
    parser.add_argument("--strategy", default="ddp_speedpack", help="ddp or ddp_speedpack")
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--max-batch", type=int, default=64, help="BatchSizeTuner max_val")
    parser.set_defaults(images=256, epochs=2)
    args = parser.parse_args()
    out: Path = args.out.resolve()
    # Local rank 0 writes the JPEGs; the other ranks (started by torchrun or SLURM at the same
    # time, or by Lightning's launcher later) wait until the set is complete.
    data_dir = args.data_dir or Path(tempfile.gettempdir()) / f"speedpack-recipe-{args.images}"
    if os.environ.get("LOCAL_RANK", "0") == "0":
        write_jpegs(data_dir, args.images)
    else:
        wait_for_jpegs(data_dir, args.images)
    dataset = CachedDataset(JpegDataset(data_dir), transform=random_flip, key="ddp-recipe")

    callbacks: list[pl.Callback] = [
        BatchSizeTuner(max_val=args.max_batch, steps_per_trial=1),
        ThroughputLogger(window=5, log_every_n_steps=2),
        SyncPointWarnings(mode="summary", include_cpu=True),
        LossRetentionDetector(),
        SpeedAdvisor(measure_steps=4),
    ]
    logger = wandb_logger(out, "speedpack-ddp-recipe") if args.wandb else False
    trainer = pl.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        num_nodes=args.nodes,
        strategy=args.strategy,
        max_epochs=args.epochs,
        callbacks=callbacks,
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=2,
        default_root_dir=str(out),
    )
    trainer.fit(RecipeClassifier(dataset))

    # What each component saw on this rank (the recipe's test reads these files).
    out.mkdir(parents=True, exist_ok=True)
    summary = {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "strategy": type(trainer.strategy).__name__,
        "cache": dataclasses.asdict(dataset.cache_info()),
        "callbacks": {
            type(cb).__name__: {
                "figures": cb.doctor_figures(),  # type: ignore[attr-defined]
                "findings": [f.id for f in cb.doctor_findings()],  # type: ignore[attr-defined]
            }
            for cb in callbacks
        },
    }
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(summary, indent=2, default=str))
    if trainer.global_rank == 0:
        finish_wandb(trainer)


if __name__ == "__main__":
    main()
