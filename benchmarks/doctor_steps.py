"""Where the doctor's cost a step comes from: every step, or the steps where periodic work runs.

The doctor's default set does some work on every training batch (its per-batch hooks, the
wall-time ledger's brackets, the data X-ray's timed fetch) and more on some: the step phases and
the sync points of one step in 8 after the first 16 (``core.sampling``), DDP's sampled
iterations and the throughput window every 10th step, the walk for retained graphs every 64th.
This says how much each kind of step costs. One rank of the DDP zoo's clean job
(``zoo/world_job.py``'s MLP, ``strategy="ddp"`` on gloo, one torch thread) is fitted in this
process, plainly and under the doctor, alternating; each batch's *cycle* (the end of the
previous batch to the end of this one, by the model's own ``on_train_batch_end``, which
Lightning calls after every callback's) is kept by the global step the batch started at. Per
step, the median over the rounds of each variant; per class of step, the mean over its steps
of the doctor's median less the plain one's, and that class's part of the doctor's whole extra
time (the sum over the steps).

The classes, by the step a batch starts at, after the first 16 (all sampled) and the first
step of each fit: ``sampled`` (a multiple of 8), ``10th`` (a multiple of 10 and not of 8),
``64th`` (a multiple of 64), ``other`` (every step where none of these runs: the floor a
doctor that samples more would keep). What runs in a class's step may spill into the next
step's cycle (a sampled step's phases are closed at its end): that spill counts as ``other``.

Run ``.venv/bin/python benchmarks/doctor_steps.py [--quick] [--steps 800] [--repeats 6]``.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "zoo"))
import world_job
from _common import alternate_samples, print_table
from doctor_floor import one_rank_setup, one_rank_trainer

from lightning_speedpack.core.sampling import DOCTOR_SAMPLE_EVERY, SAMPLED_FROM_STEP

__all__ = ["CLASSES", "cycles", "step_class"]

CLASSES = ("other", "sampled", "10th", "64th")


def step_class(step: int) -> str | None:
    """The class of the step a batch started at (None: the first steps, left out)."""
    if step < SAMPLED_FROM_STEP + 1:
        return None
    if step % 64 == 0:
        return "64th"
    if step % DOCTOR_SAMPLE_EVERY == 0:
        return "sampled"
    return "10th" if step % 10 == 0 else "other"


class _Cycles(world_job.MLP):
    """The zoo's MLP, keeping each batch's cycle by the global step it started at."""

    def on_train_start(self) -> None:
        super().on_train_start()
        self.cycles: dict[int, float] = {}
        self._last: float | None = None
        self._step = 0

    def on_train_batch_start(self, batch: object, batch_idx: int) -> None:
        self._step = self.trainer.global_step

    def on_train_batch_end(self, outputs: object, batch: object, batch_idx: int) -> None:
        now = time.perf_counter()
        if self._last is not None:
            self.cycles[self._step] = now - self._last
        self._last = now


def cycles(variant: str, steps: int) -> dict[int, float]:
    """One fit of ``steps`` steps (``plain`` or ``doctor``): each batch's cycle by its step."""
    model = _Cycles("clean")
    one_rank_trainer(steps, doctor=variant == "doctor").fit(model)
    return model.cycles


def _alternate(steps: int, repeats: int) -> dict[str, list[dict[int, float]]]:
    fits: dict[str, list[dict[int, float]]] = {"plain": [], "doctor": []}

    def run(variant: str) -> float:
        fits[variant].append(cycles(variant, steps))
        return 0.0

    cycles("doctor", 20)  # imports, first compilation of the paths: not timed
    alternate_samples({v: functools.partial(run, v) for v in fits}, repeats)
    return fits


def _rows(fits: dict[str, list[dict[int, float]]]) -> list[list[str]]:
    common = set.intersection(*(set(f) for runs in fits.values() for f in runs))
    median = {
        v: {s: statistics.median(f[s] for f in runs) for s in common} for v, runs in fits.items()
    }
    extra = {s: median["doctor"][s] - median["plain"][s] for s in common}
    counted = [s for s in common if step_class(s) is not None]
    whole = sum(extra[s] for s in counted)
    rows = []
    for name in CLASSES:
        mine = [s for s in counted if step_class(s) == name]
        if not mine:
            continue
        plain = statistics.fmean(median["plain"][s] for s in mine)
        doctor = statistics.fmean(median["doctor"][s] for s in mine)
        added = sum(extra[s] for s in mine)
        share = f"{added / whole:.0%}" if whole > 0 else "-"
        rows.append(
            [
                name,
                str(len(mine)),
                f"{plain * 1e3:.3f}",
                f"{doctor * 1e3:.3f}",
                f"{(doctor - plain) * 1e3:+.3f}",
                share,
            ]
        )
    mean_plain = statistics.fmean(median["plain"][s] for s in counted)
    rows.append(
        [
            "all",
            str(len(counted)),
            f"{mean_plain * 1e3:.3f}",
            f"{(mean_plain + whole / len(counted)) * 1e3:.3f}",
            f"{whole / len(counted) * 1e3:+.3f}",
            "100%",
        ]
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="training steps a fit (800)")
    parser.add_argument("--repeats", type=int, default=None, help="alternating rounds (6, >= 5)")
    parser.add_argument("--quick", action="store_true", help="320 steps, 5 rounds")
    args = parser.parse_args()
    args.steps = args.steps or (320 if args.quick else 800)
    args.repeats = args.repeats or (5 if args.quick else 6)
    if args.repeats < 5:
        parser.error(f"--repeats must be at least 5 (medians of alternating runs): {args.repeats}")
    one_rank_setup(29589)
    rows = _rows(_alternate(args.steps, args.repeats))
    print_table(
        f"One DDP rank (gloo), the zoo's clean MLP, {args.steps} steps a fit, "
        f"{args.repeats} alternating rounds: a batch's cycle (ms) by the kind of step",
        ["steps", "count", "plain", "doctor", "doctor's extra", "part of the extra"],
        rows,
    )


if __name__ == "__main__":
    main()
