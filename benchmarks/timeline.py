"""Overhead of StepTimeline with ranges on and no trace: fit time with vs without, medians.

Run ``.venv/bin/python benchmarks/timeline.py`` (``--quick`` for a shorter run). Variants
alternate round by round in one process (the machine is shared and noisy); only the ratios to
the plain fit are meaningful. ``ranges on`` is the default ``StepTimeline()`` (on this CPU-only
machine NVTX is off, and profiler ranges open only while a profiler records);
``ranges + NVTX (no-op table)`` adds the per-phase NVTX calls through a do-nothing table, the
Python cost a CUDA run pays on top of the NVTX library itself.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from pytorch_lightning import Callback, LightningModule

sys.path.insert(0, str(Path(__file__).parent))
from _common import SmallCNN, TinyMLP, alternate, fit_seconds, print_table, quiet_trainer

from lightning_speedpack.timeline import NvtxApi, StepTimeline


def _noop(*args: Any) -> None:
    return None


NOOP_NVTX = NvtxApi(push=_noop, pop=_noop, mark=_noop)


# StepTimeline's own hooks, and on_action: the profiler listener (core.profiler_tap) that
# Lightning's fetch and copy reach through trainer.profiler, called for every profiled action.
_HOOKS = (
    "on_action",
    "on_train_batch_start",
    "on_before_zero_grad",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "_after_optimizer_step",
    "on_train_batch_end",
)


def hook_us_per_batch(factory: Callable[[], LightningModule], repeats: int) -> float:
    """Median microseconds per batch inside StepTimeline's hooks and listener (less noisy)."""
    samples: list[float] = []
    for _ in range(repeats):
        timeline = StepTimeline()
        spent = [0.0]
        for name in _HOOKS:
            original = getattr(timeline, name)

            def timed_hook(*a: Any, _orig: Any = original, _spent: Any = spent, **k: Any) -> Any:
                start = time.perf_counter()
                try:
                    return _orig(*a, **k)
                finally:
                    _spent[0] += time.perf_counter() - start

            setattr(timeline, name, timed_hook)
        trainer = quiet_trainer(callbacks=[timeline])
        trainer.fit(factory())
        samples.append(spent[0] / max(timeline._clock.run.batches, 1) * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer steps and repeats")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name in ("pytorch_lightning", "lightning_fabric", "lightning.pytorch"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")  # Lightning's hints about the tiny setup
    repeats = 5 if args.quick else 15
    models: dict[str, Callable[[], LightningModule]] = {
        "SmallCNN": lambda: SmallCNN(n=512 if args.quick else 2048),
        "TinyMLP": lambda: TinyMLP(n=1024 if args.quick else 4096),
    }
    rows: list[list[Any]] = []
    step_ms: dict[str, float] = {}
    for model_name, factory in models.items():
        cpu: dict[str, list[float]] = {}

        def timed(
            name: str, make: Callable[[], list[Callback]], f: Any = factory, cpu: Any = cpu
        ) -> float:
            trainer = quiet_trainer(callbacks=make())
            model = f()
            wall, proc = time.perf_counter(), time.process_time()
            trainer.fit(model)
            cpu.setdefault(name, []).append(time.process_time() - proc)
            return time.perf_counter() - wall

        makers: dict[str, Callable[[], list[Callback]]] = {
            "plain": list,
            "StepTimeline() (ranges on, no trace)": lambda: [StepTimeline()],
            "ranges + NVTX (no-op table)": lambda: [StepTimeline(nvtx=NOOP_NVTX)],
        }
        variants = {n: (lambda n=n, m=m: timed(n, m)) for n, m in makers.items()}
        fit_seconds(factory)  # warm-up
        medians = alternate(variants, repeats=repeats)
        cpu_medians = {n: statistics.median(v) for n, v in cpu.items()}
        batches = len(factory().train_dataloader())  # type: ignore[arg-type, operator]
        step_ms[model_name] = medians["plain"] / batches * 1000
        for name, seconds in medians.items():
            rows.append(
                [
                    model_name,
                    name,
                    seconds,
                    seconds / medians["plain"],
                    cpu_medians[name] / cpu_medians["plain"],
                ]
            )
    print_table(
        "Time inside StepTimeline's hooks (median over fits)",
        ["model", "us per batch", "plain step ms", "share of the step"],
        [
            [name, us, step_ms[name], us / 1000 / step_ms[name]]
            for name, factory in models.items()
            for us in [hook_us_per_batch(factory, repeats)]
        ],
    )
    print_table(
        f"StepTimeline overhead (one fit, median of {repeats} alternating rounds, 1 thread)",
        ["model", "variant", "fit s", "wall ratio", "CPU-time ratio"],
        rows,
    )


if __name__ == "__main__":
    main()
