"""Overhead of SyncPointWarnings: fit time with vs without, alternating rounds, medians.

Run ``.venv/bin/python benchmarks/sync_overhead.py`` (``--quick`` for a < 60 s run). Prints the
ratio of each variant's median fit time to the plain fit on the same model. For comparison it
also times the design the detector does not use: a no-op ``TorchFunctionMode`` entered for
every training batch (it sees every op, which is what makes it expensive on tiny steps).
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from pytorch_lightning import Callback, LightningModule, Trainer
from torch.overrides import TorchFunctionMode

sys.path.insert(0, str(Path(__file__).parent))
from _common import SmallCNN, TinyMLP, alternate, fit_seconds, print_table

from lightning_speedpack.callbacks.sync_points import SyncPointWarnings


class _NoOpMode(TorchFunctionMode):
    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        return func(*args, **(kwargs or {}))


class NoOpFunctionMode(Callback):
    """The alternative design's floor: a do-nothing TorchFunctionMode around each batch."""

    def __init__(self) -> None:
        self._mode: _NoOpMode | None = None

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, *args: Any
    ) -> None:
        self._mode = _NoOpMode()
        self._mode.__enter__()

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer steps and repeats (< 60 s)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name in ("pytorch_lightning", "lightning_fabric", "lightning.pytorch"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")  # Lightning's hints about the tiny setup
    repeats = 5 if args.quick else 7
    models: dict[str, Callable[[], LightningModule]] = {
        "TinyMLP": lambda: TinyMLP(n=1024 if args.quick else 4096),
        "SmallCNN": lambda: SmallCNN(n=256 if args.quick else 1024),
    }
    rows: list[list[Any]] = []
    for model_name, factory in models.items():
        variants: dict[str, Callable[[], float]] = {
            "plain": lambda f=factory: fit_seconds(f),  # type: ignore[misc]
            "sync (include_cpu=False)": lambda f=factory: fit_seconds(  # type: ignore[misc]
                f, callbacks=[SyncPointWarnings()]
            ),
            "sync (include_cpu=True)": lambda f=factory: fit_seconds(  # type: ignore[misc]
                f, callbacks=[SyncPointWarnings(include_cpu=True)]
            ),
            "no-op TorchFunctionMode": lambda f=factory: fit_seconds(  # type: ignore[misc]
                f, callbacks=[NoOpFunctionMode()]
            ),
        }
        fit_seconds(factory)  # warm-up
        medians = alternate(variants, repeats=repeats)
        base = medians["plain"]
        for name, seconds in medians.items():
            rows.append([model_name, name, seconds, seconds / base])
    print_table(
        f"SyncPointWarnings overhead (fit wall time, median of {repeats} alternating rounds, "
        "1 torch thread, CPU)",
        ["model", "variant", "median s", "ratio vs plain"],
        rows,
    )


if __name__ == "__main__":
    main()
