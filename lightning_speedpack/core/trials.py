"""Training steps run aside from the fit, with every piece of state they touch put back.

The machinery behind the batch-size tuner's trials, shared with any tool that must run real
training steps before the fit starts (e.g. measuring the model's own ceiling):

- :class:`StateSnapshot` copies what a trial may change -- parameters and buffers
  (bit-identical), gradients, train/eval modes, optimizer and LR-scheduler state, the torch,
  numpy, Python (and CUDA) RNG states, the accumulated state of torchmetrics metrics -- to host
  memory, and puts it all back. A trial runs the user's ``training_step``: whatever else it
  touches (a global counter, a file it writes, a logger it calls directly rather than through
  ``self.log``) is touched by the trial too.
- :class:`TrialRunner` runs ``steps`` real training steps (forward, backward, optimizer step) on
  batches of the train dataloader, plus one validation step, and times them; on several ranks
  the ranks agree on the outcome through one small, time-bounded collective per trial.
- :func:`main_process_loading` draws a trial's batches in the calling process: no DataLoader
  worker pool is forked per trial (see :class:`TrialRunner` for why).
- :func:`logging_disabled` makes ``self.log`` a no-op on the module while trials run.
"""

from __future__ import annotations

import copy
import random
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lightning_speedpack.core.batch import BatchSizeError, infer_batch_size
from lightning_speedpack.core.collectives import (
    CollectiveTimeoutError,
    bounded_all_reduce,
    collective_timeout,
)
from lightning_speedpack.core.lightning import combined_loader, is_overridden, takes_batch_idx
from lightning_speedpack.core.memory import free_memory, is_oom_error
from lightning_speedpack.core.nested import leaves

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = [
    "StateSnapshot",
    "StepTiming",
    "TrialRunner",
    "dataloader_source",
    "dataset_length",
    "iterate_batches",
    "logging_disabled",
    "main_process_loading",
    "run_training_steps",
    "samples_in",
    "sync_device",
    "time_training_steps",
    "train_step",
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


@contextmanager
def main_process_loading(loaders: Any) -> Iterator[Any]:
    """Load in this process: ``num_workers=0`` on every DataLoader in ``loaders``, then put back.

    ``loaders`` is one DataLoader or a (nested) mapping/list/tuple of them, as a
    ``train_dataloader()`` returns them; other iterables are left as they are. A DataLoader
    allows ``num_workers`` to change after construction (unlike its batch size or sampler); the
    sampler, collate function, ``pin_memory`` and the random numbers drawn for the iterator
    are the same in both modes. ``worker_init_fn`` is not called (there is no worker).

    Example:
        >>> from torch.utils.data import DataLoader
        >>> loader = DataLoader(range(8), batch_size=4, num_workers=2)
        >>> with main_process_loading(loader):
        ...     [batch.tolist() for batch in loader], loader.num_workers
        ([[0, 1, 2, 3], [4, 5, 6, 7]], 0)
        >>> loader.num_workers
        2
    """
    changed: list[tuple[torch.utils.data.DataLoader[Any], int]] = []
    try:
        for loader in leaves(loaders, torch.utils.data.DataLoader):
            if loader.num_workers > 0:
                changed.append((loader, loader.num_workers))
                loader.num_workers = 0
        yield loaders
    finally:
        for loader, workers in reversed(changed):
            loader.num_workers = workers


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
    """Runs one trial: real training steps (and one validation step) at the current size.

    Batches are drawn in this process. A trial needs ``steps`` batches from a loader built for
    its size, so a DataLoader with ``num_workers > 0`` would fork a fresh worker pool for every
    trial -- while other threads are alive (W&B's, the previous iterator's queue feeders,
    Lightning's child-process observer, the NVML sampler). A fork taken while another thread
    holds a lock can leave the child deadlocked inside ``fork`` itself, and the rank waiting on
    it hangs; that was seen in practice (issue 12). Reusing one pool is impossible (each trial's
    loader has another batch size, which a DataLoader cannot change) and a ``spawn`` pool per
    trial costs seconds of start-up each. Loading is not part of the timed step (only transfer
    and step are timed), so :func:`main_process_loading` sets ``num_workers=0`` on the trial's
    loaders for the trial and puts the value back: the user's loader is unchanged afterwards
    and the fit's own loader starts its workers once, as without the tuner. Loaders that are not
    ``torch.utils.data.DataLoader`` objects are iterated as they are.

    On several ranks the outcome is agreed through one all-reduce per trial, bounded by
    ``collective_timeout`` seconds (:func:`~lightning_speedpack.core.collectives.
    collective_timeout`): a rank that died or is stuck makes the others raise
    :class:`~lightning_speedpack.core.collectives.CollectiveTimeoutError` naming the owner, the
    batch size and the trial, instead of waiting for ever.

    Args:
        trainer: the trainer (its strategy, precision plugin and first optimizer are used).
        pl_module: the LightningModule whose ``training_step`` runs.
        source: whose ``train_dataloader()`` (and ``val_dataloader()``) build the batches.
        steps: training steps per trial.
        owner: the callback's name, for error messages.
        error_type: the exception raised when another rank failed.
        collective_timeout: seconds to wait for the other ranks at each agreement (``None``:
            the pack's default, see :func:`~lightning_speedpack.core.collectives.
            collective_timeout`).
    """

    def __init__(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        source: Any,
        steps: int,
        *,
        owner: str,
        error_type: type[Exception] = RuntimeError,
        collective_timeout: float | None = None,
    ) -> None:
        self.trainer, self.module, self.source, self.steps = trainer, pl_module, source, steps
        self.owner, self.error_type = owner, error_type
        self.optimizer = trainer.optimizers[0]
        self.has_val = trainer.limit_val_batches != 0 and is_overridden("val_dataloader", source)
        self.collective_timeout = collective_timeout
        self.trial = 0  # trials run so far (for messages)

    def __call__(self, size: int) -> tuple[bool, float | None]:
        """Run one trial at ``size``; return (fits on every rank, mean samples/s or None)."""
        self.trial += 1
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
            return self._agree(size, fits, speed, error)
        return fits, speed

    def _agree(
        self, size: int, fits: bool, speed: float | None, error: BaseException | None
    ) -> tuple[bool, float | None]:
        # One small collective per trial: how many ranks fit, how many failed otherwise, and
        # the sum of their samples/s (so every rank sees the same mean and decides the same).
        strategy, world = self.trainer.strategy, self.trainer.world_size
        votes = torch.tensor(
            [float(fits), float(error is not None), speed or 0.0],
            dtype=torch.float64,
            device=strategy.root_device,
        )
        total = self._reduce(votes, size, error)
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

    def _reduce(self, votes: torch.Tensor, size: int, error: BaseException | None) -> torch.Tensor:
        if not torch.distributed.is_initialized():  # another launcher: the strategy's reduce
            return self.trainer.strategy.reduce(votes, reduce_op="sum")  # type: ignore[no-any-return]
        what = f"{self.owner}: rank agreement for batch size {size} (trial {self.trial})"
        try:
            return bounded_all_reduce(
                votes, timeout_s=collective_timeout(self.collective_timeout), what=what
            )
        except CollectiveTimeoutError as err:
            if error is not None:  # this rank's own error is the cause: raise that one
                raise error from err
            raise

    def _open(self, stack: ExitStack, make: Any) -> Iterator[Any]:
        return iterate_batches(stack.enter_context(main_process_loading(make())))

    def _train(self, size: int) -> float | None:
        """Run the training steps; return samples/s of the steps after the first (warm-up)."""
        with ExitStack() as stack:
            return self._train_steps(size, stack)

    def _train_steps(self, size: int, stack: ExitStack) -> float | None:
        strategy, module = self.trainer.strategy, self.module
        module.train()
        batches = self._open(stack, self.source.train_dataloader)
        rates: list[float] = []
        for step in range(self.steps):
            try:
                batch = next(batches)
            except StopIteration:
                batches = self._open(stack, self.source.train_dataloader)
                batch = next(batches)
            if step >= 1:  # time transfer and step only, not the loading of the batch
                sync_device(strategy.root_device)
                start = time.perf_counter()
            batch = strategy.batch_to_device(batch)
            train_step(self.trainer, module, self.optimizer, batch, step)
            if step >= 1:
                sync_device(strategy.root_device)
                seconds = max(time.perf_counter() - start, 1e-9)
                rates.append(samples_in(batch, size) / seconds)
            del batch
        # the median step: one step slowed down by another process does not decide
        return statistics.median(rates) if rates else None

    def _validate(self) -> None:
        module, precision = self.module, self.trainer.precision_plugin
        with main_process_loading(self.source.val_dataloader()) as loaders:
            batch = next(iterate_batches(loaders), None)
        if batch is None:
            return
        batch = self.trainer.strategy.batch_to_device(batch)
        module.eval()
        try:
            with torch.no_grad(), precision.val_step_context():
                module.validation_step(batch, 0)
        finally:
            module.train()


def train_step(
    trainer: pl.Trainer,
    pl_module: pl.LightningModule,
    optimizer: torch.optim.Optimizer,
    batch: Any,
    batch_idx: int,
) -> torch.Tensor | None:
    """One real training step on a batch already on the device: forward, backward, step.

    The LightningModule itself runs, not the DDP wrapper: no gradient all-reduce, so a rank
    that runs out of memory cannot leave the others waiting in a collective. Under manual
    optimization (``automatic_optimization = False``: a GAN's two optimizers,
    ``toggle_optimizer``) the step does its own backward and optimizer steps, as in the fit.
    ``training_step(self, batch)`` without ``batch_idx`` is called as Lightning calls it.

    Returns:
        the loss, detached (no sync: still on the device), or None under manual optimization
        or when ``training_step`` returned no loss.
    """
    args = (batch, batch_idx) if takes_batch_idx(pl_module) else (batch,)
    with trainer.precision_plugin.train_step_context():
        out = pl_module.training_step(*args)
    if not pl_module.automatic_optimization:
        for each in trainer.optimizers:
            each.zero_grad(set_to_none=True)
        return None
    loss = out.get("loss") if isinstance(out, Mapping) else out
    if isinstance(loss, torch.Tensor):
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach() if isinstance(loss, torch.Tensor) else None


@dataclass
class StepTiming:
    """What :func:`run_training_steps` measured.

    Attributes:
        seconds: wall time of the timed steps.
        samples: samples the timed steps processed.
        steps: timed steps.
        first_seconds: wall time of the untimed warm-up steps (a compile happens there).
        losses: every step's loss (warm-up included) as floats, read after the timing; empty
            under manual optimization or when the steps returned no loss.
    """

    seconds: float
    samples: int
    steps: int
    first_seconds: float = 0.0
    losses: list[float] = field(default_factory=list)

    @property
    def samples_per_sec(self) -> float | None:
        """Samples per second of the timed steps (None when nothing was timed)."""
        return self.samples / self.seconds if self.seconds > 0 and self.samples else None


def run_training_steps(
    trainer: pl.Trainer,
    pl_module: pl.LightningModule,
    batch: Any,
    steps: int,
    *,
    warmup: int = 1,
    optimizer: torch.optim.Optimizer | None = None,
    context: Callable[[], AbstractContextManager[Any]] | None = None,
    prepare: Callable[[Any], Any] | None = None,
) -> StepTiming:
    """Time ``steps`` training steps on one in-memory ``batch``; put every state back.

    The batch is moved to the device once (then passed through ``prepare``, e.g. a change of
    memory format); ``warmup`` untimed steps run first. Each step runs inside ``context()``
    when given (e.g. an autocast) and steps ``optimizer`` (default: the trainer's first).
    Parameters, buffers, gradients, modes, the trainer's optimizer and scheduler states and the
    RNG states are restored bit-identically afterwards (:class:`StateSnapshot`), and
    ``self.log`` is a no-op meanwhile. The losses are read (one device sync each) only after
    the timed steps.

    Raises:
        ValueError: ``steps`` is not positive or ``warmup`` is negative.
    """
    if steps < 1 or warmup < 0:
        raise ValueError(f"`steps` must be >= 1 and `warmup` >= 0, got {steps!r}, {warmup!r}")
    snapshot = StateSnapshot.take(trainer, pl_module)
    optimizer = optimizer if optimizer is not None else trainer.optimizers[0]
    device = trainer.strategy.root_device
    enter = context if context is not None else nullcontext
    losses: list[torch.Tensor | None] = []
    try:
        with logging_disabled(pl_module):
            pl_module.train()
            on_device = trainer.strategy.batch_to_device(batch)
            if prepare is not None:
                on_device = prepare(on_device)
            samples = samples_in(on_device, 1)
            sync_device(device)
            start = time.perf_counter()
            for step in range(warmup):
                with enter():
                    losses.append(train_step(trainer, pl_module, optimizer, on_device, step))
            sync_device(device)
            first = time.perf_counter() - start
            start = time.perf_counter()
            for step in range(steps):
                with enter():
                    losses.append(
                        train_step(trainer, pl_module, optimizer, on_device, warmup + step)
                    )
            sync_device(device)
            seconds = time.perf_counter() - start
            read = [float(loss) for loss in losses if loss is not None]
    finally:
        optimizer.zero_grad(set_to_none=True)
        snapshot.restore()
    return StepTiming(seconds, samples * steps, steps, first, read)


def time_training_steps(
    trainer: pl.Trainer,
    pl_module: pl.LightningModule,
    batch: Any,
    steps: int,
    *,
    warmup: int = 1,
) -> tuple[float, int]:
    """Time ``steps`` training steps on one in-memory ``batch``; put every state back.

    :func:`run_training_steps` with the trainer's optimizer, as it is.

    Returns:
        ``(seconds, samples)``: the wall time of the timed steps and the samples they processed.

    Raises:
        ValueError: ``steps`` is not positive or ``warmup`` is negative.
    """
    timing = run_training_steps(trainer, pl_module, batch, steps, warmup=warmup)
    return timing.seconds, timing.samples


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
    metrics: list[tuple[torch.nn.Module, dict[str, Any]]] = field(default_factory=list)

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
            metrics=[(m, _metric_state(m)) for m in pl_module.modules() if _is_metric(m)],
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
        for metric, state in self.metrics:  # a trial's update never reaches the epoch's value
            for name, value in state.items():
                setattr(metric, name, copy.deepcopy(value))


# A torchmetrics ``Metric`` keeps its accumulated state in plain attributes (``add_state``), not
# in parameters or buffers: a trial step that calls ``self.metric(preds, target)`` adds to it.
_METRIC_FIELDS = ("_update_count", "_computed", "_forward_cache")


def _is_metric(module: torch.nn.Module) -> bool:
    return isinstance(getattr(module, "_defaults", None), dict) and hasattr(module, "_update_count")


def _metric_state(metric: torch.nn.Module) -> dict[str, Any]:
    defaults: dict[str, Any] = getattr(metric, "_defaults", {})
    names = [*defaults, *_METRIC_FIELDS]
    return {n: copy.deepcopy(getattr(metric, n)) for n in names if hasattr(metric, n)}
