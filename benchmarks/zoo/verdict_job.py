"""One planted training job for ``benchmarks/verdicts.py``: run it under ``speedpack doctor``.

``--case`` picks the pipeline; each is a plain Lightning script with nothing of the pack's
but (in the cached cases) ``CachedDataset``, as a user would write it:

- ``cached-light`` / ``cached-heavy``: a slow cold fetch (8 ms of CPU a sample, a decode)
  behind ``CachedDataset``, 2 persistent workers, an MLP light (1024x2) or heavy (1024x3):
  fast once warm. (On a 512x2 MLP the warm step waited ~20% of its time for batches handed
  over from the workers, astride the X-ray's line: its data-bound then was the run's truth.)
- ``memory``: in-memory tensors, no workers, an MLP (nothing for the loader to do).
- ``handover``: in-memory tensors, 2 workers, a tiny linear model: the step takes less than
  handing a batch over from a worker process (planted data-bound).
- ``cold-decode``: the same slow fetch, uncached, 2 workers, a light MLP (planted data-bound).
- ``zero-workers``: a 4 ms fetch in the training process (planted data-bound).
- ``slow-collate``: a 30 ms ``collate_fn`` a batch, 0 workers (planted data-bound).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset, default_collate

from lightning_speedpack import CachedDataset

DIM = 64


class Decoded(Dataset[tuple[torch.Tensor, int]]):
    """``cost`` seconds of CPU a sample (a decode), deterministic per index."""

    def __init__(self, n: int, cost: float) -> None:
        self.n, self.cost = n, cost

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        end = time.process_time() + self.cost
        while time.process_time() < end:
            pass
        g = torch.Generator().manual_seed(index)
        return torch.randn(DIM, generator=g), index % 10


def slow_collate(batch: list[Any]) -> Any:
    end = time.process_time() + 0.03
    while time.process_time() < end:
        pass
    return default_collate(batch)


class MLP(pl.LightningModule):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        layers: list[torch.nn.Module] = [torch.nn.Linear(DIM, width), torch.nn.ReLU()]
        for _ in range(depth - 1):
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        self.net = torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loader(case: str, n: int) -> DataLoader[Any]:
    if case in ("cached-light", "cached-heavy"):
        data: Any = CachedDataset(Decoded(n, 0.008))
        return DataLoader(data, batch_size=64, shuffle=True, num_workers=2, persistent_workers=True)
    if case == "memory":
        return DataLoader(Decoded(n, 0.0), batch_size=32, shuffle=True)
    if case == "handover":
        data = Decoded(n, 0.0)
        return DataLoader(data, batch_size=32, shuffle=True, num_workers=2, persistent_workers=True)
    if case == "cold-decode":
        data = Decoded(n, 0.008)
        return DataLoader(data, batch_size=32, shuffle=True, num_workers=2, persistent_workers=True)
    if case == "zero-workers":
        return DataLoader(Decoded(n, 0.004), batch_size=32, shuffle=True)
    if case == "slow-collate":
        return DataLoader(Decoded(n, 0.0), batch_size=32, collate_fn=slow_collate)
    raise SystemExit(f"unknown --case {case!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--case", required=True)
    parser.add_argument("--samples", type=int, default=640)
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    width, depth = {"cached-light": (1024, 2), "cached-heavy": (1024, 3), "handover": (8, 1)}.get(
        args.case, (512, 2)
    )
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(MLP(width, depth), loader(args.case, args.samples))


if __name__ == "__main__":
    main()
