"""Overhead of LossRetentionDetector per training step, and how fast it finds a leak.

Step time with vs without the detector (``check_every_n_steps=1``, the default heap scan every
100 steps) on a small CNN and a tiny MLP, alternating variants, medians of repeats. The step
time is measured from one ``on_train_batch_start`` to the next, so it includes the detector's
``on_train_batch_end`` check; "median" is the typical step, "mean" includes the periodic heap
scans; an empty ``Callback`` in the same rotation shows the noise floor of a shared machine.
"self-time ratio" is 1 + the detector's own median time per step (timed inside its
hooks) over the median step without it: the figure the shared machine's load disturbs least.
Then a model that starts leaking at a known batch shows how many batches later the
detector found and reported it. Last, on a heap grown to 10^5, 10^6 and 5*10^6 live Python
objects (a datamodule holding an in-memory dataset of small records: a tuple and a list each),
a list in this script's globals (``GLOBAL_LOSSES.append(loss)``; the model is defined here too)
is found; the table gives the batch it was reported at and the detector's cost per step.

Run: ``.venv/bin/python benchmarks/retention.py [--quick]``
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import torch
from _common import SmallCNN, TinyMLP, print_table, quiet_trainer
from pytorch_lightning import Callback, LightningDataModule, LightningModule
from torch.utils.data import DataLoader

from lightning_speedpack import LossRetentionDetector


class StepTimer(Callback):
    """Intervals between consecutive ``on_train_batch_start`` calls (after a warm-up)."""

    def __init__(self, warmup: int = 3) -> None:
        self.warmup = warmup
        self.intervals: list[float] = []
        self._last: float | None = None
        self._seen = 0

    def on_train_batch_start(self, *args: Any) -> None:
        now = time.perf_counter()
        if self._last is not None and self._seen > self.warmup:
            self.intervals.append(now - self._last)
        self._last = now
        self._seen += 1


class SelfTimedDetector(LossRetentionDetector):
    """The detector, timing its own per-step hooks (a figure the machine's load barely moves)."""

    def __init__(self) -> None:
        super().__init__(check_every_n_steps=1)
        self.self_seconds: list[float] = []
        self._pending = 0.0

    def on_before_backward(self, *args: Any) -> None:
        start = time.perf_counter()
        super().on_before_backward(*args)
        self._pending = time.perf_counter() - start

    def on_train_batch_end(self, *args: Any) -> None:
        start = time.perf_counter()
        super().on_train_batch_end(*args)
        self.self_seconds.append(time.perf_counter() - start + self._pending)


def _steps(model_factory: Any, steps: int, variant: str) -> tuple[float, float, float]:
    timer = StepTimer()
    watcher = SelfTimedDetector() if variant == "on" else None
    callbacks: list[Callback] = {"on": [watcher], "empty": [Callback()]}.get(variant, [])
    trainer = quiet_trainer(max_steps=steps, max_epochs=-1, callbacks=[*callbacks, timer])
    trainer.fit(model_factory())
    own = statistics.median(watcher.self_seconds) if watcher is not None else 0.0
    return statistics.median(timer.intervals), statistics.fmean(timer.intervals), own


def overhead(name: str, model_factory: Any, steps: int, repeats: int) -> list[Any]:
    variants = ["off", "on", "empty"]
    samples: dict[str, list[tuple[float, float, float]]] = {v: [] for v in variants}
    for r in range(repeats):
        for variant in variants[r % 3 :] + variants[: r % 3]:
            samples[variant].append(_steps(model_factory, steps, variant))

    def med(variant: str, i: int) -> float:
        return statistics.median(s[i] for s in samples[variant])

    off = med("off", 0)
    return [
        name,
        steps,
        off * 1e3,
        med("on", 0) * 1e3,
        med("on", 0) / off,
        med("on", 1) / med("off", 1),
        med("empty", 0) / off,
        med("on", 2) * 1e6,
        1 + med("on", 2) / off,
    ]


class LeakFrom(Callback):
    """Records the batch at which the detector first had a finding."""

    def __init__(self, detector: LossRetentionDetector) -> None:
        self.detector = detector
        self.reported_at: int | None = None

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        if self.reported_at is None and self.detector.findings:
            self.reported_at = self.detector._batch


def _leaky(first_leak: int, backpropagated: bool) -> LightningModule:
    class Leaky(SmallCNN):
        def __init__(self) -> None:
            super().__init__()
            self.losses: list[torch.Tensor] = []

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = super().training_step(batch, batch_idx)
            if batch_idx >= first_leak:
                x, _ = batch
                kept = loss if backpropagated else self.net(x).pow(2).mean()
                self.losses.append(kept)
            return loss

    return Leaky()


def detection(first_leak: int = 5) -> list[list[Any]]:
    rows = []
    for backpropagated in (True, False):
        detector = LossRetentionDetector(check_every_n_steps=1)
        probe = LeakFrom(detector)
        trainer = quiet_trainer(max_steps=first_leak + 6, callbacks=[detector, probe])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(_leaky(first_leak, backpropagated))
        (finding,) = detector.findings
        rows.append(
            [
                "loss kept (back-propagated)" if backpropagated else "aux kept (activations)",
                first_leak,
                finding.step_first_seen - first_leak,
                (probe.reported_at or -1) - first_leak,
                finding.path,
                finding.est_bytes,
            ]
        )
    return rows


GLOBAL_LOSSES: list[torch.Tensor] = []


class GlobalLeakCNN(SmallCNN):
    """The issue's leak: every loss appended to a list in the training script's globals."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        GLOBAL_LOSSES.append(loss)
        return loss


class RecordsData(LightningDataModule):
    """A datamodule holding ``n`` small records in memory (2 live Python objects each)."""

    def __init__(self, n_records: int, images: Any) -> None:
        super().__init__()
        self.records = [([i, i + 1], i) for i in range(n_records)]
        self.images = images

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.images, batch_size=32)


def big_heap(sizes: list[int], steps: int, repeats: int) -> list[list[Any]]:
    rows = []
    for size in sizes:
        base = len(gc.get_objects())
        data = RecordsData(max(0, size - base) // 2, SmallCNN(n=4096).data)
        live = len(gc.get_objects())
        samples: dict[str, list[float]] = {"off": [], "on": [], "own": []}
        for r in range(repeats):
            for variant in ("off", "on") if r % 2 == 0 else ("on", "off"):
                timer = StepTimer()
                watcher = SelfTimedDetector() if variant == "on" else None
                trainer = quiet_trainer(
                    max_steps=steps,
                    max_epochs=-1,
                    callbacks=[*([watcher] if watcher else []), timer],
                )
                trainer.fit(SmallCNN(n=4096), datamodule=data)
                samples[variant].append(statistics.median(timer.intervals))
                if watcher is not None:
                    samples["own"].append(statistics.median(watcher.self_seconds))
        GLOBAL_LOSSES.clear()
        detector = LossRetentionDetector()
        probe = LeakFrom(detector)
        trainer = quiet_trainer(max_steps=8, callbacks=[detector, probe])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(GlobalLeakCNN(n=4096), datamodule=data)
        GLOBAL_LOSSES.clear()
        path = detector.findings[0].path if detector.findings else "-"
        off, on = statistics.median(samples["off"]), statistics.median(samples["on"])
        own = statistics.median(samples["own"])
        rows.append(
            [f"{live:.2e}", path, probe.reported_at, off * 1e3, on / off, own * 1e6, 1 + own / off]
        )
        del data
        gc.collect()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer steps and repeats (< 60 s)")
    args = parser.parse_args()
    steps, repeats = (40, 3) if args.quick else (150, 5)
    torch.set_num_threads(1)
    rows = [
        overhead("SmallCNN", lambda: SmallCNN(n=4096), steps, repeats),
        overhead("TinyMLP", lambda: TinyMLP(n=16384), steps, repeats),
    ]
    print_table(
        f"LossRetentionDetector overhead (check_every_n_steps=1, {repeats} alternating repeats)",
        [
            "model",
            "steps",
            "step ms off",
            "step ms on",
            "median step ratio",
            "mean step ratio",
            "empty Callback ratio (noise floor)",
            "detector us/step",
            "self-time ratio",
        ],
        rows,
    )
    print_table(
        "Detection latency (batches after the first leaked tensor)",
        [
            "leak",
            "first leak at batch",
            "seen retained after",
            "reported after",
            "holder",
            "est_bytes",
        ],
        detection(),
    )
    print_table(
        "Big heaps: a list in the script's globals, SmallCNN, datamodule holding the records "
        f"({repeats} alternating repeats, {steps} steps)",
        [
            "live objects (gc)",
            "holder",
            "reported at batch (leak from 0)",
            "step ms off",
            "median step ratio",
            "detector us/step",
            "self-time ratio",
        ],
        big_heap([10**5, 10**6, 5 * 10**6], steps, repeats),
    )


if __name__ == "__main__":
    main()
