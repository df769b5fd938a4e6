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

Run ``.venv/bin/python benchmarks/cache.py [--quick] [--only jpeg,stream,small]``.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset, get_worker_info

sys.path.insert(0, str(Path(__file__).parent))
from _common import alternate, print_table

from lightning_speedpack import CachedDataset


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


def total_pss() -> int:
    me = psutil.Process()
    procs = [me, *me.children(recursive=True)]
    return sum(p.memory_full_info().pss for p in procs)


def pss_after_two_epochs(dataset: Dataset[Any], workers: int, batch_size: int = 64) -> int:
    dl = loader(dataset, workers, batch_size)
    epoch_seconds(dl)
    epoch_seconds(dl)
    pss = total_pss()
    del dl
    return pss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller images, 3 repeats (< 60 s)")
    parser.add_argument("--only", default="jpeg,stream,small", help="sections to run")
    args = parser.parse_args()
    only = set(args.only.split(","))
    n, lo, hi, size, repeats = (2000, 48, 160, 48, 3) if args.quick else (3000, 64, 320, 64, 5)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*worker processes in total.*")  # 4 on 2 cores
    t0 = time.perf_counter()
    if "stream" in only:
        bench_stream(repeats)
    if "small" in only:
        bench_small_pss(20_000 if args.quick else 100_000, repeats)
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
            loaders = {
                "uncached": loader(base, workers),
                "CachedDataset": loader(cached, workers),
                "TensorDataset": loader(floor, workers),
                "naive list": loader(NaiveListCache(base, n), workers),
            }
            for dl in loaders.values():  # epoch 1: warm every cache, start every worker
                epoch_seconds(dl)
            med = alternate(
                {k: (lambda dl=dl: epoch_seconds(dl)) for k, dl in loaders.items()}, repeats=repeats
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
            del loaders
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
