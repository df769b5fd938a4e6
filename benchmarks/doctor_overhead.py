"""The doctor's own cost: a fit with its diagnostics attached against none.

The small CNN with 2 persistent DataLoader workers (the doctor's typical patient), fitted with
``DoctorSession().installed()`` around the Trainer -- exactly what ``speedpack doctor`` does to a
script -- against the same fit without it, alternating the variants, median of ``--repeats``:
the default set (what ``speedpack doctor`` attaches) and ``--deep`` (every diagnostic), and the
plain fit a second time (its ratio shows the measurement's own noise). Goal (issue 17): the
default set <= 1.05x.

``--breakdown`` adds one variant per diagnostic (``DoctorSession(only=[name])``): where the
cost goes, and the measurement behind which diagnostics are ``deep``.

Run ``.venv/bin/python benchmarks/doctor_overhead.py [--quick] [--epochs N] [--breakdown]``.
"""

from __future__ import annotations

import argparse
import functools
import logging
import statistics
import warnings
from collections.abc import Callable
from typing import Any

import torch
from _common import SmallCNN, alternate_samples, paired_ratio, print_table, quiet_trainer
from torch.utils.data import DataLoader

from lightning_speedpack.core.registry import registered_diagnostics
from lightning_speedpack.doctor.runner import DoctorSession


class LoadedCNN(SmallCNN):
    """SmallCNN fed by 2 persistent workers, as a real script's loader would be."""

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(
            self.data, batch_size=self.batch_size, num_workers=2, persistent_workers=True
        )


def _fit(epochs: int, session: DoctorSession | None) -> float:
    import time

    if session is not None:
        session.install()
    try:
        trainer = quiet_trainer(max_epochs=epochs, log_every_n_steps=8)
        model = LoadedCNN()
        start = time.perf_counter()
        trainer.fit(model)
        return time.perf_counter() - start
    finally:
        if session is not None:
            session.uninstall()


def _fit_only(epochs: int, name: str) -> float:
    return _fit(epochs, DoctorSession(only=[name]))


def cost_samples(
    epochs: int, repeats: int, deep: bool = True, breakdown: bool = False
) -> dict[str, list[float]]:
    """Fit seconds of each variant, round by round (alternating, after one warm-up fit)."""
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    _fit(1, DoctorSession(deep=True))  # warm-up: imports every tool, fills caches
    variants: dict[str, Callable[[], float]] = {
        "no doctor": lambda: _fit(epochs, None),
        # The same fit again: its ratio is this measurement's own noise (an A/A comparison).
        "no doctor, again": lambda: _fit(epochs, None),
        "doctor (default)": lambda: _fit(epochs, DoctorSession()),
    }
    if deep:
        variants["doctor --deep"] = lambda: _fit(epochs, DoctorSession(deep=True))
    if breakdown:
        for d in registered_diagnostics():
            label = f"only {d.name}" + (" (deep)" if d.deep else "")
            variants[label] = functools.partial(_fit_only, epochs, d.name)
    return alternate_samples(variants, repeats=repeats)


def quick_figures() -> dict[str, float]:
    """``benchmarks/bench_check.py``'s figures: the default set's paired ratio, and the A/A's.

    4 epochs and 9 rounds (about 65 s): with 2 and 5 the same code read 0.95-1.12x and its A/A
    1.07x; with these, 0.93-1.04x and A/A 0.97-1.00x (3 runs, idle).
    """
    samples = cost_samples(epochs=4, repeats=9, deep=False)
    return {
        "default": paired_ratio(samples, "doctor (default)", "no doctor"),
        "a_a": paired_ratio(samples, "no doctor, again", "no doctor"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer epochs and repeats")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument(
        "--epochs", type=int, default=None, help="epochs per fit (one-time costs weigh less)"
    )
    parser.add_argument(
        "--breakdown", action="store_true", help="also each diagnostic alone against none"
    )
    args = parser.parse_args()
    repeats = args.repeats or (3 if args.quick else 5)
    epochs = args.epochs or (2 if args.quick else 6)
    samples = cost_samples(epochs, repeats, deep=True, breakdown=args.breakdown)
    deep = {d.name for d in registered_diagnostics() if d.deep}
    medians = {name: statistics.median(values) for name, values in samples.items()}
    base = medians["no doctor"]
    print_table(
        f"SmallCNN, 2 workers, {epochs} epochs x 16 steps, {repeats} alternating rounds "
        f"(deep: {', '.join(sorted(deep)) or 'none'})",
        ["variant", "median fit s", "x no doctor (ratio of medians)", "median of paired ratios"],
        [
            [name, seconds, seconds / base, paired_ratio(samples, name, "no doctor")]
            for name, seconds in medians.items()
        ],
    )


if __name__ == "__main__":
    main()
