"""What the checks ``syncs``, ``throughput``, ``copy``, ``oom`` and ``nvtx`` share.

Quiet Trainers for a :class:`~benchmarks.gpu.context.Context` (``accelerator="gpu",
devices=1`` on a GPU, ``"cpu"`` dry; no logger, bar, checkpoint or summary), a dataset that
hands out prebuilt batches (no per-sample collation in the timed steps), CUDA-event timing,
and the relative gap every bound is written in.
"""

from __future__ import annotations

import logging
import statistics
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks.gpu.context import Context

__all__ = [
    "Batches",
    "cuda_ms",
    "fmt",
    "gap",
    "loader",
    "median",
    "pct",
    "quiet",
    "trainer",
]

_LIGHTNING_LOGGERS = ("pytorch_lightning", "lightning.pytorch", "lightning_fabric", "lightning")
# Lightning's hints about the deliberately small setups here (they go to the log otherwise).
_HINTS = (
    ".*does not have many workers.*",
    ".*is smaller than the logging interval.*",
    ".*GPU available but not used.*",
    ".*`training_step` returned `None`.*",
    ".*Tensor Cores.*",
    ".*LeafSpec.*is deprecated.*",
)


def quiet() -> None:
    """Lightning's INFO lines and its hints about tiny setups are noise in the log."""
    for name in _LIGHTNING_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    for message in _HINTS:
        warnings.filterwarnings("ignore", message=message)


def trainer(ctx: Context, **overrides: Any) -> pl.Trainer:
    """A quiet Trainer on the context's device (``overrides`` win)."""
    quiet()
    kwargs: dict[str, Any] = {
        "accelerator": "gpu" if ctx.device == "cuda" else "cpu",
        "devices": 1,
        "logger": False,
        "enable_progress_bar": False,
        "enable_checkpointing": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
        "limit_val_batches": 0,
        "default_root_dir": str(ctx.out_dir),
    }
    kwargs.update(overrides)
    return pl.Trainer(**kwargs)


class Batches(Dataset[Any]):
    """``n`` batches drawn in turn from a few prebuilt ones: load a batch with ``batch_size=None``.

    Nothing is collated per sample, so the host work between two steps is a list lookup.
    """

    def __init__(self, batches: Sequence[Any], n: int) -> None:
        self.batches = list(batches)
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> Any:
        return self.batches[index % len(self.batches)]


def loader(batches: Sequence[Any], n: int, pin_memory: bool = False) -> DataLoader[Any]:
    """A main-process DataLoader over :class:`Batches` (``batch_size=None``)."""
    return DataLoader(Batches(batches, n), batch_size=None, pin_memory=pin_memory)


def cuda_ms(fn: Callable[[], Any], repeats: int = 1) -> float:
    """Milliseconds of device time ``repeats`` calls of ``fn`` take, between two CUDA events.

    One ``synchronize`` of the end event, after the timed region only.
    """
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end))


def gap(measured: float, reference: float) -> float:
    """``|measured - reference| / reference`` (inf when the reference is 0)."""
    return abs(measured - reference) / abs(reference) if reference else float("inf")


def median(values: Sequence[float]) -> float:
    """The median, NaN for no values."""
    return float(statistics.median(values)) if values else float("nan")


def pct(x: float) -> str:
    """``0.0123`` -> ``"1.2%"``."""
    return f"{100 * x:.1f}%"


def fmt(x: float | None, digits: int = 3) -> str:
    """``digits`` significant digits, or a whole number with thousands commas from 1,000 up.

    ``"-"`` for None.
    """
    if x is None:
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"
