"""The doctor's cost on the clean 2-rank job, counted in machine instructions rather than timed.

``world_cost.py`` times the clean 2-rank job (the DDP zoo's MLP, ~4-6 ms a step) plain and under
the doctor; on this shared 2-core machine its A/A (the plain job against itself) moves by up to
±5%, as much as the cost it measures. The work itself can be counted: both ranks of one launch
run under valgrind's callgrind, which counts the instructions each process executes, from the
training batch that starts at global step ``--start`` to the end of the one that ends at
``--start + --steps`` (client requests from the model's hooks switch the count on and off, so
the imports, the launch and the end of fit are left out). The plain job and the doctor's
(``DoctorSession().installed()`` around the Trainer, as ``speedpack doctor`` does) are
launched one after the other, and each rank's instructions a step are compared to the plain
rank's. Two launches of the same code and versions gave counts within 1% of each other, whatever
the machine's load (the CPU's caches, a sleeping thread's wake-up and a syscall's kernel time are
not counted: a count is a floor of the time, not the time).

Left out of the count: libgomp's spinning threads (an OpenMP pool that waits by spinning; one
torch thread a rank, but the pool's idle loop still shows up, by thousands of instructions that
depend on timing alone).

Needs valgrind (with its ``callgrind.h``) and a C compiler: ``apt-get install valgrind gcc``.
About 9 minutes a launch here (both ranks ~50x slower under valgrind; ``--quick`` counts 64 steps).

Run ``.venv/bin/python benchmarks/doctor_instructions.py [--steps 512] [--start 16]``.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "zoo"))
from _common import print_table

__all__ = ["count_launch", "instructions"]

_HELPER = r"""
#include <valgrind/callgrind.h>
void count_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void count_stop(void) { CALLGRIND_DUMP_STATS_AT("loop"); CALLGRIND_STOP_INSTRUMENTATION; }
"""
_HELPER_ENV = "SPEEDPACK_COUNT_HELPER"
_VARIANTS = ("plain", "doctor")


def _build_helper(directory: Path) -> Path:
    source, library = directory / "count.c", directory / "libcount.so"
    source.write_text(_HELPER)
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return library


def _rank(variant: str, start: int, steps: int) -> None:
    """One rank of the clean job (Lightning's launcher starts the other): the counted fit."""
    import world_job
    from _common import quiet_one_thread
    from pytorch_lightning import Trainer

    from lightning_speedpack.doctor.runner import DoctorSession

    helper = ctypes.CDLL(os.environ[_HELPER_ENV])

    class Counted(world_job.MLP):
        def on_train_batch_start(self, batch: object, batch_idx: int) -> None:
            if self.trainer.global_step == start:
                helper.count_start()

        def on_train_batch_end(self, outputs: object, batch: object, batch_idx: int) -> None:
            if self.trainer.global_step == start + steps:
                helper.count_stop()

    quiet_one_thread()
    kwargs = world_job.trainer_kwargs("clean", Path(tempfile.mkdtemp()))
    kwargs["max_epochs"] = (start + steps) // (world_job.SAMPLES // (2 * world_job.BATCH)) + 1
    if variant == "doctor":
        with DoctorSession().installed():
            trainer = Trainer(**kwargs)
    else:
        trainer = Trainer(**kwargs)
    trainer.fit(Counted("clean"))


def instructions(dump: Path) -> int:
    """The instructions in one callgrind dump, less libgomp's anonymous spinning functions."""
    out = subprocess.run(
        ["callgrind_annotate", "--threshold=100", str(dump)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    total = 0
    for line in out.splitlines():
        found = re.match(r"\s*([\d,]+) \([ \d.]+%\)\s+(\S.*)", line)
        if found and "PROGRAM TOTALS" not in line:
            if found.group(2).startswith("???:0x") and "libgomp" in found.group(2):
                continue
            total += int(found.group(1).replace(",", ""))
    return total


def count_launch(variant: str, start: int, steps: int, directory: Path) -> list[int]:
    """Each rank's counted instructions (rank order by process id), one launch of ``variant``."""
    env = {**os.environ, _HELPER_ENV: str(directory / "libcount.so")}
    prefix = directory / variant
    cmd = [
        "valgrind", "--tool=callgrind", "--trace-children=yes", "--instr-atstart=no",
        f"--callgrind-out-file={prefix}.%p.out",
        sys.executable, str(Path(__file__).resolve()), "--rank", variant,
        "--start", str(start), "--steps", str(steps),
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    dumps = sorted(directory.glob(f"{variant}.*.out.1"), key=lambda p: int(p.name.split(".")[1]))
    if proc.returncode != 0 or len(dumps) != 2:
        tail = proc.stderr[-3000:]
        raise RuntimeError(f"the {variant} launch failed ({proc.returncode}):\n{tail}")
    return [instructions(d) for d in dumps]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=512, help="training steps counted a rank")
    parser.add_argument("--start", type=int, default=16, help="the first counted global step")
    parser.add_argument("--quick", action="store_true", help="64 steps counted")
    parser.add_argument("--rank", choices=_VARIANTS, help=argparse.SUPPRESS)  # a launched rank
    args = parser.parse_args()
    if args.rank:
        _rank(args.rank, args.start, args.steps)
        return
    if args.quick:
        args.steps = 64
    missing = [tool for tool in ("valgrind", "callgrind_annotate", "gcc") if not shutil.which(tool)]
    if missing:  # `make bench` goes on without this count
        print(f"doctor_instructions.py: skipped, needs {', '.join(missing)} (apt-get install)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        _build_helper(directory)
        counts = {v: count_launch(v, args.start, args.steps, directory) for v in _VARIANTS}
    plain = counts["plain"]
    rows = [
        [
            variant,
            *(f"{c / args.steps / 1e6:.3f} M" for c in counts[variant]),
            *(f"**{c / p:.3f}x**" for c, p in zip(counts[variant], plain, strict=True)),
        ]
        for variant in _VARIANTS
    ]
    print_table(
        f"The clean 2-rank job, instructions a training step of each rank (callgrind, global "
        f"steps {args.start} to {args.start + args.steps}, libgomp's spinning left out)",
        ["variant", "first rank", "second rank", "first / plain", "second / plain"],
        rows,
    )


if __name__ == "__main__":
    main()
