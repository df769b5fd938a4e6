"""What a step-sampling doctor could save at best on a millisecond DDP step (issue 37's cost).

The doctor's cost on the DDP zoo's clean job (``benchmarks/world_zoo.py --pairs``) is well over
issue 37's 1.05x. This asks how much of it the per-batch work is: one rank of that job
(``zoo/world_job.py``'s MLP, ``strategy="ddp"`` on gloo, one torch thread) is fitted in this
process plainly, under the doctor's default set, and under the doctor with parts of it silenced
by surgery on the pack's internals (never a setting a user has):

- ``no hub``: the per-batch hooks that :class:`~lightning_speedpack.core.hook_hub.HookHub` calls
  for the doctor's callbacks do nothing;
- ``no taps``: no tool hears the profiler's actions (:mod:`~lightning_speedpack.core.profiler_tap`
  routes them to none);
- ``neither``: both. What is left is the floor that no sampling of the per-batch work removes:
  Lightning's dispatch over the extra callbacks, the profiler tap's own calls, the wrappers
  (sync points, the X-ray's timed fetch).

The variants alternate in rotating order, each fit timed over its training loop alone; the
ratios are medians over the rounds of each variant's ms a step over the plain fit's in the same
round. The silenced variants measure nothing: their reports are not read.

Run ``.venv/bin/python benchmarks/doctor_floor.py [--quick] [--steps 400] [--repeats 7]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "zoo"))
import world_job
from _common import alternate_samples, paired_ratio, print_table, quiet_one_thread

from lightning_speedpack.core import hook_hub, profiler_tap
from lightning_speedpack.doctor.runner import DoctorSession

__all__ = ["VARIANTS", "one_rank_setup", "one_rank_trainer", "step_ms"]

VARIANTS = ("plain", "doctor", "no hub", "no taps", "neither")


def _silent_dispatcher(
    self: Any, hook: str, owners: list[Any], calls: list[Callable[..., Any]]
) -> Callable[..., None]:
    self._spent[hook] = (owners, [0.0] * len(calls))

    def dispatch(*args: Any, **kwargs: Any) -> None:
        return None

    return dispatch


def _no_route(self: Any, name: str) -> tuple[Any, ...]:
    return ()


class _Timed(world_job.MLP):
    """The zoo's MLP, its training loop timed from ``on_train_start`` to ``on_train_end``."""

    def on_train_start(self) -> None:
        self.loop_started = time.perf_counter()

    def on_train_end(self) -> None:
        self.loop_s = time.perf_counter() - self.loop_started


def one_rank_setup(port: int) -> None:
    """A one-rank process group on ``port`` of this host (unless set), quiet, one torch thread."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    quiet_one_thread()


def one_rank_trainer(steps: int, *, doctor: bool) -> Any:
    """A Trainer for one DDP rank (gloo, in this process) of ``steps`` steps, maybe the doctor's."""
    from pytorch_lightning import Trainer

    kwargs: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "strategy": "ddp",
        "max_epochs": -1,
        "max_steps": steps,
        "limit_val_batches": 0,
        "logger": False,
        "enable_progress_bar": False,
        "enable_checkpointing": False,
        "enable_model_summary": False,
    }
    if not doctor:
        return Trainer(**kwargs)
    with DoctorSession().installed():
        return Trainer(**kwargs)


def step_ms(variant: str, steps: int) -> float:
    """One fit of ``steps`` steps in ``variant``; its training loop's ms a step."""
    saved = hook_hub.HookHub._dispatcher, profiler_tap._Tap._route, hook_hub.HookHub._requiet
    if variant in ("no hub", "neither"):
        hook_hub.HookHub._dispatcher = _silent_dispatcher  # type: ignore[method-assign]
        # a sampled member's quiet stretches must not bring real dispatch back
        hook_hub.HookHub._requiet = lambda self, hook: None  # type: ignore[method-assign]
    if variant in ("no taps", "neither"):
        profiler_tap._Tap._route = _no_route  # type: ignore[method-assign]
    try:
        trainer = one_rank_trainer(steps, doctor=variant != "plain")
        model = _Timed("clean")
        trainer.fit(model)
    finally:
        hook_hub.HookHub._dispatcher = saved[0]  # type: ignore[method-assign]
        profiler_tap._Tap._route = saved[1]  # type: ignore[method-assign]
        hook_hub.HookHub._requiet = saved[2]  # type: ignore[method-assign]
    return model.loop_s / steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="training steps a fit (400)")
    parser.add_argument("--repeats", type=int, default=None, help="alternating rounds (7, >= 5)")
    parser.add_argument("--quick", action="store_true", help="200 steps, 5 rounds")
    args = parser.parse_args()
    args.steps = args.steps or (200 if args.quick else 400)
    args.repeats = args.repeats or (5 if args.quick else 7)
    one_rank_setup(29583)
    step_ms("doctor", 20)  # imports, first compilation of the paths: not timed
    samples = alternate_samples(
        {v: (lambda v=v: step_ms(v, args.steps)) for v in VARIANTS}, args.repeats
    )
    plain = statistics.median(samples["plain"])
    rows = []
    for variant in VARIANTS:
        median = statistics.median(samples[variant])
        ratio = paired_ratio(samples, variant, "plain")
        rows.append([variant, f"{median:.3f}", f"{median - plain:+.3f}", f"{ratio:.3f}x"])
    print_table(
        f"One DDP rank (gloo), the zoo's clean MLP, {args.steps} steps a fit: ms a step of the "
        f"training loop (medians of {args.repeats} alternating rounds, one process)",
        ["variant", "ms a step", "over plain", "paired ratio"],
        rows,
    )


if __name__ == "__main__":
    main()
