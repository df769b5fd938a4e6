"""BatchSizeTuner against Lightning's BatchSizeFinder, and its throughput mode against a full sweep.

1. Same model, same injected memory limit (``training_step`` raises ``torch.OutOfMemoryError``
   above N samples): trial steps, wall time to decide, the size chosen, whether it is a multiple
   of 8 -- ``BatchSizeTuner(mode="max")`` vs ``BatchSizeFinder(mode="binsearch")``, both with
   ``steps_per_trial=3`` and ``margin=0.05``.
2. ``BatchSizeTuner(mode="throughput")`` on a CPU model whose samples/s peak below the memory limit
   (a contrastive-style loss whose cost grows with batch size squared) against an exhaustive sweep
   of every multiple of 8 up to the limit: the samples/s of the chosen size relative to the best.

Times are medians of alternating repeats in one process; only ratios are meaningful.

Run: ``.venv/bin/python benchmarks/batch_size.py [--quick]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from pytorch_lightning import Callback, LightningModule, Trainer
from pytorch_lightning.callbacks import BatchSizeFinder
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).parent))
from _common import alternate, print_table, quiet_trainer

from lightning_speedpack import BatchSizeTuner


class LimitedMLP(LightningModule):
    """A small MLP whose ``training_step`` runs out of memory above ``limit`` samples."""

    def __init__(self, limit: int, n: int = 8192, width: int = 32) -> None:
        super().__init__()
        self.limit, self.batch_size = limit, 2
        self.steps = 0
        self.net = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1))
        g = torch.Generator().manual_seed(0)
        self.data = TensorDataset(
            torch.randn(n, width, generator=g), torch.randn(n, 1, generator=g)
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        self.steps += 1
        if x.shape[0] > self.limit:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. (injected: {x.shape[0]} > {self.limit})"
            )
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.data, batch_size=self.batch_size)


class DecisionTimer(Callback):
    """Wall time from ``setup`` (before any tuner runs) to the start of training."""

    def __init__(self) -> None:
        self.start = self.seconds = 0.0

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.start = time.perf_counter()

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.seconds = time.perf_counter() - self.start


def decide(kind: str, limit: int) -> tuple[float, int, str]:
    """Return (seconds to decide, trial steps, chosen size) for one tuner on a fresh model.

    The chosen size is marked "(OOM)" when the real training step after tuning ran out of memory.
    """
    timer = DecisionTimer()
    tuner: Callback = (
        BatchSizeTuner(mode="max", steps_per_trial=3, margin=0.05, verbose=False)
        if kind == "speedpack"
        else BatchSizeFinder(mode="binsearch", steps_per_trial=3, margin=0.05)
    )
    model = LimitedMLP(limit)
    with tempfile.TemporaryDirectory() as root, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # BatchSizeFinder writes a checkpoint under the root dir
        trainer = quiet_trainer(callbacks=[timer, tuner], max_steps=1, default_root_dir=root)
        try:
            trainer.fit(model)
        except torch.OutOfMemoryError:
            return timer.seconds, model.steps - 1, f"{model.batch_size} (OOM)"
    return timer.seconds, model.steps - 1, str(model.batch_size)  # minus the one real step


def _multiple_of_8(chosen: str) -> str:
    return "yes" if int(chosen.split()[0]) % 8 == 0 else "no"


def compare_with_lightning(limits: list[int], repeats: int) -> None:
    rows = []
    for limit in limits:
        results: dict[str, tuple[float, int, str]] = {}

        def run(kind: str, limit: int = limit, results: dict[str, Any] = results) -> float:
            results[kind] = decide(kind, limit)
            return float(results[kind][0])

        medians = alternate(
            {"speedpack": lambda: run("speedpack"), "lightning": lambda: run("lightning")},
            repeats=repeats,
        )
        ours, theirs = results["speedpack"], results["lightning"]
        rows.append(
            [
                limit,
                ours[1],
                theirs[1],
                ours[2],
                theirs[2],
                _multiple_of_8(ours[2]),
                _multiple_of_8(theirs[2]),
                medians["speedpack"] / medians["lightning"],
            ]
        )
    print_table(
        "Injected memory limit N: BatchSizeTuner(max) vs BatchSizeFinder(binsearch)",
        [
            "N",
            "trial steps (ours)",
            "trial steps (Lightning)",
            "chosen (ours)",
            "chosen (Lightning)",
            "ours multiple of 8",
            "Lightning multiple of 8",
            "time to decide ours/Lightning",
        ],
        rows,
    )


class Contrastive(LightningModule):
    """A contrastive loss over all pairs in the batch plus a large head on a batch summary.

    Per step: a fixed cost (the 1M-parameter head's backward and optimizer step), a cost linear
    in the batch size B (the encoder) and one quadratic in B (the B x B similarities), so the
    samples/s peak at a batch size well below the injected memory limit.
    """

    def __init__(self, limit: int, n: int = 4096, width: int = 64, proj: int = 256) -> None:
        super().__init__()
        self.limit, self.batch_size = limit, 8
        self.encoder = nn.Sequential(nn.Linear(width, proj), nn.ReLU(), nn.Linear(proj, proj))
        self.head = nn.Linear(1024, 1024)
        g = torch.Generator().manual_seed(0)
        self.data = TensorDataset(torch.randn(n, width, generator=g))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        if x.shape[0] > self.limit:
            raise torch.OutOfMemoryError("CUDA out of memory. (injected)")
        z = nn.functional.normalize(self.encoder(x), dim=1)
        logits = z @ z.T / 0.1  # B x B similarities: the quadratic part
        mixed = logits.softmax(dim=1) @ z
        summary = torch.cat([mixed.mean(dim=0)] * (1024 // z.shape[1]))
        labels = torch.arange(x.shape[0])
        return nn.functional.cross_entropy(logits, labels) + 1e-3 * self.head(summary).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.data, batch_size=self.batch_size)


def samples_per_sec(model: Contrastive, size: int, steps: int = 5) -> float:
    """Compute-only samples/s at ``size`` as the tuner measures it: median step after a warm-up."""
    optimizer = model.configure_optimizers()
    data = model.data.tensors[0]
    rates = []
    for i in range(steps + 1):
        batch = (data[(i * size) % len(data) :][:size],)
        start = time.perf_counter()
        loss = model.training_step(batch, i)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if i:
            rates.append(size / (time.perf_counter() - start))
    return statistics.median(rates)


def throughput_vs_sweep(limit: int, sweep_step: int, repeats: int) -> None:
    chosen: list[int] = []
    for r in range(repeats):
        tuner = BatchSizeTuner(mode="throughput", steps_per_trial=4, verbose=False)
        trainer = quiet_trainer(callbacks=[tuner], max_steps=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(Contrastive(limit))
        assert tuner.batch_size is not None
        chosen.append(tuner.batch_size)
        measured = ", ".join(
            f"{t.batch_size}: {t.samples_per_sec:.0f}" for t in tuner.trials if t.samples_per_sec
        )
        print(f"tuner run {r}: measured (size: samples/s) {measured} -> chose {tuner.batch_size}")
    # The sweep measures every size (and the chosen ones) the same way, in alternating order.
    model = Contrastive(limit)
    sizes = sorted(set(range(8, limit + 1, sweep_step)) | set(chosen))
    speeds: dict[int, list[float]] = {s: [] for s in sizes}
    for r in range(repeats + 2):
        for size in sizes if r % 2 == 0 else sizes[::-1]:
            speeds[size].append(samples_per_sec(model, size))
    median = {s: statistics.median(v) for s, v in speeds.items()}
    best = max(median, key=lambda s: median[s])
    rows = [
        [
            size,
            chosen.count(size),
            best,
            median[size] / median[best],
            "yes" if median[size] >= 0.95 * median[best] else "no",
        ]
        for size in sorted(set(chosen))
    ]
    print_table(
        f"Throughput mode vs exhaustive sweep (every {sweep_step} up to N={limit}, "
        f"{repeats} tuner runs, sweep medians of {repeats + 2} rounds)",
        [
            "chosen size",
            "times chosen",
            "sweep's fastest size",
            "chosen samples/s / best",
            "within 5%",
        ],
        rows,
    )
    top = sorted(median, key=lambda s: -median[s])[:5]
    print("\nsweep's top five (size: samples/s):", ", ".join(f"{s}: {median[s]:.0f}" for s in top))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repeats (< 60 s)")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)  # steadier timings on a shared machine
    if args.quick:
        compare_with_lightning([700], repeats=3)
        throughput_vs_sweep(limit=512, sweep_step=48, repeats=1)
    else:
        compare_with_lightning([100, 700, 1000, 3000, 5000], repeats=5)
        throughput_vs_sweep(limit=768, sweep_step=8, repeats=3)


if __name__ == "__main__":
    main()
