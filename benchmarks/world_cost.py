"""The doctor's cost on the DDP zoo's clean 2-rank job, alternated inside the same two ranks.

``benchmarks/world_zoo.py --pairs`` launches a fresh 2-rank job for each fit, plain or under
``speedpack doctor``: about 10 s apart, on a shared CPU whose speed drifts by more than the
doctor's cost, its A/A (the plain job against itself) reads up to 1.06x on 5 rounds. Here one
launch of two ranks (Lightning's launcher, gloo, one torch thread a rank: ``zoo/world_job.py``'s
clean MLP and Trainer) fits the job again and again, each fit plain, under the doctor's default
set (``DoctorSession().installed()`` around the Trainer: what ``speedpack doctor`` does to a
script) or plain again, in rotating order, ~3 s a fit. Rank 0 times each fit's training loop
(``on_train_start`` to ``on_train_end``, wall and its process's CPU time) and prints each
variant's median against the plain fits' (the ratio of the medians, issue 37's figure) and the
median of the paired ratios to the plain fit of the same round.

What it leaves out: the doctor's start (its imports, the launch) and its end of fit (the report,
the gather of every rank's figures), which ``world_zoo.py --pairs`` keeps in its ``trainer.fit``
row; and a doctor started for one fit in a process that already ran others (its caches warm).

``make bench-check`` reads ``ddp-doctor-loop-cost`` here, over 41 rounds (``--json PATH``: rank 0
writes each variant's median, ratio of the medians and median of paired ratios, wall and CPU).

Run ``.venv/bin/python benchmarks/world_cost.py [--quick] [--rounds 9] [--epochs 16] [--json F]``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "zoo"))
import world_job
from _common import alternate_samples, paired_ratio, print_table, quiet_one_thread

from lightning_speedpack.doctor.runner import DoctorSession

__all__ = ["VARIANTS", "fit_loop", "summary"]

#: The variants, rotated round by round; the plain job again is the measurement's own noise.
VARIANTS = ("plain", "doctor", "plain, again")


def fit_loop(variant: str, root: Path) -> tuple[float, float, bool]:
    """One fit of the clean job in ``variant``: its loop's wall and CPU seconds, and rank zero."""
    from pytorch_lightning import Trainer

    kwargs = world_job.trainer_kwargs("clean", root)
    if variant == "doctor":
        with DoctorSession().installed():
            trainer = Trainer(**kwargs)
            model = world_job.MLP("clean")
            trainer.fit(model)
    else:
        trainer = Trainer(**kwargs)
        model = world_job.MLP("clean")
        trainer.fit(model)
    return model.train_s, model.train_cpu_s, trainer.is_global_zero


def summary(seconds: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Each variant's median seconds, its ratio of the medians and median of paired ratios.

    Both ratios are against the plain fits (the plain job's own are 1.0; "plain, again" is the
    A/A, the measurement's noise).

    Example:
        >>> out = summary({"plain": [1.0, 2.0, 3.0], "doctor": [1.2, 2.0, 3.3],
        ...                "plain, again": [1.0, 2.2, 2.7]})
        >>> [round(out[v][k], 3) for v, k in (("doctor", "ratio"), ("doctor", "paired"))]
        [1.0, 1.1]
    """
    plain = statistics.median(seconds["plain"])
    return {
        variant: {
            "median_s": statistics.median(seconds[variant]),
            "ratio": statistics.median(seconds[variant]) / plain,
            "paired": paired_ratio(seconds, variant, "plain"),
        }
        for variant in seconds
    }


def _rows(seconds: dict[str, list[float]]) -> list[list[str]]:
    figures = summary(seconds)
    rows = []
    for variant in VARIANTS:
        mine, found = seconds[variant], figures[variant]
        paired = sorted(m / p for m, p in zip(mine, seconds["plain"], strict=True))
        rows.append(
            [
                variant,
                f"{found['median_s']:.3f}",
                f"**{found['ratio']:.3f}x**",  # issue 37's figure
                f"**{found['paired']:.3f}x**",
                f"{paired[0]:.3f}-{paired[-1]:.3f}x",
                ", ".join(f"{s:.2f}" for s in mine),
            ]
        )
    return rows


def _alternate(
    rounds: int, root: Path
) -> tuple[dict[str, list[float]], dict[str, list[float]], bool]:
    # _common.alternate_samples over the loop's wall seconds; its CPU seconds kept beside.
    fit_loop("doctor", root / "warm-up")  # imports, first paths, the process group: not timed
    cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
    zero = [False]

    def run(variant: str) -> float:
        loop_s, cpu_s, zero[0] = fit_loop(variant, root / f"{len(cpu[variant])}-{variant}")
        cpu[variant].append(cpu_s)
        return loop_s

    wall = alternate_samples({v: functools.partial(run, v) for v in VARIANTS}, rounds)
    return wall, cpu, zero[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds (9, >= 5)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs a fit (16; 32 steps each)")
    parser.add_argument("--quick", action="store_true", help="5 rounds of 4 epochs")
    parser.add_argument("--json", type=Path, help="(rank 0) write the ratios and seconds here")
    args = parser.parse_args()
    args.rounds = args.rounds or (5 if args.quick else 9)
    args.epochs = args.epochs or (4 if args.quick else 16)
    if args.rounds < 5:
        parser.error(f"--rounds must be at least 5 (medians of alternating runs): {args.rounds}")
    # world_job reads its epochs at import in every rank: the child ranks inherit this.
    os.environ["WORLD_JOB_EPOCHS"] = str(args.epochs)
    world_job.EPOCHS = args.epochs
    quiet_one_thread()  # 2 ranks on 2 cores, as the zoo's job
    with tempfile.TemporaryDirectory(prefix="speedpack-world-cost-") as tmp:  # each rank its own
        wall, cpu, zero = _alternate(args.rounds, Path(tmp))
    if not zero:
        return  # rank 1 trained too; rank 0 prints
    header = [
        "variant",
        "median s",
        "ratio of the medians",
        "median of paired ratios",
        "range",
        "seconds",
    ]
    title = (
        f"The clean 2-rank job's training loop ({args.epochs} epochs of 32 steps), "
        f"{args.rounds} rounds alternated in the same two ranks"
    )
    print_table(f"{title}: wall time of rank 0's loop", header, _rows(wall))
    print_table(f"{title}: CPU time of rank 0's process in its loop", header, _rows(cpu))
    if args.json is not None:
        found = {"rounds": args.rounds, "epochs": args.epochs, "seconds": wall, "cpu_s": cpu}
        found.update(wall=summary(wall), cpu=summary(cpu))
        args.json.write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
