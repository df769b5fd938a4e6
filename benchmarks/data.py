"""CachedDataset on a JPEG dataset: epoch time and memory against the alternatives.

Writes >= 2,000 JPEGs of varied sizes to a temporary folder; ``__getitem__`` decodes and resizes
(PIL). Compares, in one process and alternating the variants round by round (medians):

- steady-state epoch time (epoch 2 and later) with 0 and 2 DataLoader workers for: no cache,
  ``CachedDataset``, a ``TensorDataset`` of the decoded tensors (the floor), and the naive
  in-process list cache blog posts recommend;
- total PSS (psutil ``memory_full_info().pss``) of the main process plus its persistent
  workers, after two epochs, minus the same processes' PSS without a cache, divided by the
  decoded payload -- for 1, 2 and 4 workers, CachedDataset beside the naive cache.

Run ``.venv/bin/python benchmarks/data.py [--quick]``.
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
from torch.utils.data import DataLoader, Dataset, TensorDataset

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


def pss_after_two_epochs(dataset: Dataset[Any], workers: int) -> int:
    dl = loader(dataset, workers)
    epoch_seconds(dl)
    epoch_seconds(dl)
    pss = total_pss()
    del dl
    return pss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller images, 3 repeats (< 60 s)")
    args = parser.parse_args()
    n, lo, hi, size, repeats = (2000, 48, 160, 48, 3) if args.quick else (3000, 64, 320, 64, 5)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*worker processes in total.*")  # 4 on 2 cores
    t0 = time.perf_counter()
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
                "cached / TensorDataset (goal <= 1.3x)",
                "naive / cached",
            ],
            rows_time,
        )
        print(f"\ncache_info: {info}")
        print(f"total {time.perf_counter() - t0:.1f} s; pid {os.getpid()}")


if __name__ == "__main__":
    main()
