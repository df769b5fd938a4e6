"""What :class:`~lightning_speedpack.SpeedAdvisor` reads from a running fit, as plain functions.

The train dataloaders and the number of epochs the fit will run (for the data-loading checks),
the tensors in a batch or a ``validation_step`` output (for ``eval-grad``), and whether the
measured batch shapes stayed fixed (for ``cudnn-benchmark``). Reading only: shapes and flags,
no device synchronisation.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader

from lightning_speedpack.core.nested import leaves

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = ["fixed_shapes", "planned_epochs", "tensor_shapes", "tensors", "train_loaders"]


def train_loaders(trainer: pl.Trainer) -> list[tuple[str, DataLoader[Any]]]:
    """The trainer's train dataloaders with their names (one, or each of a list or mapping)."""
    loaders = trainer.train_dataloader
    if isinstance(loaders, DataLoader):
        return [("train_dataloader", loaders)]
    items: Sequence[tuple[Any, Any]] = []
    if isinstance(loaders, Mapping):
        items = list(loaders.items())
    elif isinstance(loaders, Sequence):
        items = list(enumerate(loaders))
    return [(f"train_dataloader[{k!r}]", dl) for k, dl in items if isinstance(dl, DataLoader)]


def planned_epochs(trainer: pl.Trainer) -> int | None:
    """Epochs the fit will train (from ``max_epochs`` and ``max_steps``), None when unbounded."""
    limits: list[int] = []
    if trainer.max_epochs is not None and trainer.max_epochs >= 0:
        limits.append(trainer.max_epochs)
    batches = trainer.num_training_batches
    if trainer.max_steps >= 0 and batches not in (0, float("inf")):
        optimizer_steps_per_epoch = max(1, int(batches) // trainer.accumulate_grad_batches)
        limits.append(-(-trainer.max_steps // optimizer_steps_per_epoch))
    return min(limits) if limits else None


def tensors(obj: Any) -> list[torch.Tensor]:
    """Every tensor in ``obj``, a tensor or nested mappings, lists and tuples of them."""
    return leaves(obj, torch.Tensor)


def tensor_shapes(batch: Any) -> Iterator[tuple[int, ...]]:
    """The shape of every tensor in ``batch``, in :func:`tensors` order."""
    for tensor in tensors(batch):
        yield tuple(tensor.shape)


def fixed_shapes(shapes: set[tuple[tuple[int, ...], ...]]) -> bool | None:
    """True when all measured batches share per-sample shapes and at most two batch sizes."""
    if not shapes:
        return None
    per_sample = {tuple(s[1:] for s in shape) for shape in shapes}
    return len(per_sample) == 1 and len(shapes) <= 2
