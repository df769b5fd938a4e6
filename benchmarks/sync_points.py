"""Overhead of SyncPointWarnings: fit time with vs without, alternating rounds, medians.

Run ``.venv/bin/python benchmarks/sync_points.py`` (``--quick`` for a < 60 s run). Prints the
ratio of each variant's median fit time to the plain fit on the same model. For comparison it
also times the design the detector does not use: a no-op ``TorchFunctionMode`` entered for
every training batch (it sees every op, which is what makes it expensive on tiny steps).
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
from pytorch_lightning import Callback, LightningModule, Trainer
from torch.overrides import TorchFunctionMode

sys.path.insert(0, str(Path(__file__).parent))
from _common import SmallCNN, TinyMLP, alternate, fit_seconds, print_table, quiet_trainer

from lightning_speedpack.sync_points import detect as _sync_detect
from lightning_speedpack.sync_points import patching as _patching
from lightning_speedpack.sync_points.callback import SyncPointWarnings


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


def count_wrapper_calls(
    factory: Callable[[], LightningModule], include_cpu: bool
) -> dict[str, int]:
    """How often each wrapper runs during one fit (a counting copy of the engine's ``_wrap``)."""
    counts: dict[str, int] = {}
    originals = _patching._wrap, _patching._wrap_indexing

    def counting(make: Callable[..., Any]) -> Callable[..., Any]:
        def wrap(orig: Callable[..., Any], *rest: Any) -> Any:
            wrapped = make(orig, *rest)
            name = str(getattr(orig, "__name__", orig))

            def counted(*args: Any, **kwargs: Any) -> Any:
                counts[name] = counts.get(name, 0) + 1
                return wrapped(*args, **kwargs)

            return counted

        return wrap

    _patching._wrap = counting(originals[0])  # type: ignore[assignment]
    _patching._wrap_indexing = counting(originals[1])  # type: ignore[assignment]
    try:
        fit_seconds(factory, callbacks=[SyncPointWarnings(include_cpu=include_cpu)])
    finally:
        _patching._wrap, _patching._wrap_indexing = originals  # type: ignore[assignment]
    return counts


def wrapper_ns_per_call(repeats: int, calls: int = 100_000) -> dict[str, float]:
    """Extra ns per call of a watched method (not a sync) vs the original.

    Armed, armed between batches, and installed but not armed (a sampled detector between the
    steps it watches).
    """
    t = torch.ones(4)

    def loop(body: Callable[[], Any]) -> float:
        start = time.perf_counter()
        for _ in range(calls):
            body()
        return (time.perf_counter() - start) / calls * 1e9

    def run(armed: bool | None, tail: bool, body: Callable[[], Any]) -> float:
        # armed None: installed, not armed (a sampled detector between its watched steps)
        if armed is False:
            return loop(body)
        det = _sync_detect.SyncDetector()
        det.install()
        try:
            if armed:
                det.arm(step=0)
            if tail:
                det.end_step()
            return loop(body)
        finally:
            det.uninstall()

    out: dict[str, float] = {}
    for label, body in (("t.to(dtype)", lambda: t.to(torch.float32)), ("t[0]", lambda: t[0])):
        medians = alternate(
            {
                "plain": lambda b=body: run(False, False, b),  # type: ignore[misc]
                "armed": lambda b=body: run(True, False, b),  # type: ignore[misc]
                "armed, between batches": lambda b=body: run(True, True, b),  # type: ignore[misc]
                "not armed": lambda b=body: run(None, False, b),  # type: ignore[misc]
            },
            repeats=repeats,
        )
        for name in ("armed", "armed, between batches", "not armed"):
            out[f"{label} {name}"] = medians[name] - medians["plain"]
    return out


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
        "SmallCNN": lambda: SmallCNN(n=384 if args.quick else 2048),
    }
    steps = {
        name: len(factory().train_dataloader())  # type: ignore[operator, arg-type]
        for name, factory in models.items()
    }
    rows: list[list[Any]] = []
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
            "empty Callback (Lightning's hook cost)": lambda: [Callback()],
            "sync (include_cpu=False)": lambda: [SyncPointWarnings()],
            "sync (include_cpu=True)": lambda: [SyncPointWarnings(include_cpu=True)],
            "no-op TorchFunctionMode": lambda: [NoOpFunctionMode()],
        }
        variants = {n: (lambda n=n, m=m: timed(n, m)) for n, m in makers.items()}
        fit_seconds(factory)  # warm-up
        medians = alternate(variants, repeats=repeats)
        cpu_medians = {n: statistics.median(v) for n, v in cpu.items()}
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
        "Wrapper calls per training batch (clean models; indexing unwatched between batches)",
        ["model", "include_cpu", "calls per batch", "by function"],
        [
            [
                name,
                inc,
                sum(c.values()) / steps[name],
                ", ".join(
                    f"{k} {v / steps[name]:.1f}"
                    for k, v in sorted(c.items(), key=lambda kv: -kv[1])
                ),
            ]
            for name in models
            for inc in (False, True)
            for c in [count_wrapper_calls(models[name], inc)]
        ],
    )
    print_table(
        f"Extra time per watched call (median of {repeats} alternating rounds)",
        ["call", "extra ns"],
        [[k, v] for k, v in wrapper_ns_per_call(repeats).items()],
    )
    print_table(
        f"SyncPointWarnings overhead (one fit, median of {repeats} alternating rounds, "
        "1 torch thread, CPU; process CPU time is less disturbed by other load than wall time)",
        ["model", "variant", "wall s", "wall ratio", "CPU-time ratio"],
        rows,
    )


if __name__ == "__main__":
    main()
