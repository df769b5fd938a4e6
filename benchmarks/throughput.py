"""Overhead of ThroughputLogger vs no callback, an empty callback and Lightning's ThroughputMonitor.

Fits TinyMLP (worst case: a step that does almost nothing) and SmallCNN on the CPU, alternating
the variants round by round in one process, and prints median fit time, its ratio to the bare
fit and the microseconds per step each variant adds over an empty callback (the floor any
callback pays for Lightning's hook dispatch), in wall time and in the process's CPU time (which
a busy machine's preemptions do not inflate). Only ratios and differences mean anything on a
shared machine.

Two more tables time the hook bodies of ThroughputLogger and of ThroughputMonitor inside real
TinyMLP fits (each hook wrapped in two ``perf_counter`` reads): where their microseconds per
step go, without the fit-to-fit noise of the first table. The same hooks with empty bodies are
timed the same way, and their time subtracted: the cost added over an empty callback (which
Lightning calls just the same), without the timing's own cost.

    .venv/bin/python benchmarks/throughput.py [--quick] [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import torch
from _common import SmallCNN, TinyMLP, print_table, quiet_trainer
from pytorch_lightning import Callback, LightningModule
from pytorch_lightning.callbacks import ThroughputMonitor

from lightning_speedpack import ThroughputLogger

EMPTY = "empty Callback"
Sample = tuple[float, float]  # wall seconds, CPU seconds


def _batch_size(batch: Any) -> int:
    return int(batch[0].shape[0])


def _fit(factory: Callable[[], LightningModule], callbacks: list[Any], epochs: int) -> Sample:
    """Wall and CPU seconds of one ``fit`` of a fresh model (trainer construction excluded)."""
    trainer = quiet_trainer(max_epochs=epochs, log_every_n_steps=50, callbacks=callbacks)
    model = factory()
    wall, cpu = time.perf_counter(), time.process_time()
    trainer.fit(model)
    return time.perf_counter() - wall, time.process_time() - cpu


def _variants(
    factory: Callable[[], LightningModule], epochs: int
) -> dict[str, Callable[[], Sample]]:
    return {
        "bare": lambda: _fit(factory, [], epochs),
        # Any callback costs Lightning's per-hook dispatch: this is that floor.
        EMPTY: lambda: _fit(factory, [Callback()], epochs),
        "ThroughputLogger": lambda: _fit(
            factory, [ThroughputLogger(batch_size_fn=_batch_size)], epochs
        ),
        "ThroughputMonitor": lambda: _fit(
            factory, [ThroughputMonitor(batch_size_fn=_batch_size)], epochs
        ),
    }


def _alternate(variants: dict[str, Callable[[], Sample]], repeats: int) -> dict[str, Sample]:
    """Each variant once per round in rotating order; the median wall and CPU seconds of each."""
    names = list(variants)
    samples: dict[str, list[Sample]] = {n: [] for n in names}
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            samples[name].append(variants[name]())
    return {
        n: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
        for n, v in samples.items()
    }


def _timed(
    fn: Callable[..., Any], name: str, spent: dict[str, float], count: dict[str, int]
) -> Callable[..., Any]:
    """``fn`` adding its duration to ``spent[name]`` and its calls to ``count[name]``."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        spent[name] += time.perf_counter() - start
        count[name] += 1
        return out

    return timed


def _hook_times(
    factory: Callable[[], Callback], epochs: int, fits: int
) -> dict[str, tuple[int, float]]:
    """Seconds per fit spent in each hook the callback overrides (least over ``fits``), calls.

    The least, not the median: on a shared machine a preemption that lands inside a hook adds
    milliseconds to one fit's sum; the fit with the fewest is the closest to the hook's cost.
    """
    per_fit: dict[str, list[float]] = defaultdict(list)
    calls: dict[str, int] = {}
    hooks = _overridden_hooks(type(factory()))
    for _ in range(fits):
        callback = factory()
        spent: dict[str, float] = dict.fromkeys(hooks, 0.0)
        count: dict[str, int] = dict.fromkeys(hooks, 0)
        for name in hooks:
            timed = _timed(getattr(callback, name), name, spent, count)
            setattr(callback, name, timed)  # Lightning looks hooks up on the instance
        quiet_trainer(max_epochs=epochs, log_every_n_steps=50, callbacks=[callback]).fit(TinyMLP())
        for name in hooks:
            if count[name]:
                per_fit[name].append(spent[name])
                calls[name] = count[name]
    return {name: (calls[name], min(v)) for name, v in per_fit.items()}


def _overridden_hooks(cls: type[Callback]) -> list[str]:
    """The Lightning hooks ``cls`` overrides."""
    return [
        n
        for n in dir(cls)
        if (n.startswith("on_") or n in ("setup", "teardown"))
        and getattr(cls, n) is not getattr(Callback, n, None)
    ]


def _hollow_twin(make: Callable[[], Callback]) -> Callable[[], Callback]:
    """A factory of Callbacks overriding the same hooks as ``make()``'s, with empty bodies."""
    cls = type(make())

    def empty(self: Callback, *args: Any, **kwargs: Any) -> None:
        return None

    hooks = dict.fromkeys(_overridden_hooks(cls), empty)
    twin = type(f"Empty{cls.__name__}", (Callback,), hooks)
    return lambda: twin()


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
    for name, factory, epochs, steps_per_epoch in models:
        steps = epochs * steps_per_epoch
        _fit(factory, [], 1)  # warm-up
        medians = _alternate(_variants(factory, epochs), repeats=repeats)
        bare, (empty, empty_cpu) = medians["bare"][0], medians[EMPTY]
        rows = [
            [
                variant,
                wall,
                1000.0 * wall / steps,
                wall / bare,
                "" if variant in ("bare", EMPTY) else f"{1e6 * (wall - empty) / steps:+.1f}",
                "" if variant in ("bare", EMPTY) else f"{1e6 * (cpu - empty_cpu) / steps:+.1f}",
            ]
            for variant, (wall, cpu) in medians.items()
        ]
        print_table(
            f"{name}: {steps} steps, median of {repeats} alternating fits",
            [
                "variant",
                "fit s",
                "ms/step",
                "x bare",
                "us/step added over empty callback",
                "same, in CPU time",
            ],
            rows,
        )

    epochs = 1 if args.quick else 3
    steps = epochs * 128
    callbacks: dict[str, Callable[[], Callback]] = {
        "ThroughputLogger": lambda: ThroughputLogger(batch_size_fn=_batch_size),
        "ThroughputMonitor": lambda: ThroughputMonitor(batch_size_fn=_batch_size),
    }
    for label, make in callbacks.items():
        times = _hook_times(make, epochs, fits=repeats)
        # The same hooks with empty bodies, timed the same way: what the timing itself and an
        # empty callback's call of each hook cost. The difference is the goal's "added cost
        # over an empty callback" (Lightning calls an empty callback's hooks too).
        hollow = _hook_times(_hollow_twin(make), epochs, fits=repeats)
        hook_rows: list[list[Any]] = []
        for hook, (calls, seconds) in sorted(times.items(), key=lambda kv: -kv[1][1]):
            empty_s = hollow.get(hook, (calls, 0.0))[1]
            hook_rows.append(
                [
                    hook,
                    calls,
                    1e6 * seconds / calls,
                    1e6 * seconds / steps,
                    1e6 * empty_s / steps,
                    1e6 * (seconds - empty_s) / steps,
                ]
            )
        total = sum(seconds for _, seconds in times.values())
        empty_total = sum(seconds for _, seconds in hollow.values())
        hook_rows.append(
            [
                "all hooks",
                "",
                "",
                1e6 * total / steps,
                1e6 * empty_total / steps,
                1e6 * (total - empty_total) / steps,
            ]
        )
        print_table(
            f"{label}'s hook bodies inside TinyMLP fits ({steps} steps, logs every 50; least of "
            f"{repeats} fits)",
            [
                "hook",
                "calls per fit",
                "us per call",
                "us per step",
                "same hooks empty, us per step",
                "added over empty, us per step",
            ],
            hook_rows,
        )


if __name__ == "__main__":
    main()
