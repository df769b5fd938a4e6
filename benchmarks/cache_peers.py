"""CachedDataset beside MONAI's CacheDataset and a naive list cache: epoch time and memory.

Method. The parent writes N JPEGs once to a temporary folder (default 1,500, sources 64-320 px
written with PIL as ``benchmarks/cache.py`` does; ``JpegFolder`` decodes and resizes each to a
3x96x96 uint8 tensor, label ``i % 10``: the deterministic work worth caching). Every
measurement runs in a FRESH child process (this script re-invoked with ``sys.executable`` and
``--variant``) that prints one ``RESULT {json}`` line; the parent alternates the variants round
by round (``--rounds``, default 3) and prints medians and ranges (min-max). Every child imports
the same modules (torch, monai, Lightning via ``cache.py``), so their baselines match.

Variants, each with and without a random transform after the cache (``augment``: random
horizontal flip + random 88x88 crop of the cached uint8 tensor, a plain function):

- ``uncached``: ``JpegFolder`` itself (the transform applied in ``__getitem__``);
- ``monai_eager``: ``monai.data.CacheDataset(data=[{"index": i}], transform=Compose([decode,
  augment]), cache_rate=1.0, num_workers=os.cpu_count(), progress=False)``: MONAI caches up to
  the first transform that is not a deterministic ``monai.transforms.Transform`` (``augment``),
  filling in the constructor (its time counts in epoch 1), and ``deepcopy``s the cached item
  before ``augment`` (MONAI's default ``copy_cache=True``);
- ``monai_runtime``: the same with ``runtime_cache="process"`` (a ``Manager().list``, what
  MONAI's docstring recommends for one process with DataLoader workers) at 1+ workers and
  ``runtime_cache=True`` at 0 workers; it fills during epoch 1;
- ``naive_list``: ``cache.NaiveListCache``, a per-process list filled on first access;
- ``ours``: ``CachedDataset(JpegFolder(...), transform=augment or None)``.

DataLoader: batch 64, ``shuffle=True``, forked persistent workers (``cache.loader``), at 0, 2
and 4 workers. Two children per cell and round:

- ``time``: epoch 1 = dataset construction + the first epoch; epoch 2 = the second epoch,
  uninterrupted;
- ``mem``: epoch 1, then epoch 2 paused after half its batches (0.3 s for the workers' prefetch
  to settle): psutil ``memory_full_info().pss`` summed over the process tree (main, DataLoader
  workers, MONAI's manager process), and per process its ``/proc/<pid>/smaps`` PSS and private
  bytes split by mapping: the ``/dev/shm/speedpack-*`` arena, other shared memory (torch's
  batches in flight), anonymous memory (heap), file-backed. The pause lets workers run ahead,
  which is why epoch 2 is timed in its own child.

Memory is reported as (PSS_tree(variant) - PSS_tree(uncached, same setting, same round)) /
decoded payload (N x 3 x 96 x 96 bytes). Batches in flight are computed, not measured:
workers x prefetch_factor (2) x batch bytes. The arena's allocated size (``st_blocks``, RAM in
/dev/shm even where no process has touched a page, so absent from every PSS) is reported too.

DDP: 2 ranks (``torch.multiprocessing.spawn``, gloo, ``DistributedSampler``, 2 workers each):
epoch 1 and the total PSS of both ranks' trees mid epoch 2, for ``uncached``, ``monai_eager``
(every rank caches the whole dataset), ``monai_partitioned`` (MONAI's ``partition_dataset``:
each rank caches and shuffles only its half, no DistributedSampler) and ``ours`` (one arena per
node). Kill: ``ours`` with 2 workers is SIGKILLed mid epoch 2 (the whole process; and rank 1 of
a DDP run, whose launcher then terminates rank 0): is the run's arena still in /dev/shm right
after the kill, after a ``CachedDataset`` construction while orphaned workers live, once every
process of the run is gone, and after the next construction (which reclaims dead arenas).

Run ``.venv/bin/python benchmarks/cache_peers.py [--quick] [--rounds 3] [--workers 0,2,4]
[--only single,ddp,kill,<variant>,...]`` (the full run: about an hour on 2 cores).

This file is the entry point (arguments, the rounds, the child dispatch); the pieces live beside
it: ``_cache_peers_variants`` (the datasets and transform), ``_cache_peers_memory`` (PSS and
smaps), ``_cache_peers_child`` (one measurement in a child), ``_cache_peers_runner`` (starting
children, the kill case) and ``_cache_peers_report`` (the printed tables).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _cache_peers_child import child
from _cache_peers_memory import MiB
from _cache_peers_report import report
from _cache_peers_runner import Runner, kill_case, rotate
from _cache_peers_variants import DDP_VARIANTS, SIZE, SRC_PX, VARIANTS
from cache import write_jpegs

SECTIONS = ("single", "ddp", "kill")


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="300 images, 1 round (smoke run)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", default="0,2,4", help="DataLoader worker counts")
    parser.add_argument(
        "--only",
        default="",
        help="comma list of sections (single, ddp, kill) and/or variants to run; uncached, "
        "the baseline, always runs",
    )
    parser.add_argument("--n", type=int, default=0, help="number of images (default 1500)")
    parser.add_argument("--save", default="", help="also write the raw records (JSON) here")
    # Child mode (set by the parent):
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--role", default="time", help=argparse.SUPPRESS)
    parser.add_argument("--nw", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--transform", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--ddp", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse()
    if args.variant:
        child(args)
        return
    n = args.n or (300 if args.quick else 1500)
    rounds = 1 if args.quick else args.rounds
    workers = [int(w) for w in args.workers.split(",")]
    only = {x for x in args.only.split(",") if x}
    unknown = only - set(SECTIONS) - set(VARIANTS) - set(DDP_VARIANTS)
    if unknown:
        raise SystemExit(f"--only: unknown {sorted(unknown)}")
    sections = [s for s in SECTIONS if s in only] or list(SECTIONS)
    picked = only - set(SECTIONS)
    variants = [v for v in VARIANTS if not picked or v in picked or v == "uncached"]
    ddp_variants = [v for v in DDP_VARIANTS if not picked or v in picked or v == "uncached"]
    t0 = time.perf_counter()
    records: list[dict[str, Any]] = []
    kills: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="speedpack-bench-peers-") as tmp:
        folder = os.path.join(tmp, "jpegs")
        os.mkdir(folder)
        write_jpegs(Path(folder), n, *SRC_PX)
        print(
            f"{n} JPEGs {SRC_PX[0]}-{SRC_PX[1]} px -> 3x{SIZE}x{SIZE}; sections {sections}; "
            f"workers {workers}; {rounds} round(s); python {sys.version.split()[0]}, torch "
            f"{torch.__version__}, {os.cpu_count()} CPUs",
            flush=True,
        )
        runner = Runner(os.path.abspath(__file__), folder, n, tmp)
        try:
            for rnd in range(rounds):
                if "single" in sections:
                    for nw in workers:
                        for transform in (0, 1):
                            for v in rotate(variants, rnd):
                                for role in ("time", "mem"):
                                    rec = runner.run(v, role, nw, transform)
                                    progress(rnd, rounds, rec, v, role, nw, transform, t0)
                                    if rec is not None:
                                        records.append({**rec, "round": rnd})
                if "ddp" in sections:
                    for transform in (0, 1):
                        for v in rotate(ddp_variants, rnd):
                            rec = runner.run(v, "mem", 2, transform, ddp=True)
                            progress(rnd, rounds, rec, f"DDP {v}", "mem", 2, transform, t0)
                            if rec is not None:
                                records.append({**rec, "round": rnd})
                if "kill" in sections:
                    for ddp in (False, True):
                        row = kill_case(runner, ddp)
                        print(f"[round {rnd + 1}] kill: {row}", file=sys.stderr, flush=True)
                        kills.append({**row, "case": f"round {rnd + 1}: {row['case']}"})
        finally:
            left = sorted(a for a in runner.arenas if os.path.exists(a))
            for path in left:  # every process of ours has exited: these are dead
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            print(
                f"\nclean-up: {len(runner.arenas)} arena(s) reported by the children, "
                f"{len(left)} still in /dev/shm at the end, removed: {left}",
                flush=True,
            )
        report(records, kills, n, rounds, workers, variants, ddp_variants)
    if args.save:
        with open(args.save, "w") as f:
            json.dump({"records": records, "kills": kills, "n": n}, f)
    print(
        f"\nchildren: {runner.count}, failed: {runner.failures}; total "
        f"{time.perf_counter() - t0:.0f} s" + (f"; raw records in {args.save}" if args.save else "")
    )


def progress(
    rnd: int,
    rounds: int,
    rec: dict[str, Any] | None,
    variant: str,
    role: str,
    nw: int,
    transform: int,
    t0: float,
) -> None:
    if rec is None:
        what = "FAILED"
    elif role == "time":
        what = f"epoch 1 {rec['epoch1']:.2f} s, epoch 2 {rec['epoch2']:.3f} s"
    else:
        what = f"epoch 1 {rec['epoch1']:.2f} s, tree PSS {rec['pss_tree'] / MiB:.0f} MiB"
    print(
        f"[round {rnd + 1}/{rounds} {time.perf_counter() - t0:6.0f} s] {variant} w={nw} "
        f"t={transform} {role}: {what}",
        file=sys.stderr,
        flush=True,
    )


if __name__ == "__main__":
    main()
