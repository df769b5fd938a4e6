"""Training steps run aside from the fit, with every piece of state they touch put back.

The machinery behind the batch-size tuner's trials, shared with any tool that must run real
training steps before the fit starts (e.g. measuring the model's own ceiling):

- :class:`StateSnapshot` copies what a trial may change -- parameters and buffers
  (bit-identical), gradients, train/eval modes, optimizer and LR-scheduler state, the torch,
  numpy, Python (and CUDA) RNG states -- to host memory, and puts it all back.
- :class:`TrialRunner` runs ``steps`` real training steps (forward, backward, optimizer step) on
  batches of the train dataloader, plus one validation step, and times them; on several ranks
  the ranks agree on the outcome through one small collective per trial.
- :func:`logging_disabled` makes ``self.log`` a no-op on the module while trials run.
"""

from __future__ import annotations

import copy
import random
import statistics
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lightning_speedpack.core.batch import BatchSizeError, infer_batch_size
from lightning_speedpack.core.lightning import combined_loader, is_overridden
from lightning_speedpack.core.memory import free_memory, is_oom_error

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = [
    "StateSnapshot",
    "TrialRunner",
    "dataloader_source",
    "dataset_length",
    "iterate_batches",
    "logging_disabled",
    "samples_in",
    "sync_device",
]


def dataloader_source(
    trainer: pl.Trainer, pl_module: pl.LightningModule, owner: str, error_type: type[Exception]
) -> Any:
    """Whose ``train_dataloader`` Lightning calls: the datamodule's when it defines one.

    Raises:
        error_type: the loader was passed to ``fit`` directly, so trials cannot rebuild it.
    """
    datamodule = getattr(trainer, "datamodule", None)
    if datamodule is not None and is_overridden("train_dataloader", datamodule):
        return datamodule
    if is_overridden("train_dataloader", pl_module):
        return pl_module
    raise error_type(
        f"{owner}: the train dataloader must come from `train_dataloader()` of the "
        "LightningModule or the datamodule (dataloaders passed to `fit` cannot be rebuilt)"
    )


def dataset_length(loaders: Any) -> int | None:
    """The length of the loader's dataset, or ``None`` (an ``IterableDataset`` has none)."""
    dataset = getattr(loaders, "dataset", None)
    try:
        return len(dataset) if dataset is not None else None  # type: ignore[arg-type]
    except TypeError:  # an IterableDataset without __len__
        return None


def iterate_batches(loaders: Any) -> Iterator[Any]:
    """Yield batches of one loader, or of several combined the way Lightning combines them."""
    if isinstance(loaders, (Mapping, list, tuple)):  # several loaders: Lightning combines them
        for batch, _, _ in combined_loader(loaders):
            yield batch
    else:
        yield from loaders


def samples_in(batch: Any, default: int) -> int:
    """The number of samples in ``batch`` (from shapes, no device sync), else ``default``."""
    try:
        return infer_batch_size(batch)  # shape only, no device sync
    except BatchSizeError:
        return default


def sync_device(device: torch.device) -> None:
    """Wait for a CUDA device (trials only, around a timed step); a no-op elsewhere."""
    if device.type == "cuda":  # in trials only, around each timed step
        torch.cuda.synchronize(device)


class TrialRunner:
    """Runs one trial: real training steps (and one validation step) at the current size."""

    def __init__(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        source: Any,
        steps: int,
        *,
        owner: str,
        error_type: type[Exception] = RuntimeError,
    ) -> None:
        self.trainer, self.module, self.source, self.steps = trainer, pl_module, source, steps
        self.owner, self.error_type = owner, error_type
        self.optimizer = trainer.optimizers[0]
        self.has_val = trainer.limit_val_batches != 0 and is_overridden("val_dataloader", source)

    def __call__(self, size: int) -> tuple[bool, float | None]:
        """Run one trial at ``size``; return (fits on every rank, mean samples/s or None)."""
        error: BaseException | None = None
        speed: float | None = None
        try:
            speed = self._train(size)
            if self.has_val:
                self._validate()
            fits = True
        except Exception as err:
            fits = False
            if not is_oom_error(err):
                if self.trainer.world_size == 1:
                    raise  # unchanged, with its traceback
                error = err
        finally:
            self.optimizer.zero_grad(set_to_none=True)
        if not fits:
            free_memory()
        if self.trainer.world_size > 1:
            return self._agree(fits, speed, error)
        return fits, speed

    def _agree(
        self, fits: bool, speed: float | None, error: BaseException | None
    ) -> tuple[bool, float | None]:
        # One small collective per trial: how many ranks fit, how many failed otherwise, and
        # the sum of their samples/s (so every rank sees the same mean and decides the same).
        strategy, world = self.trainer.strategy, self.trainer.world_size
        votes = torch.tensor(
            [float(fits), float(error is not None), speed or 0.0],
            dtype=torch.float64,
            device=strategy.root_device,
        )
        total = strategy.reduce(votes, reduce_op="sum")
        n_fit, n_failed, speed_sum = total.tolist()
        if error is not None:
            raise error
        if n_failed:
            raise self.error_type(
                f"{self.owner}: {round(n_failed)} other rank(s) raised an error during a trial; "
                "see their traceback"
            )
        agreed = round(n_fit) == world
        return agreed, (speed_sum / world if agreed and speed is not None else None)

    def _train(self, size: int) -> float | None:
        """Run the training steps; return samples/s of the steps after the first (warm-up)."""
        strategy, module = self.trainer.strategy, self.module
        precision = self.trainer.precision_plugin
        module.train()
        batches = iterate_batches(self.source.train_dataloader())
        rates: list[float] = []
        for step in range(self.steps):
            try:
                batch = next(batches)
            except StopIteration:
                batches = iterate_batches(self.source.train_dataloader())
                batch = next(batches)
            if step >= 1:  # time transfer and step only, not the loading of the batch
                sync_device(strategy.root_device)
                start = time.perf_counter()
            batch = strategy.batch_to_device(batch)
            with precision.train_step_context():
                # The LightningModule itself, not the DDP wrapper: no gradient all-reduce, so a
                # rank that runs out of memory cannot leave the others waiting in a collective.
                out = module.training_step(batch, step)
            loss = out.get("loss") if isinstance(out, Mapping) else out
            if isinstance(loss, torch.Tensor):
                loss.backward()  # type: ignore[no-untyped-call]
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            if step >= 1:
                sync_device(strategy.root_device)
                seconds = max(time.perf_counter() - start, 1e-9)
                rates.append(samples_in(batch, size) / seconds)
            del batch, out, loss
        # the median step: one step slowed down by another process does not decide
        return statistics.median(rates) if rates else None

    def _validate(self) -> None:
        module, precision = self.module, self.trainer.precision_plugin
        batch = next(iterate_batches(self.source.val_dataloader()), None)
        if batch is None:
            return
        batch = self.trainer.strategy.batch_to_device(batch)
        module.eval()
        try:
            with torch.no_grad(), precision.val_step_context():
                module.validation_step(batch, 0)
        finally:
            module.train()


@contextmanager
def logging_disabled(pl_module: pl.LightningModule) -> Iterator[None]:
    """Make ``self.log``/``self.log_dict`` no-ops on this one module during the trials."""

    def no_log(*args: Any, **kwargs: Any) -> None:
        return None

    names = ("log", "log_dict")
    shadowed = {name: pl_module.__dict__[name] for name in names if name in pl_module.__dict__}
    for name in names:
        object.__setattr__(pl_module, name, no_log)
    try:
        yield
    finally:
        for name in names:
            if name in shadowed:
                object.__setattr__(pl_module, name, shadowed[name])
            else:
                object.__delattr__(pl_module, name)


def _cpu_copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, Mapping):
        return {k: _cpu_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cpu_copy(v) for v in value)
    return copy.deepcopy(value)


@dataclass
class StateSnapshot:
    """What the trials may change, copied to host memory (so it does not take device memory)."""

    tensors: list[tuple[torch.Tensor, torch.Tensor]]
    grads: list[tuple[torch.nn.Parameter, torch.Tensor | None]]
    modes: list[tuple[torch.nn.Module, bool]]
    optimizers: list[tuple[torch.optim.Optimizer, dict[str, Any]]]
    schedulers: list[tuple[Any, dict[str, Any]]]
    rng: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def take(cls, trainer: pl.Trainer, pl_module: pl.LightningModule) -> StateSnapshot:
        """Copy the state of ``pl_module`` and the trainer's optimizers to host memory."""
        tensors = [*pl_module.parameters(), *pl_module.buffers()]
        params = list(pl_module.parameters())
        rng: dict[str, Any] = {
            "torch": torch.get_rng_state(),
            "numpy": np.random.get_state(),
            "python": random.getstate(),
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            rng["cuda"] = torch.cuda.get_rng_state_all()
        return cls(
            tensors=[(t, _cpu_copy(t)) for t in tensors],
            grads=[(p, None if p.grad is None else _cpu_copy(p.grad)) for p in params],
            modes=[(m, m.training) for m in pl_module.modules()],
            optimizers=[(o, _cpu_copy(o.state_dict())) for o in trainer.optimizers],
            schedulers=[
                (c.scheduler, copy.deepcopy(c.scheduler.state_dict()))
                for c in trainer.lr_scheduler_configs
            ],
            rng=rng,
        )

    def restore_grads(self) -> None:
        """Put back the gradients only (between trials)."""
        for param, grad in self.grads:
            param.grad = None if grad is None else grad.to(param.device)

    def restore(self) -> None:
        """Put back everything that was copied."""
        with torch.no_grad():
            for tensor, saved in self.tensors:
                tensor.copy_(saved)
        self.restore_grads()
        for module, training in self.modes:
            module.training = training
        for optimizer, state in self.optimizers:
            optimizer.load_state_dict(state)
        for scheduler, state in self.schedulers:
            scheduler.load_state_dict(state)
        torch.set_rng_state(self.rng["torch"])
        np.random.set_state(self.rng["numpy"])
        random.setstate(self.rng["python"])
        if "cuda" in self.rng:
            torch.cuda.set_rng_state_all(self.rng["cuda"])
