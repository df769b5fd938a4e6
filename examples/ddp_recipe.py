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

``torchrun`` (one process per device, started by torchrun; ``--devices`` and ``--nodes``
default to what the launcher set: ``LOCAL_WORLD_SIZE`` and ``WORLD_SIZE / LOCAL_WORLD_SIZE``)::

    torchrun --nproc_per_node 2 examples/ddp_recipe.py

Two nodes simulated on one host (two torchrun agents, each a node of two ranks, one world of
four; each node reads its identity from ``GROUP_RANK`` and fills its own cache)::

    PORT=29511
    torchrun --nnodes 2 --nproc_per_node 2 --node_rank 0 --master_addr 127.0.0.1 \
        --master_port $PORT examples/ddp_recipe.py &
    torchrun --nnodes 2 --nproc_per_node 2 --node_rank 1 --master_addr 127.0.0.1 \
        --master_port $PORT examples/ddp_recipe.py

Several nodes, SLURM (one task per device; Lightning reads the SLURM environment)::

    srun --nodes 2 --ntasks-per-node 2 python examples/ddp_recipe.py --devices 2 --nodes 2
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
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

    def __init__(
        self,
        dataset: Dataset[Any],
        batch_size: int = 16,
        workers: int = 1,
        start_method: str | None = None,
    ) -> None:
        super().__init__()
        self.model = SmallCNN()
        self.dataset = dataset
        self.batch_size = batch_size
        self.workers = workers
        self.start_method = start_method

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
            multiprocessing_context=self.start_method if self.workers > 0 else None,
        )


def launcher_layout() -> tuple[int | None, int | None]:
    """(devices per node, nodes) as an external launcher set them, else (None, None).

    ``torchrun`` sets ``LOCAL_WORLD_SIZE`` and ``WORLD_SIZE``; ``srun`` sets
    ``SLURM_NTASKS_PER_NODE`` and ``SLURM_NNODES``. Lightning needs ``devices * num_nodes`` to equal
    the world size the launcher started, so the recipe takes them from there by default.
    """
    env = os.environ
    if env.get("LOCAL_WORLD_SIZE") and env.get("WORLD_SIZE"):
        per_node = int(env["LOCAL_WORLD_SIZE"])
        return per_node, max(1, int(env["WORLD_SIZE"]) // per_node)
    if env.get("SLURM_NTASKS_PER_NODE") and env.get("SLURM_NNODES"):
        return int(env["SLURM_NTASKS_PER_NODE"].split("(")[0]), int(env["SLURM_NNODES"])
    return None, None


def prepare_jpegs(data_dir: Path, n: int) -> None:
    """Write the JPEGs once, atomically: into a private folder renamed into place when complete.

    Several writers may race (two simulated nodes on one host, or nodes sharing a network file
    system, each with its own local rank 0): the first rename wins, the others discard their copy.
    An existing incomplete folder (an interrupted earlier run) is completed in place.
    """
    if (data_dir / f".complete-{n}-0").exists():
        return
    if data_dir.exists():
        write_jpegs(data_dir, n)
        return
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    private = Path(tempfile.mkdtemp(prefix=f".{data_dir.name}-", dir=data_dir.parent))
    try:
        write_jpegs(private, n)
        os.rename(private, data_dir)  # atomic; fails if another writer got there first
    except OSError:
        wait_for_jpegs(data_dir, n)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def warm_cache(dataset: Dataset[Any]) -> None:
    """Decode every sample once into this node's cache before training.

    The node's local ranks split the work (every ``LOCAL_WORLD_SIZE``-th index each). A rank
    reads only its shard in an epoch, so without this a node's cache fills over several epochs;
    with it, the first epoch is as fast as the next.
    """
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    for index in range(local_rank, len(dataset), local_size):  # type: ignore[arg-type]
        dataset[index]


def rank_samples_per_sec(throughput: pl.Callback) -> float:
    """This rank's own samples/s (ThroughputLogger's figures are the world's: the sum of these)."""
    totals = throughput.state_dict()["totals"]
    return float(totals["samples"] / totals["train_seconds"]) if totals["train_seconds"] else 0.0


def main() -> None:
    parser = common_args(__doc__.splitlines()[0])
    parser.add_argument("--strategy", default="ddp_speedpack", help="ddp or ddp_speedpack")
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument(
        "--devices", type=int, default=None, help="per node; default: the launcher's, else 2"
    )
    parser.add_argument("--nodes", type=int, default=None, help="default: the launcher's, else 1")
    parser.add_argument("--max-batch", type=int, default=64, help="BatchSizeTuner max_val")
    parser.add_argument("--workers", type=int, default=1, help="DataLoader workers per rank")
    parser.add_argument(
        "--worker-start-method",
        choices=["fork", "spawn", "forkserver"],
        default=None,
        help="DataLoader workers' multiprocessing context (default: the platform's)",
    )
    parser.add_argument(
        "--warm-cache",
        action="store_true",
        help="decode every sample into each node's cache before training (local ranks split it)",
    )
    parser.set_defaults(images=256, epochs=2)
    args = parser.parse_args()
    launched_devices, launched_nodes = launcher_layout()
    devices = args.devices or launched_devices or 2
    nodes = args.nodes or launched_nodes or 1
    out: Path = args.out.resolve()
    # Local rank 0 writes the JPEGs; the other ranks (started by torchrun or SLURM at the same
    # time, or by Lightning's launcher later) wait until the set is complete.
    data_dir = args.data_dir or Path(tempfile.gettempdir()) / f"speedpack-recipe-{args.images}"
    if os.environ.get("LOCAL_RANK", "0") == "0":
        prepare_jpegs(data_dir, args.images)
    else:
        wait_for_jpegs(data_dir, args.images)
    dataset = CachedDataset(JpegDataset(data_dir), transform=random_flip, key="ddp-recipe")
    if args.warm_cache:
        warm_cache(dataset)

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
        devices=devices,
        num_nodes=nodes,
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
    trainer.fit(
        RecipeClassifier(dataset, workers=args.workers, start_method=args.worker_start_method)
    )

    # What each component saw on this rank (the recipe's test reads these files).
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "node_rank": trainer.node_rank,
        "strategy": type(trainer.strategy).__name__,
        "cache": dataclasses.asdict(dataset.cache_info()),
        "cache_path": dataset.cache_path,
        "rank_samples_per_sec": rank_samples_per_sec(callbacks[1]),
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
        items = dataset.cache_info().items
        world = summary["callbacks"]["ThroughputLogger"]["figures"].get("samples_per_sec", 0.0)
        print(
            f"CachedDataset: {items} of {len(dataset)} cached on node {trainer.node_rank}; "
            f"world {world:.1f} samples/s"
        )
        finish_wandb(trainer)


if __name__ == "__main__":
    main()
