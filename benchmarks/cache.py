"""CachedDataset on a JPEG dataset: epoch time and memory against the alternatives.

Writes >= 2,000 JPEGs of varied sizes to a temporary folder; ``__getitem__`` decodes and resizes
(PIL). Compares, in one process and alternating the variants round by round (medians):

- steady-state epoch time (epoch 2 and later) with 0 and 2 DataLoader workers for: no cache,
  ``CachedDataset``, a ``TensorDataset`` of the decoded tensors (the floor), and the naive
  in-process list cache blog posts recommend;
- total PSS (psutil ``memory_full_info().pss``) of the main process plus its persistent
  workers, after two epochs, minus the same processes' PSS without a cache, divided by the
  decoded payload -- for 1, 2 and 4 workers, CachedDataset beside the naive cache.

- a stream (``IterableDataset``) of 512 slow items (2 ms each) wrapped by ``CachedDataset``:
  epoch 1 (streams and fills) against epoch 2 (served from the arena), 0 and 2 workers;
- total PSS for 100k small samples (3x32x32 uint8 + label), 1, 2 and 4 workers, alternating
  the no-cache baseline and the cache round by round (medians).

``quick_figures()`` gives ``benchmarks/bench_check.py`` its figures at a quick size.

Run ``.venv/bin/python benchmarks/cache.py [--quick] [--only jpeg,stream,small,tokens]``.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset, get_worker_info

sys.path.insert(0, str(Path(__file__).parent))
from _common import alternate, print_table

from lightning_speedpack import CachedDataset, CachedStream

__all__ = ["small_sample_pss_ratio", "stream_epoch2_ratio"]

TOKENS = 96  # int64 tokens per sample of the tiny-sample figures


class JpegFolder(Dataset[tuple[torch.Tensor, int]]):
    """Decode + resize: the deterministic, expensive part worth caching."""

    def __init__(self, files: list[str], size: int) -> None:
        self.files = files
        self.size = size

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        with Image.open(self.files[i]) as img:
            rgb = img.convert("RGB").resize((self.size, self.size), Image.BILINEAR)
        return torch.from_numpy(np.asarray(rgb).copy()).permute(2, 0, 1).contiguous(), i % 10


class NaiveListCache(Dataset[Any]):
    """The blog-post cache: a Python list filled on first access, private to each process."""

    def __init__(self, dataset: Dataset[Any], n: int) -> None:
        self.dataset = dataset
        self.cache: list[Any] = [None] * n

    def __len__(self) -> int:
        return len(self.cache)

    def __getitem__(self, i: int) -> Any:
        if self.cache[i] is None:
            self.cache[i] = self.dataset[i]
        return self.cache[i]


class SlowStream(IterableDataset[tuple[torch.Tensor, int]]):
    """Items that each cost ``sleep`` seconds (a remote shard being read and decoded)."""

    def __init__(self, n: int, sleep: float) -> None:
        self.n = n
        self.sleep = sleep

    def __iter__(self) -> Any:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(worker, self.n, workers):
            time.sleep(self.sleep)
            yield torch.full((3, 32, 32), i % 251, dtype=torch.uint8), i % 10


class SmallSamples(Dataset[tuple[torch.Tensor, int]]):
    """100k CIFAR-sized samples computed on the fly (no per-index Python objects)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full((3, 32, 32), i % 251, dtype=torch.uint8), i % 10


class Tokens(Dataset[torch.Tensor]):
    """``n`` samples of ``TOKENS`` int64 tokens, computed on the fly (nothing kept per index)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.arange(i, i + TOKENS, dtype=torch.int64)


class TokenStream(IterableDataset[torch.Tensor]):
    """The same samples as ``Tokens`` as a stream that splits itself across workers."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Any:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(worker, self.n, workers):
            yield torch.arange(i, i + TOKENS, dtype=torch.int64)


def _pss_child(variant: str, workers: int, n: int) -> None:
    """One measurement of ``small_sample_pss_ratio`` (run in a fresh process): print its PSS."""
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*worker processes in total.*")
    data: Dataset[Any] = Tokens(n)
    if variant == "cached":
        data = CachedDataset(data, key=f"tokens-{os.getpid()}")
    dl = loader(data, workers, batch_size=256)
    epoch_seconds(dl)
    epoch_seconds(dl)
    gc.collect()
    time.sleep(0.2)  # the workers' prefetch of the next epoch has nothing to do: settled
    print("RESULT " + json.dumps({"pss": total_pss(), "pss_no_files": pss_no_files()}), flush=True)


def small_sample_pss_ratio(workers: int, quick: bool = True, rounds: int = 3) -> float:
    """Total PSS a ``CachedDataset`` of tiny samples adds, over the payload (median of rounds).

    ``n`` samples of 96 int64 tokens (768 bytes each; 100,000, or 40,000 with ``quick``),
    batch 256, shuffled, forked persistent workers, two epochs; total PSS of the main process
    and its workers, without file-backed pages (:func:`pss_no_files`). Each round runs the
    uncached dataset and the cache, alternating, each in a fresh child process, so both start
    from the same interpreter state; the figure is (cached - uncached) / payload. Issue 38's
    bound: <= 1.15.
    """
    n = 40_000 if quick else 100_000
    payload = n * TOKENS * 8
    ratios = []
    for _ in range(rounds):
        pss = {
            v: _run_child(["--pss-child", v, "--workers", str(workers), "--n", str(n)])[
                "pss_no_files"
            ]
            for v in ("uncached", "cached")
        }
        ratios.append((pss["cached"] - pss["uncached"]) / payload)
    return float(statistics.median(ratios))


def _run_child(args: list[str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, timeout=600, check=True
    ).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
    result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    return result


# 15 alternating epochs, not 5: a quick epoch lasts ~0.2 s, and 5 of each read 0.97-1.34x on the
# same code in one sitting (4 readings; 8 of 15 read 0.95-1.19x, 2026-11-28).
STREAM_REPEATS = 15


def stream_epoch2_ratio(quick: bool = True, repeats: int = STREAM_REPEATS) -> float:
    """A cached stream's epoch 2 over the same items in an in-memory ``TensorDataset``.

    ``CachedDataset(TokenStream(n), shuffle=True)`` (8,192 items of 96 int64 tokens, or 4,096
    with ``quick``) against a shuffled ``TensorDataset`` of the same tensor, batch 32, 2 forked
    persistent workers each; epoch 1 of both first (the stream fills the arena), then
    ``repeats`` epochs of each, alternating; the ratio of the medians (issue 38: 1.16).
    """
    n = 4096 if quick else 8192
    torch.set_num_threads(1)
    floor = TensorDataset(torch.stack(list(TokenStream(n))))
    cached = CachedStream(TokenStream(n), shuffle=True, key=f"stream-epoch2-{os.getpid()}")
    try:
        kwargs: dict[str, Any] = {
            "batch_size": 32,
            "num_workers": 2,
            "persistent_workers": True,
            "multiprocessing_context": "fork",
        }
        stream_dl = DataLoader(cached, **kwargs)
        floor_dl = DataLoader(floor, shuffle=True, **kwargs)
        epoch_seconds(stream_dl)  # streams and fills
        epoch_seconds(floor_dl)
        variants: dict[str, Callable[[], float]] = {
            "stream": functools.partial(epoch_seconds, stream_dl),
            "floor": functools.partial(epoch_seconds, floor_dl),
        }
        med = alternate(variants, repeats=repeats)
        del stream_dl, floor_dl, variants
    finally:
        cached.close()
    return med["stream"] / med["floor"]


def bench_tokens(quick: bool, repeats: int) -> None:
    rounds = 3 if quick else 5
    rows = [
        [f"PSS added / payload, {w} workers", f"{small_sample_pss_ratio(w, quick, rounds):.3f}"]
        for w in (2, 4)
    ]
    rows.append(
        [
            "stream epoch 2 / TensorDataset, 2 workers",
            f"{stream_epoch2_ratio(quick, max(repeats, STREAM_REPEATS)):.3f}",
        ]
    )
    print_table(
        f"Tiny samples ({TOKENS} int64 tokens): medians of {rounds} rounds (PSS, fresh "
        "processes) and of alternating epochs (stream); issue 38 bounds <= 1.15 and <= 1.16",
        ["figure", "ratio"],
        rows,
    )


def bench_stream(repeats: int) -> None:
    rows = []
    for workers in (0, 2):
        ratios = []
        for r in range(repeats):
            cached = CachedDataset(
                SlowStream(512, 0.002), shuffle=True, key=f"stream-{workers}-{r}"
            )
            dl = DataLoader(
                cached,
                batch_size=32,
                num_workers=workers,
                multiprocessing_context="fork" if workers else None,
                persistent_workers=workers > 0,
            )
            first = epoch_seconds(dl)
            second = epoch_seconds(dl)
            ratios.append((first, second))
            cached.close()
        firsts = sorted(f for f, _ in ratios)
        seconds = sorted(s for _, s in ratios)
        ratio = sorted(f / s for f, s in ratios)[len(ratios) // 2]
        rows.append(
            [
                workers,
                f"{firsts[len(firsts) // 2]:.3f}",
                f"{seconds[len(seconds) // 2]:.4f}",
                f"{ratio:.0f}x",
            ]
        )
    print_table(
        f"CachedDataset over a stream of 512 items x 2 ms, batch 32 (s, medians of {repeats})",
        [
            "workers",
            "epoch 1 (stream + fill)",
            "epoch 2 (cache)",
            "epoch 1 / epoch 2 (goal >= 10x)",
        ],
        rows,
    )


def bench_small_pss(n: int, repeats: int) -> None:
    payload = n * 3 * 32 * 32
    rows = []
    for workers in (1, 2, 4):
        extras = []
        for r in range(repeats):
            baseline = pss_after_two_epochs(SmallSamples(n), workers, batch_size=256)
            cached = CachedDataset(SmallSamples(n), key=f"small-{workers}-{r}")
            with_cache = pss_after_two_epochs(cached, workers, batch_size=256)
            stored = cached.cache_info().bytes_used
            cached.close()
            extras.append(with_cache - baseline)
        extras.sort()
        mid = extras[len(extras) // 2]
        rows.append(
            [
                workers,
                f"{mid / 2**20:.1f}",
                f"{mid / payload:.3f}",
                f"{min(extras) / payload:.3f}-{max(extras) / payload:.3f}",
                f"{stored / payload:.3f}",
            ]
        )
    print_table(
        f"{n:,} small samples (3x32x32 uint8 + label, payload {payload / 2**20:.0f} MiB): total "
        f"PSS of main + persistent workers after 2 epochs minus the no-cache baseline, median "
        f"of {repeats} alternating rounds",
        ["workers", "extra MiB", "extra / payload (goal <= 1.05)", "range", "stored / payload"],
        rows,
    )


def write_jpegs(folder: Path, n: int, lo: int, hi: int) -> list[str]:
    rng = random.Random(0)
    files = []
    for i in range(n):
        w, h = rng.randint(lo, hi), rng.randint(lo, hi)
        x = np.linspace(0, 255, w, dtype=np.float32)[None, :, None]
        y = np.linspace(0, 255, h, dtype=np.float32)[:, None, None]
        pixels = (x * 0.5 + y * 0.5 + np.float32(rng.random() * 255)) % 256
        noise = np.random.default_rng(i).integers(0, 40, (h, w, 3))
        image = Image.fromarray((np.broadcast_to(pixels, (h, w, 3)) + noise).astype(np.uint8))
        path = folder / f"{i:05d}.jpg"
        image.save(path, quality=90)
        files.append(str(path))
    return files


def loader(dataset: Dataset[Any], workers: int, batch_size: int = 64) -> DataLoader[Any]:
    """A shuffling loader, persistent forked workers."""
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
        multiprocessing_context="fork" if workers else None,
    )


def epoch_seconds(dl: DataLoader[Any]) -> float:
    start = time.perf_counter()
    for _ in dl:
        pass
    return time.perf_counter() - start


def epoch2_medians(
    datasets: dict[str, Dataset[Any]], workers: int, repeats: int
) -> dict[str, float]:
    """Each dataset's epoch time after a first epoch (caches warm, workers started): medians."""
    loaders = {name: loader(ds, workers) for name, ds in datasets.items()}
    for dl in loaders.values():  # epoch 1: warm every cache, start every worker
        epoch_seconds(dl)
    variants: dict[str, Callable[[], float]] = {
        k: functools.partial(epoch_seconds, dl) for k, dl in loaders.items()
    }
    return alternate(variants, repeats=repeats)


def jpeg_epoch2_ratios(
    n: int, lo: int, hi: int, size: int, workers: int, repeats: int
) -> dict[str, float]:
    """Epoch 2 of ``n`` JPEGs (``lo``-``hi`` px -> ``size``): uncached / cached, cached / floor."""
    with tempfile.TemporaryDirectory(prefix="speedpack-bench-") as tmp:
        base = JpegFolder(write_jpegs(Path(tmp), n, lo, hi), size)
        decoded = [base[i] for i in range(n)]
        floor = TensorDataset(
            torch.stack([x for x, _ in decoded]), torch.tensor([y for _, y in decoded])
        )
        cached = CachedDataset(base, key=f"bench-q-{size}-{workers}")
        try:
            for i in range(n):  # fill once: every variant's "epoch 1"
                cached[i]
            med = epoch2_medians(
                {"uncached": base, "CachedDataset": cached, "TensorDataset": floor},
                workers,
                repeats,
            )
        finally:
            cached.close()
    c = med["CachedDataset"]
    return {"speedup": med["uncached"] / c, "over_floor": c / med["TensorDataset"]}


def total_pss() -> int:
    me = psutil.Process()
    procs = [me, *me.children(recursive=True)]
    return sum(p.memory_full_info().pss for p in procs)


def pss_no_files() -> int:
    """Anonymous and shared-memory PSS of this process and its children (Linux).

    Total PSS also counts each process's share of the shared libraries' pages it maps
    (``libtorch_cpu.so``: tens of MiB), and that share depends on how many *other* processes on
    the machine map the same pages at that moment: a test run elsewhere starting or ending
    between the uncached and the cached child moved issue 38's figure by +-0.3x (0.98x to
    1.51x measured, below the arena's own 1.125x once). Heap, stacks and the arena (``/dev/shm``
    is shared memory) are what a cache adds; library code pages are not.
    """
    me = psutil.Process()
    total = 0
    for proc in [me, *me.children(recursive=True)]:
        with open(f"/proc/{proc.pid}/smaps_rollup") as rollup:
            for line in rollup:
                name, value, *_ = line.split()
                if name in ("Pss_Anon:", "Pss_Shmem:"):
                    total += int(value) * 1024
    return total


def pss_after_two_epochs(dataset: Dataset[Any], workers: int, batch_size: int = 64) -> int:
    dl = loader(dataset, workers, batch_size)
    epoch_seconds(dl)
    epoch_seconds(dl)
    pss = total_pss()
    del dl
    return pss


def quick_figures(which: str) -> dict[str, float]:
    """``benchmarks/bench_check.py``'s figures: ``"memory"`` (PSS) or ``"timing"`` (epoch 2)."""
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*worker processes in total.*")
    if which == "memory":
        return {f"small_pss_{w}w": small_sample_pss_ratio(w, quick=True) for w in (2, 4)}
    return {
        "jpeg_speedup_0w": jpeg_epoch2_ratios(600, 64, 320, 64, 0, 5)["speedup"],
        "stream_over_floor": stream_epoch2_ratio(quick=True),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller images, 3 repeats (< 60 s)")
    parser.add_argument("--only", default="jpeg,stream,small,tokens", help="sections to run")
    parser.add_argument("--pss-child", choices=("uncached", "cached"), help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pss_child:
        _pss_child(args.pss_child, args.workers, args.n)
        return
    only = set(args.only.split(","))
    n, lo, hi, size, repeats = (2000, 48, 160, 48, 3) if args.quick else (3000, 64, 320, 64, 5)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*worker processes in total.*")  # 4 on 2 cores
    t0 = time.perf_counter()
    if "stream" in only:
        bench_stream(repeats)
    if "small" in only:
        bench_small_pss(20_000 if args.quick else 100_000, repeats)
    if "tokens" in only:
        bench_tokens(args.quick, repeats)
    if "jpeg" not in only:
        return
    with tempfile.TemporaryDirectory(prefix="speedpack-bench-") as tmp:
        files = write_jpegs(Path(tmp), n, lo, hi)
        base = JpegFolder(files, size)
        payload = sum(base[i][0].numel() for i in range(n))  # uint8
        print(
            f"{n} JPEGs {lo}-{hi} px -> 3x{size}x{size} uint8; decoded payload "
            f"{payload / 2**20:.1f} MiB; setup {time.perf_counter() - t0:.1f} s"
        )

        # Memory first, while the main process holds no decoded data: workers fill the caches.
        rows_mem = []
        for workers in (1, 2, 4):
            baseline = pss_after_two_epochs(base, workers)  # same decode work, nothing kept
            fresh = CachedDataset(base, key=f"bench-mem-{workers}")
            with_cache = pss_after_two_epochs(fresh, workers)
            fresh.close()
            naive = pss_after_two_epochs(NaiveListCache(base, n), workers)
            rows_mem.append(
                [
                    workers,
                    f"{baseline / 2**20:.0f}",
                    f"{(with_cache - baseline) / 2**20:.1f}",
                    f"{(with_cache - baseline) / payload:.2f}",
                    f"{(naive - baseline) / 2**20:.1f}",
                    f"{(naive - baseline) / payload:.2f}",
                ]
            )
        print_table(
            f"Total PSS of main + persistent workers after 2 epochs, minus the same "
            f"processes decoding without a cache (payload {payload / 2**20:.1f} MiB)",
            [
                "workers",
                "baseline MiB",
                "CachedDataset extra MiB",
                "CachedDataset extra / payload (goal <= 1.15)",
                "naive extra MiB",
                "naive extra / payload",
            ],
            rows_mem,
        )

        decoded = [base[i] for i in range(n)]
        floor = TensorDataset(
            torch.stack([x for x, _ in decoded]), torch.tensor([y for _, y in decoded])
        )
        cached = CachedDataset(base, key=f"bench-{size}")
        for i in range(n):  # fill once (the "epoch 1" of every variant below)
            cached[i]
        rows_time = []
        for workers in (0, 2):
            med = epoch2_medians(
                {
                    "uncached": base,
                    "CachedDataset": cached,
                    "TensorDataset": floor,
                    "naive list": NaiveListCache(base, n),
                },
                workers,
                repeats,
            )
            c = med["CachedDataset"]
            rows_time.append(
                [
                    workers,
                    f"{med['uncached']:.3f}",
                    f"{c:.3f}",
                    f"{med['TensorDataset']:.3f}",
                    f"{med['naive list']:.3f}",
                    f"{med['uncached'] / c:.1f}x",
                    f"{c / med['TensorDataset']:.2f}x",
                    f"{med['naive list'] / c:.2f}x",
                ]
            )
        info = cached.cache_info()
        cached.close()
        print_table(
            f"Epoch-2 time, {n} images, batch 64 (s, medians of {repeats} alternating rounds)",
            [
                "workers",
                "uncached",
                "cached",
                "TensorDataset",
                "naive list",
                "uncached / cached (goal >= 10x)",
                "cached / TensorDataset (goal <= 1.15x)",
                "naive / cached",
            ],
            rows_time,
        )
        print(f"\ncache_info: {info}")
        print(f"total {time.perf_counter() - t0:.1f} s; pid {os.getpid()}")


if __name__ == "__main__":
    main()
