"""Datasets and a model whose pipeline stages take known times (sleeps), for the X-ray tests.

Each process adds the time it really spent to its own row of a shared ``truth`` tensor
(row 0: the main process, row 1 + worker id: a worker), so the profiler's figures are
compared with what happened, not with the nominal sleeps (a loaded machine oversleeps).
Module level, so ``spawn`` workers can import it.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from pytorch_lightning import LightningModule
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset, get_worker_info

from lightning_speedpack.core.stages import stage

FETCH, FETCH_N, STAGE, STAGE_N, COLLATE, COLLATE_N = range(6)
FETCH_SLEEP, STAGE_SLEEP, COLLATE_SLEEP = 0.006, 0.008, 0.02


def _row() -> int:
    info = get_worker_info()
    return 0 if info is None else 1 + info.id


def new_truth() -> torch.Tensor:
    return torch.zeros(8, 6, dtype=torch.float64).share_memory_()


class SlowDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """A sleep in the fetch and a sleep in a named stage ``decode`` inside it."""

    def __init__(self, truth: torch.Tensor, n: int = 48) -> None:
        self.truth, self.n = truth, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = time.perf_counter()
        time.sleep(FETCH_SLEEP)
        with stage("decode"):
            s0 = time.perf_counter()
            time.sleep(STAGE_SLEEP)
            s1 = time.perf_counter()
        item = torch.full((4,), float(index)), torch.tensor(float(index))
        end = time.perf_counter()
        row = self.truth[_row()]
        row[FETCH] += end - start
        row[FETCH_N] += 1
        row[STAGE] += s1 - s0
        row[STAGE_N] += 1
        return item


class SlowStream(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """A stream whose ``__next__`` sleeps (split across workers)."""

    def __init__(self, truth: torch.Tensor, n: int = 48) -> None:
        self.truth, self.n = truth, n

    def __iter__(self) -> Any:
        info = get_worker_info()
        first, step = (0, 1) if info is None else (info.id, info.num_workers)
        for index in range(first, self.n, step):
            start = time.perf_counter()
            time.sleep(FETCH_SLEEP)
            item = torch.full((4,), float(index)), torch.tensor(float(index))
            row = self.truth[_row()]
            row[FETCH] += time.perf_counter() - start
            row[FETCH_N] += 1
            yield item


class SlowCollate:
    def __init__(self, truth: torch.Tensor) -> None:
        self.truth = truth

    def __call__(self, items: list[Any]) -> Any:
        start = time.perf_counter()
        time.sleep(COLLATE_SLEEP)
        out = torch.utils.data.default_collate(items)
        row = self.truth[_row()]
        row[COLLATE] += time.perf_counter() - start
        row[COLLATE_N] += 1
        return out


class PipelineModel(LightningModule):
    """A linear model whose loader is slow in known places; records the batches it saw."""

    def __init__(
        self,
        truth: torch.Tensor,
        workers: int = 0,
        context: str | None = None,
        persistent: bool = False,
        stream: bool = False,
        n: int = 48,
        step_sleep: float = 0.0,
    ) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.truth, self.workers, self.context = truth, workers, context
        self.persistent, self.stream, self.n, self.step_sleep = persistent, stream, n, step_sleep
        self.seen: list[list[float]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        self.seen.append(y.tolist())
        if self.step_sleep:
            time.sleep(self.step_sleep)
        return (self.layer(x).squeeze(-1) - y).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def make_loader(self) -> DataLoader[Any]:
        data: Any = (SlowStream if self.stream else SlowDataset)(self.truth, self.n)
        extra: dict[str, Any] = {}
        if self.workers:
            extra = {
                "multiprocessing_context": self.context,
                "persistent_workers": self.persistent,
            }
        return DataLoader(
            data,
            batch_size=8,
            num_workers=self.workers,
            collate_fn=SlowCollate(self.truth),
            **extra,
        )

    def train_dataloader(self) -> DataLoader[Any]:
        return self.make_loader()


class ColdDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """A costly ``__getitem__`` (``cost`` s: a sleep, or a busy loop when ``spin``): a decode."""

    def __init__(self, n: int, cost: float, spin: bool = False) -> None:
        self.n, self.cost, self.spin = n, cost, spin

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.spin:  # computes: CPU time ~ wall time
            end = time.process_time() + self.cost
            while time.process_time() < end:
                pass
        else:  # waits: no CPU
            time.sleep(self.cost)
        return torch.full((4,), float(index)), torch.tensor(float(index))


class StepModel(LightningModule):
    """A linear model whose step takes ``step_sleep`` s; trains on whatever loader it is given."""

    def __init__(self, loader: Any = None, step_sleep: float = 0.0) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.loader, self.step_sleep = loader, step_sleep
        self.loaders_built = 0

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        if self.step_sleep:
            time.sleep(self.step_sleep)
        return (self.layer(x).squeeze(-1) - y).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> Any:
        self.loaders_built += 1
        return self.loader() if callable(self.loader) else self.loader


class TwoOptimizerGAN(LightningModule):
    """Lightning's GAN pattern: manual optimization, two optimizers, ``toggle_optimizer``,
    ``training_step(self, batch)`` without ``batch_idx``."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.generator = torch.nn.Linear(8, 16)
        self.discriminator = torch.nn.Linear(16, 1)

    def training_step(self, batch: Any) -> None:
        (real,) = batch
        opt_g, opt_d = self.optimizers()  # type: ignore[misc]
        z = torch.randn(real.shape[0], 8)
        self.toggle_optimizer(opt_g)
        g_loss = -self.discriminator(self.generator(z)).mean()
        self.manual_backward(g_loss)
        opt_g.step()
        opt_g.zero_grad()
        self.untoggle_optimizer(opt_g)
        self.toggle_optimizer(opt_d)
        fake = self.generator(z).detach()
        d_loss = self.discriminator(fake).mean() - self.discriminator(real).mean()
        self.manual_backward(d_loss)
        opt_d.step()
        opt_d.zero_grad()
        self.untoggle_optimizer(opt_d)
        self.log("d_loss", d_loss)

    def configure_optimizers(self) -> Any:
        return [
            torch.optim.Adam(self.generator.parameters(), lr=1e-3),
            torch.optim.Adam(self.discriminator.parameters(), lr=1e-3),
        ]

    def train_dataloader(self) -> DataLoader[Any]:
        g = torch.Generator().manual_seed(0)
        return DataLoader(TensorDataset(torch.randn(256, 16, generator=g)), batch_size=32)


def fit(tmp_path: Any, model: Any, profiler: Any, **kw: Any) -> Any:
    """A quiet ``Trainer`` fit of ``model`` with ``profiler`` (unless ``callbacks`` is given)."""
    from pytorch_lightning import Trainer

    from tests.helpers.models import quiet_trainer_kwargs

    kwargs = quiet_trainer_kwargs(tmp_path, **kw)
    kwargs.setdefault("callbacks", [profiler])
    trainer = Trainer(**kwargs)
    trainer.fit(model)
    return trainer
