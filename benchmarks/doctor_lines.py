"""The doctor's own work a training step, counted rather than timed: Python lines executed.

The doctor's cost on the DDP zoo's millisecond MLP (``world_zoo.py --pairs``) swings from 1.01x to
1.35x between runs of the same code on this shared 2-core machine: a timing cannot tell a change
of 10% in the doctor's own work from the noise. The work itself can be counted. One rank of that
job (``zoo/world_job.py``'s clean MLP, ``strategy="ddp"`` on gloo, one torch thread) is fitted in
this process plainly and under the doctor's default set, with ``sys.settrace`` counting the Python
lines executed on the training thread from the model's ``on_train_start`` to the end of the last
step's ``on_train_batch_end`` (the once-a-fit work at the end of training is left out: its heap
scan runs within a time budget, so its lines would depend on the clock). Each line is charged
to the module whose code it is: a pack module by its folder and file (``wall_time/ledger``), or
Lightning and torch (``site-packages``), or the standard library (``stdlib``, mostly the
``contextlib`` of Lightning's profiler contexts).

The figure is the doctor's extra lines a step (doctor minus plain, over the steps): the same on
every run of the same code and versions, whatever the machine's load, and what the per-step
Python work of the pack costs, about 0.25 us a line here. C work (torch's kernels, the
``perf_counter`` a line calls) is not counted: this measures the interpreted overhead only, the
part of the doctor's cost that grows with the number of hooks and actions a step.

Run ``.venv/bin/python benchmarks/doctor_lines.py [--steps 256]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "zoo"))
import world_job
from _common import print_table
from doctor_floor import one_rank_setup, one_rank_trainer

__all__ = ["count", "count_lines", "quick_figures"]

_PACK = f"{os.sep}lightning_speedpack{os.sep}"
STEPS = 256  # 8 epochs of the zoo's 32 batches: the sparse per-epoch and per-64-step work amortised


def _owner(filename: str, cache: dict[str, str]) -> str:
    owner = cache.get(filename)
    if owner is None:
        at = filename.find(_PACK)
        if at >= 0:
            owner = filename[at + len(_PACK) :].removesuffix(".py").replace(os.sep, "/")
        elif "site-packages" in filename:
            owner = "site-packages"
        else:
            owner = "stdlib"
        cache[filename] = owner
    return owner


class _Counted(world_job.MLP):
    """The zoo's MLP, with the lines of its training loop counted by module."""

    counts: Counter[str]
    calls: Counter[str]

    def on_train_start(self) -> None:
        counts: Counter[str] = Counter()
        calls: Counter[str] = Counter()
        cache: dict[str, str] = {}

        def local(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "line":
                counts[_owner(frame.f_code.co_filename, cache)] += 1
            return local

        def entered(frame: FrameType, event: str, arg: Any) -> Any:
            calls[_owner(frame.f_code.co_filename, cache)] += 1  # a Python frame begins
            return local

        self.counts, self.calls = counts, calls
        sys.settrace(entered)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # Lightning calls the callbacks' hook first: the last step's work is in. What comes
        # after (the end of training: a walk, a heap scan within a time budget, the world's
        # exchange) is once a fit, and its budget depends on the clock, so it is left out.
        if self.trainer.global_step >= self.trainer.max_steps:
            sys.settrace(None)

    def on_train_end(self) -> None:
        sys.settrace(None)


def count_lines(variant: str, steps: int = STEPS) -> Counter[str]:
    """Python lines executed in ``steps`` training steps, by module (``plain`` or ``doctor``)."""
    return count(variant, steps)[0]


def count(variant: str, steps: int = STEPS) -> tuple[Counter[str], Counter[str]]:
    """Python lines run and Python calls made in ``steps`` training steps, by module."""
    trainer = one_rank_trainer(steps, doctor=variant != "plain")
    model = _Counted("clean")
    try:
        trainer.fit(model)
    finally:
        sys.settrace(None)
    return model.counts, model.calls


def _setup() -> None:
    one_rank_setup(29587)


def measure(steps: int = STEPS) -> tuple[tuple[Counter[str], ...], tuple[Counter[str], ...]]:
    """The plain and the doctor's ``(lines, calls)`` counts of one fit each."""
    _setup()
    return count("plain", steps), count("doctor", steps)


def quick_figures(steps: int = STEPS) -> dict[str, float]:
    """``doctor-lines-per-step``: the doctor's extra Python lines a training step.

    Counted in a child running this script: the doctor's retention walk reads the ``__main__``
    module's containers, so the count is the same only under the same ``__main__``.
    """
    cmd = [sys.executable, str(Path(__file__).resolve()), "--steps", str(steps), "--figure"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"doctor_lines.py exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return {"doctor-lines-per-step": float(proc.stdout.strip().splitlines()[-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=STEPS, help="training steps a fit")
    parser.add_argument("--top", type=int, default=20, help="modules listed")
    parser.add_argument("--figure", action="store_true", help="print the extra lines a step only")
    parser.add_argument(
        "--quick", action="store_true", help="the same run: a count, not a timing (~1 minute)"
    )
    args = parser.parse_args()
    (plain, plain_calls), (doctor, doctor_calls) = measure(args.steps)
    n = args.steps
    if args.figure:
        print((sum(doctor.values()) - sum(plain.values())) / n)
        return
    extra = {k: (doctor[k] - plain[k]) / n for k in set(plain) | set(doctor)}
    rows = [
        [
            module,
            f"{plain[module] / n:.1f}",
            f"{doctor[module] / n:.1f}",
            f"{d:+.1f}",
            f"{(doctor_calls[module] - plain_calls[module]) / n:+.1f}",
        ]
        for module, d in sorted(extra.items(), key=lambda kv: -abs(kv[1]))[: args.top]
        if abs(d) >= 0.05
    ]
    total_p, total_d = sum(plain.values()) / n, sum(doctor.values()) / n
    calls = (sum(doctor_calls.values()) - sum(plain_calls.values())) / n
    rows.append(
        [
            "**all**",
            f"{total_p:.0f}",
            f"{total_d:.0f}",
            f"**{total_d - total_p:+.0f}**",
            f"{calls:+.0f}",
        ]
    )
    print_table(
        f"Python lines a training step, one DDP rank (gloo), the zoo's clean MLP, {n} steps: "
        f"plain and under the doctor ({total_d / total_p:.2f}x the plain loop's lines; the "
        f"Python calls it adds, a call charged to the module called, beside them)",
        ["module", "plain", "doctor", "doctor's extra", "extra calls"],
        rows,
    )


if __name__ == "__main__":
    main()
