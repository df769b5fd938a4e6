"""Apply the winners for the fit, and take back what must not outlive it.

:class:`Applied` holds the settings as plain values (what goes into the checkpoint, so a resume
applies the same) and puts them on the fit: the loader settings on the fit's training
DataLoader (a side copy sharing its dataset, sampler, collate function, ``worker_init_fn`` and
generator, see :func:`~lightning_speedpack.what_if.loader_trials.side_copy`), ``channels_last``
on the module and its input batches, a fused optimizer rebuilt with its state, the cuDNN and
TF32 flags. :meth:`Applied.undo` takes the module's memory format, its batch hook and the
global flags back after the fit; the rebuilt loader and optimizer belong to the fit and go
with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from lightning_speedpack.what_if.loader_trials import SETTINGS, side_copy
from lightning_speedpack.what_if.model_trials import (
    fused_copy,
    set_cudnn_benchmark,
    set_tf32,
    to_channels_last,
)

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = ["ENCODING", "Applied", "decode", "encode"]

#: The order of the settings in the one tensor rank 0 sends to every rank (see :func:`encode`).
ENCODING = (
    "num_workers",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory",
    "channels_last",
    "fused_optimizer",
    "cudnn_benchmark",
    "tf32",
)


def encode(settings: dict[str, Any]) -> list[float]:
    """The settings as numbers (0: unchanged, value + 1 otherwise), in :data:`ENCODING` order.

    Example:
        >>> encode({"num_workers": 2, "persistent_workers": True})
        [3.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        >>> decode(encode({"num_workers": 0, "channels_last": True, "tf32": True}))
        {'num_workers': 0, 'channels_last': True, 'tf32': True}
    """
    return [0.0 if k not in settings else _number(k, settings[k]) + 1.0 for k in ENCODING]


def _number(key: str, value: Any) -> float:
    if key in ("num_workers", "prefetch_factor"):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"`{key}` must be an int >= 0 to be applied, got {value!r}")
        return float(value)
    if not isinstance(value, bool):
        raise ValueError(f"`{key}` must be a bool to be applied, got {value!r}")
    return float(value)


def decode(values: list[float]) -> dict[str, Any]:
    """The inverse of :func:`encode`."""
    out: dict[str, Any] = {}
    for key, value in zip(ENCODING, values, strict=True):
        if value < 0.5:
            continue
        number = round(value) - 1
        out[key] = number if key in ("num_workers", "prefetch_factor") else bool(number)
    return out


@dataclass
class Applied:
    """What was applied for this fit, and how to take it back.

    Attributes:
        settings: knob -> value (plain Python values: they go into the checkpoint).
        lines: one line per change, saying what changed and why.
    """

    settings: dict[str, Any] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    _undo: list[Any] = field(default_factory=list)

    def loader_settings(self) -> dict[str, Any]:
        """The DataLoader settings among :attr:`settings`."""
        return {k: v for k, v in self.settings.items() if k in SETTINGS}

    def loader(self, loader: Any) -> Any:
        """The fit's training loader with the applied settings (itself when there are none)."""
        settings = self.loader_settings()
        if not settings or not isinstance(loader, torch.utils.data.DataLoader):
            return loader
        workers = settings.get("num_workers", loader.num_workers)
        if workers and "prefetch_factor" not in settings:
            settings["prefetch_factor"] = loader.prefetch_factor or 2
        if workers and "persistent_workers" not in settings:
            settings["persistent_workers"] = loader.persistent_workers
        return side_copy(loader, **settings)

    def model(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Put the model-side settings on the module, the optimizer and the flags."""
        if self.settings.get("channels_last"):
            self._channels_last(pl_module)
        if self.settings.get("fused_optimizer"):
            self._fused(trainer)
        if self.settings.get("cudnn_benchmark"):
            before = set_cudnn_benchmark(True)
            self._undo.append(lambda: set_cudnn_benchmark(before))
        if self.settings.get("tf32"):
            before_tf32 = set_tf32(True)
            self._undo.append(lambda: set_tf32(before_tf32))

    def _channels_last(self, pl_module: pl.LightningModule) -> None:
        pl_module.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        own = pl_module.__dict__.get("on_after_batch_transfer")
        hook = pl_module.on_after_batch_transfer

        def on_after_batch_transfer(batch: Any, dataloader_idx: int) -> Any:
            return to_channels_last(hook(batch, dataloader_idx))

        pl_module.__dict__["on_after_batch_transfer"] = on_after_batch_transfer

        def undo() -> None:
            if own is None:
                pl_module.__dict__.pop("on_after_batch_transfer", None)
            else:
                pl_module.__dict__["on_after_batch_transfer"] = own
            pl_module.to(memory_format=torch.contiguous_format)  # type: ignore[call-overload]

        self._undo.append(undo)

    def _fused(self, trainer: pl.Trainer) -> None:
        old = trainer.optimizers[0]
        new = fused_copy(old)
        for config in trainer.lr_scheduler_configs:
            if getattr(config.scheduler, "optimizer", None) is old:
                config.scheduler.optimizer = new
        trainer.strategy.optimizers = [new, *trainer.optimizers[1:]]

    def undo(self) -> None:
        """Take back the module's memory format, its batch hook and the global flags."""
        while self._undo:
            self._undo.pop()()
