"""Overhead of ThroughputLogger vs no callback vs Lightning's ThroughputMonitor.

Fits TinyMLP (worst case: a step that does almost nothing) and SmallCNN on the CPU, alternating
the three variants round by round in one process, and prints median fit time and its ratio to
the bare fit. Only the ratios mean anything on a shared machine.

    .venv/bin/python benchmarks/throughput.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import torch
from _common import SmallCNN, TinyMLP, alternate, fit_seconds, print_table
from pytorch_lightning import Callback, LightningModule
from pytorch_lightning.callbacks import ThroughputMonitor

from lightning_speedpack import ThroughputLogger


def _batch_size(batch: Any) -> int:
    return int(batch[0].shape[0])


def _variants(
    factory: Callable[[], LightningModule], epochs: int
) -> dict[str, Callable[[], float]]:
    common: dict[str, Any] = {"max_epochs": epochs, "log_every_n_steps": 50}
    return {
        "bare": lambda: fit_seconds(factory, **common),
        # Any callback costs Lightning's per-hook dispatch: this is that floor.
        "empty Callback": lambda: fit_seconds(factory, callbacks=[Callback()], **common),
        "ThroughputLogger": lambda: fit_seconds(
            factory, callbacks=[ThroughputLogger(batch_size_fn=_batch_size)], **common
        ),
        "ThroughputMonitor": lambda: fit_seconds(
            factory, callbacks=[ThroughputMonitor(batch_size_fn=_batch_size)], **common
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps (< 60 s)")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    repeats = args.repeats or (5 if args.quick else 9)
    torch.set_num_threads(1)  # the machine is shared: no thread oversubscription noise
    warnings.filterwarnings("ignore")  # ThroughputMonitor's "define flops_per_batch" hint
    import logging

    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    models: list[tuple[str, Callable[[], LightningModule], int, int]] = [
        # name, factory, epochs, steps per epoch
        ("TinyMLP", TinyMLP, 1 if args.quick else 3, 128),
        ("SmallCNN", SmallCNN, 2 if args.quick else 6, 16),
    ]
    for name, factory, epochs, steps in models:
        fit_seconds(factory, max_epochs=1)  # warm-up
        medians = alternate(_variants(factory, epochs), repeats=repeats)
        bare = medians["bare"]
        rows = [
            [variant, seconds, 1000.0 * seconds / (epochs * steps), seconds / bare]
            for variant, seconds in medians.items()
        ]
        print_table(
            f"{name}: {epochs * steps} steps, median of {repeats} alternating fits",
            ["variant", "fit s", "ms/step", "x bare"],
            rows,
        )


if __name__ == "__main__":
    main()
