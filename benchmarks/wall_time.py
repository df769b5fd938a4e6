"""WallTimeLedger's own cost per batch, and the profiler tap's, measured on real action names.

A doctored BoringModel fit records every action Lightning times through ``trainer.profiler``
(~150 a batch under the doctor: every hook of every callback). The steady half is then replayed,
alternating, through (a) a plain ``PassThroughProfiler`` and (b) one tapped with the ledger and
two fetch timers (ThroughputLogger's and SpeedAdvisor's), and straight into the ledger's
``on_action``; medians of ``--rounds`` rounds, in microseconds per training batch.

    python benchmarks/wall_time.py [--quick] [--rounds N]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
import warnings
from typing import Any

from pytorch_lightning import Trainer
from pytorch_lightning.demos.boring_classes import BoringModel
from pytorch_lightning.profilers import PassThroughProfiler

from lightning_speedpack.core.hook_hub import callbacks_of
from lightning_speedpack.core.profiler_tap import FetchTimer, tap
from lightning_speedpack.doctor.runner import DoctorSession
from lightning_speedpack.wall_time import WallTimeLedger


class _Recorder:
    def __init__(self) -> None:
        self.actions: list[tuple[str, bool]] = []

    def on_action(self, name: str, started: bool, now: float) -> None:
        self.actions.append((name, started))


def _doctored_actions() -> tuple[list[tuple[str, bool]], int, WallTimeLedger]:
    """The steady half of a doctored fit's actions, its batch count, and the fit's ledger."""
    recorder = _Recorder()
    session = DoctorSession()
    with session.installed():
        trainer = Trainer(
            max_steps=60, limit_val_batches=0, logger=False, enable_progress_bar=False,
            enable_checkpointing=False, accelerator="cpu", enable_model_summary=False,
        )  # fmt: skip
        ledger = next(c for c in callbacks_of(trainer) if isinstance(c, WallTimeLedger))
        original = ledger.setup

        def setup(trainer: Any, module: Any, stage: str) -> None:
            original(trainer, module, stage)
            tap(trainer, recorder)

        ledger.setup = setup  # type: ignore[method-assign]
        trainer.fit(BoringModel())
    steady = recorder.actions[len(recorder.actions) // 2 :]
    batches = sum(1 for name, started in steady if started and name == "run_training_batch")
    return steady, batches, ledger


def _open_ledger(like: WallTimeLedger) -> WallTimeLedger:
    ledger = WallTimeLedger()
    ledger._callbacks = like._callbacks
    ledger.ledger.open(0.0, "unaccounted")
    return ledger


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="3 rounds")
    args = parser.parse_args()
    args.rounds = args.rounds or (3 if args.quick else 7)
    warnings.filterwarnings("ignore")
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    steady, batches, fitted = _doctored_actions()

    class _Trainer:
        profiler = PassThroughProfiler()

    tapped = _Trainer()
    for listener in (FetchTimer(lambda s: None), FetchTimer(lambda s: None), _open_ledger(fitted)):
        tap(tapped, listener)
    direct = _open_ledger(fitted)
    plain = PassThroughProfiler()
    out: dict[str, list[float]] = {"plain profiler": [], "tapped profiler": [], "ledger": []}
    for _ in range(args.rounds):
        for label, profiler in (("plain profiler", plain), ("tapped profiler", tapped.profiler)):
            start = time.perf_counter()
            for name, started in steady:
                (profiler.start if started else profiler.stop)(name)
            out[label].append((time.perf_counter() - start) / batches * 1e6)
        start = time.perf_counter()
        for i, (name, started) in enumerate(steady):
            direct.on_action(name, started, float(i))
        out["ledger"].append((time.perf_counter() - start) / batches * 1e6)
    print(f"{len(steady) / batches:.0f} profiled actions (start or stop) a batch under the doctor")
    print("| replayed through | µs a batch, median | range |")
    print("|---|---|---|")
    for label, values in out.items():
        low, high = min(values), max(values)
        print(f"| {label} | {statistics.median(values):.1f} | {low:.1f} to {high:.1f} |")


if __name__ == "__main__":
    main()
