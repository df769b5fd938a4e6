"""The run's settings that the wall-time findings name, read once when training starts.

:class:`RunSettings` reads the Trainer, its training loader and torch's global switches;
:class:`ValidationRun` is one run of the validation loop as the ledger counted it.
"""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader

from lightning_speedpack.core.hook_hub import callbacks_of
from lightning_speedpack.core.nested import leaves

__all__ = ["SEARCHES", "RunSettings", "ValidationRun"]

#: Lightning's callbacks that search a setting with trial steps, and the setting they search.
SEARCHES = {"BatchSizeFinder": "batch size", "LearningRateFinder": "learning rate"}


@dataclass
class ValidationRun:
    """One run of the validation loop: its seconds, batches and samples."""

    seconds: float = 0.0
    batches: int = 0
    samples: int = 0


@dataclass
class RunSettings:
    """The settings of the run that the findings name, read once at ``on_train_start``."""

    cores: int = 1
    threads: int = 1
    local_processes: int = 1
    workers: int = 0
    persistent_workers: bool = False
    worker_start: str | None = None  # how workers start: "fork", "spawn", "forkserver"
    anomaly: bool = False
    deterministic: bool = False
    profiler: str | None = None
    device: str = "cpu"
    log_every_n_steps: int = 50
    val_check_interval: Any = 1.0
    check_val_every_n_epoch: Any = 1
    limit_val_batches: Any = 1.0
    progress_refresh: int | None = None
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    #: Lightning's searches among the callbacks (``BatchSizeFinder``, ``LearningRateFinder``, or
    #: a subclass): class name -> what it found ("batch size 256"), "" when not yet known
    searches: dict[str, str] = field(default_factory=dict)
    batch_size: int | None = None

    @classmethod
    def read(cls, trainer: Any, *, cores: int) -> RunSettings:
        """Read the settings from ``trainer`` (and torch's global switches) now."""
        loader = _train_loader(trainer)
        profiler = type(trainer.profiler).__name__
        bar = trainer.progress_bar_callback
        return cls(
            cores=cores,
            threads=torch.get_num_threads(),
            local_processes=int(getattr(trainer.strategy, "num_processes", 1) or 1),
            workers=int(getattr(loader, "num_workers", 0) or 0),
            persistent_workers=bool(getattr(loader, "persistent_workers", False)),
            worker_start=_start_method(loader),
            anomaly=torch.is_anomaly_enabled(),
            deterministic=torch.are_deterministic_algorithms_enabled(),
            profiler=None if profiler == "PassThroughProfiler" else profiler,
            device=trainer.strategy.root_device.type,
            log_every_n_steps=trainer.log_every_n_steps,
            val_check_interval=trainer.val_check_interval,
            check_val_every_n_epoch=trainer.check_val_every_n_epoch,
            limit_val_batches=trainer.limit_val_batches,
            progress_refresh=getattr(bar, "refresh_rate", None) if bar is not None else None,
            checkpoints=[_checkpoint_settings(cb) for cb in trainer.checkpoint_callbacks],
            searches=_searches(callbacks_of(trainer)),
        )


def _start_method(loader: Any) -> str | None:
    """How ``loader``'s workers start (its context's, else the process default), if it has any."""
    if not getattr(loader, "num_workers", 0):
        return None
    ctx = getattr(loader, "multiprocessing_context", None)
    get = getattr(ctx, "get_start_method", None)
    if callable(get):
        return str(get())
    return (
        multiprocessing.get_start_method(allow_none=True)
        or multiprocessing.get_context().get_start_method()
    )


def _train_loader(trainer: Any) -> DataLoader[Any] | None:
    loaders = leaves(trainer.train_dataloader, DataLoader)  # one, or a list or mapping of them
    return loaders[0] if loaders else None


def _checkpoint_settings(callback: Any) -> dict[str, Any]:
    return {
        "every_n_train_steps": getattr(callback, "_every_n_train_steps", None),
        "every_n_epochs": getattr(callback, "_every_n_epochs", None),
        "save_top_k": getattr(callback, "save_top_k", None),
        "save_weights_only": getattr(callback, "save_weights_only", None),
        "save_last": getattr(callback, "save_last", None),
    }


def _searches(callbacks: list[Any]) -> dict[str, str]:
    """Lightning's setting searches among ``callbacks`` (a subclass too), with what each found.

    Example:
        >>> from pytorch_lightning.callbacks import BatchSizeFinder, LearningRateFinder
        >>> class Milestones(BatchSizeFinder): ...
        >>> found = Milestones()
        >>> found.optimal_batch_size = 256
        >>> _searches([found, LearningRateFinder(), object()])
        {'Milestones': 'batch size 256', 'LearningRateFinder': ''}
    """
    out = {}
    for callback in callbacks:
        setting = next(
            (SEARCHES[c.__name__] for c in type(callback).__mro__ if _lightning_search(c)), None
        )
        if setting is not None:
            out[type(callback).__name__] = _found(callback, setting)
    return out


def _lightning_search(cls: type) -> bool:
    return cls.__name__ in SEARCHES and cls.__module__.split(".")[0] in (
        "pytorch_lightning",
        "lightning",
    )


def _found(callback: Any, setting: str) -> str:
    if setting == "batch size":
        size = getattr(callback, "optimal_batch_size", None)
        return f"batch size {size}" if isinstance(size, int) else ""
    finder = getattr(callback, "optimal_lr", None)
    try:
        lr = finder.suggestion() if finder is not None else None
    except Exception:  # a search cut short has no suggestion
        lr = None
    return f"learning rate {lr:.3g}" if isinstance(lr, float) else ""
