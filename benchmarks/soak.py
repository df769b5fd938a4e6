"""Soak: the DDP recipe N times back to back on a loaded CPU; count what goes wrong.

Not a unit test: a reliability benchmark for issue 12 ("never hang, never leave anything
behind"). Two busy loops keep both cores loaded while ``examples/ddp_recipe.py`` runs again and
again on 2 CPU ranks (Lightning's own launcher), cycling through four variants: strategy
``ddp`` / ``ddp_speedpack`` x DataLoader workers started with ``fork`` / ``spawn``. Each run is
a fresh session with a time limit (``tests/helpers/procs.py``), and after each run the soak
counts:

* hangs: the run passed its time limit; the Python stack of every process it had started is
  saved to ``<stacks-dir>/run<N>-<variant>.txt`` before they are all killed;
* failures: the recipe exited with a non-zero code (stderr saved beside the stacks);
* processes left: anything the run started still alive after it exited (in its session, or
  having left it, or re-parented to init with the run's data folder in its command line);
* files left: ``/dev/shm/speedpack-*`` files of the recipe's dataset still there after it exited;
* cache short: a rank reported fewer cached items than images after the fit ("56 of 64 cached":
  with 2 ranks x 2 epochs every image is read on the node, so each must be cached once).

Goal: 0 in every column. Usage::

    .venv/bin/python benchmarks/soak.py               # 50 runs, about 40-60 s each here
    .venv/bin/python benchmarks/soak.py --runs 4      # a quick check (also: --quick)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lightning_speedpack.cache import reclaim  # noqa: E402
from tests.helpers.procs import (  # noqa: E402 (the repo root goes on sys.path first)
    ProcessTimeout,
    describe,
    kill_sessions,
    run_in_session,
)

RECIPE = REPO / "examples" / "ddp_recipe.py"
VARIANTS = [
    ("ddp", "fork"),
    ("ddp_speedpack", "fork"),
    ("ddp", "spawn"),
    ("ddp_speedpack", "spawn"),
]
SHM = Path("/dev/shm")


@dataclass
class Tally:
    """What went wrong in the runs of one variant."""

    runs: int = 0
    hangs: int = 0
    failures: int = 0
    processes_left: int = 0
    files_left: int = 0
    cache_short: int = 0
    seconds: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        self.runs += other.runs
        self.hangs += other.hangs
        self.failures += other.failures
        self.processes_left += other.processes_left
        self.files_left += other.files_left
        self.cache_short += other.cache_short
        self.seconds += other.seconds


def start_busy_loops(n: int) -> list[subprocess.Popen[bytes]]:
    """``n`` processes spinning on a core each, each in a session of its own."""
    return [
        subprocess.Popen(
            [sys.executable, "-c", "while True: pass"],
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(n)
    ]


def stop_busy_loops(loops: list[subprocess.Popen[bytes]]) -> None:
    kill_sessions([p.pid for p in loops])
    for p in loops:
        p.wait()


def orphans_of(marker: str) -> list[psutil.Process]:
    """Processes re-parented to init (or to a sub-reaper) whose command line has ``marker``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.ppid() == 1 and marker in " ".join(proc.cmdline()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def left_behind(own: set[str]) -> tuple[list[str], list[str]]:
    """After a run: the files it left, and the live arenas of other jobs (not counted).

    Left: this run's own arena (the path its ranks reported) or a draft of it, whatever its
    state -- every process of the run is gone by now -- and any ``speedpack-*`` file nobody
    holds (a run that died before reporting its path). Not counted: arenas a live process of
    another job maps (e.g. a ``make test`` running beside the soak: its DDP recipe test uses
    the same dataset and so the same name prefix).
    """
    left, others = [], []
    for entry in reclaim.scan(str(SHM)) if SHM.is_dir() else []:
        mine = any(entry.path == p or entry.path.startswith(p + ".") for p in own)
        if mine or entry.status == "dead":
            left.append(entry.path)
        else:
            others.append(entry.path)
    return left, others


def one_run(
    index: int,
    strategy: str,
    start_method: str,
    args: argparse.Namespace,
    data_dir: Path,
    work: Path,
) -> Tally:
    tally = Tally(runs=1)
    variant = f"{strategy}/{start_method}"
    out = work / f"run{index}"
    env = {
        **os.environ,
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(out / "wandb"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    cmd = [
        sys.executable,
        str(RECIPE),
        "--strategy",
        strategy,
        "--worker-start-method",
        start_method,
        "--images",
        str(args.images),
        "--epochs",
        "2",
        "--max-batch",
        "16",
        "--data-dir",
        str(data_dir),
        "--out",
        str(out),
    ]
    started = time.monotonic()
    stderr = ""
    try:
        proc = run_in_session(cmd, timeout=args.time_limit, env=env, cwd=out.parent, grace=5.0)
    except ProcessTimeout as err:
        tally.hangs = 1
        saved = args.stacks_dir / f"run{index}-{strategy}-{start_method}.txt"
        saved.write_text(str(err))
        tally.notes.append(f"run {index} ({variant}): HANG, stacks in {saved}")
        leftovers: list[str] = []
    else:
        tally.seconds.append(time.monotonic() - started)
        leftovers = proc.leftovers
        stderr = proc.stderr
        if proc.returncode != 0:
            tally.failures = 1
            saved = args.stacks_dir / f"run{index}-{strategy}-{start_method}.stderr.txt"
            saved.write_text(proc.stderr)
            tally.notes.append(
                f"run {index} ({variant}): exit {proc.returncode}, stderr in {saved}"
            )
    # Anything that escaped the session and the token: re-parented, naming this soak's data.
    for orphan in orphans_of(str(data_dir)):
        leftovers.append(describe(orphan))
        with contextlib.suppress(psutil.Error):
            orphan.kill()
    if leftovers:
        tally.processes_left = len(leftovers)
        tally.notes.append(f"run {index} ({variant}): left {leftovers}")
    # Cache figures and the arena's name, from what each rank wrote.
    own: set[str] = set()
    for rank in (0, 1):
        report = out / f"rank{rank}.json"
        if not report.exists():
            continue
        summary: dict[str, Any] = json.loads(report.read_text())
        items = int(summary["cache"]["items"])
        if items != args.images:
            tally.cache_short += 1
            tally.notes.append(
                f"run {index} ({variant}): rank {rank} {items} of {args.images} cached"
            )
        if summary.get("cache_path"):
            own.add(str(summary["cache_path"]))
    left, others = left_behind(own)
    if others:
        tally.notes.append(f"run {index} ({variant}): not counted, in use by other jobs: {others}")
    if left:
        tally.files_left = len(left)
        saved = args.stacks_dir / f"run{index}-{strategy}-{start_method}.shm-left.txt"
        saved.write_text(stderr)  # both ranks' output: did one die before its clean-up?
        tally.notes.append(
            f"run {index} ({variant}): left {[Path(p).name for p in left]}, stderr in {saved}"
        )
        for path in left:  # count each once, not again after the next run
            with contextlib.suppress(OSError):
                os.unlink(path)
    return tally


def print_table(tallies: dict[str, Tally]) -> None:
    total = Tally()
    print(
        "| variant | runs | hangs | failures | processes left | /dev/shm files left "
        "| cache short | median s/run |"
    )
    print("|---|---|---|---|---|---|---|---|")

    def row(name: str, t: Tally) -> None:
        median = f"{statistics.median(t.seconds):.1f}" if t.seconds else "-"
        print(
            f"| {name} | {t.runs} | {t.hangs} | {t.failures} | {t.processes_left} "
            f"| {t.files_left} | {t.cache_short} | {median} |"
        )

    for name, tally in tallies.items():
        row(name, tally)
        total.add(tally)
    row("**total**", total)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="4 runs: one per variant")
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--time-limit", type=float, default=240.0, help="seconds per run")
    parser.add_argument("--busy", type=int, default=2, help="busy-loop processes loading the CPU")
    parser.add_argument(
        "--variant",
        action="append",
        choices=[f"{s}/{m}" for s, m in VARIANTS],
        help="run only this variant (repeatable; default: all four in turn)",
    )
    parser.add_argument(
        "--stacks-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "speedpack-soak",
        help="where the stacks of hung runs and the stderr of failed runs are saved",
    )
    args = parser.parse_args()
    # A SIGTERM (``kill``, a CI time limit) unwinds like Ctrl-C: the busy loops and the current
    # run's session are killed on the way out instead of outliving the soak.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    runs = 4 if args.quick else args.runs
    args.stacks_dir.mkdir(parents=True, exist_ok=True)
    variants = [(s, m) for s, m in VARIANTS if not args.variant or f"{s}/{m}" in args.variant]
    tallies = {f"{s}/{m}": Tally() for s, m in variants}
    print(
        f"soak: {runs} runs of {RECIPE.name} ({args.images} images, 2 ranks, 2 epochs), "
        f"{args.busy} busy loops, {args.time_limit:.0f} s limit per run; "
        f"stacks/stderr to {args.stacks_dir}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="speedpack-soak-") as tmp:
        work = Path(tmp)
        data_dir = work / "jpegs"
        sys.path.insert(0, str(RECIPE.parent))
        from jpeg_common import write_jpegs  # the examples' own data, written once

        write_jpegs(data_dir, args.images)
        loops = start_busy_loops(args.busy)
        try:
            for index in range(runs):
                strategy, start_method = variants[index % len(variants)]
                tally = one_run(index, strategy, start_method, args, data_dir, work)
                tallies[f"{strategy}/{start_method}"].add(tally)
                status = (
                    "HANG"
                    if tally.hangs
                    else "FAIL"
                    if tally.failures
                    else f"ok {tally.seconds[0]:.0f} s"
                )
                print(f"run {index + 1}/{runs} {strategy}/{start_method}: {status}", flush=True)
                for note in tally.notes:
                    print("   ", note, flush=True)
        finally:
            stop_busy_loops(loops)
    print()
    print_table(tallies)


if __name__ == "__main__":
    main()
