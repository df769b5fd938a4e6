"""GPU check ``cache``: CachedDataset feeding the GPU against the decoding loader it wraps.

A dataset whose ``__getitem__`` decodes a JPEG (bytes made with PIL in memory, 320x240,
quality 90) and resizes it to 224x224 is read by a plain ``DataLoader`` and, wrapped in
:class:`~lightning_speedpack.CachedDataset`, by the same ``DataLoader`` settings
(``batch_size=128``, ``pin_memory=True``); every batch is copied to the GPU with
``non_blocking=True`` and summed there, and each epoch ends with one
``torch.cuda.synchronize()``. After the cache's first epoch (it fills), the two loaders
alternate for 5 rounds, an epoch each, the order swapped every round; the line holds the
ratio of the median samples/s to at least 5x, with 0 workers and with 4 persistent workers
(each with an untimed first epoch that starts them). The pixel sums of both loaders' epochs
must be equal (the cache serves the decoded bytes, not others) and the cache must have
decoded each sample once (its own counters).

Exercised on the CPU only (``--dry``: 256 JPEGs of 160x120 decoded to 32x32, batches of 32,
0 workers, ``pin_memory=False`` and no copy, since there is no GPU): the whole path but the
pinned copy to CUDA and the 4-worker line (SKIP: worker processes on a shared 2-core machine).
The 5x bound is held on the CPU too: decoding against reading the cache does not need a GPU.
If ``/dev/shm`` is too small for the arena, the cache falls back to ``storage="disk"`` (the
figure says so); with under 1 GiB free there, the 4-worker line is SKIP (workers hand batches
over through ``/dev/shm``).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from benchmarks.gpu._vision import JpegBlobs, jpeg_blobs, median
from benchmarks.gpu.context import Context, result

__all__ = ["NAME", "TIMEOUT_S", "run"]

NAME = "cache"
TIMEOUT_S = {"gpu": 60.0, "dry": 45.0}

BOUND = 5.0  # epoch 2's samples/s over the decoding loader's
SHM = "/dev/shm"
MIN_SHM_FOR_WORKERS = 1 << 30


@dataclass(frozen=True)
class Plan:
    """Sizes of one run of the check."""

    device: str
    dry: bool
    images: int
    width: int
    height: int
    size: int
    batch: int
    rounds: int
    workers: tuple[int, ...]

    @property
    def pin(self) -> bool:
        return not self.dry


def plan_for(ctx: Context) -> Plan:
    if ctx.dry:
        return Plan("cpu", True, 256, 160, 120, 32, 32, 5, (0,))
    return Plan(ctx.device, False, 1024, 320, 240, 224, 128, 5, (0, 4))


def epoch(loader: DataLoader[Any], device: torch.device) -> tuple[float, int, int]:
    """One epoch: seconds, samples, and the pixel sum (summed on the device)."""
    start = time.perf_counter()
    samples = 0
    total = torch.zeros((), dtype=torch.int64, device=device)
    for pixels, labels in loader:
        pixels = pixels.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        total += pixels.sum(dtype=torch.int64) + labels.sum()
        samples += pixels.shape[0]
    if device.type == "cuda":
        torch.cuda.synchronize()  # the end of the timed region: every copy has landed
    seconds = time.perf_counter() - start
    return seconds, samples, int(total)


def _cached(dataset: JpegBlobs, key: str, tmp: Path) -> tuple[Any, str]:
    """The cache in ``/dev/shm`` with room for every sample, or on disk when that does not fit."""
    from lightning_speedpack import CachedDataset

    room = int(len(dataset) * (3 * dataset.size**2 + 1024) * 1.1) + (16 << 20)
    try:
        return CachedDataset(dataset, key=key, max_bytes=room), "shared memory (/dev/shm)"
    except (RuntimeError, ValueError) as err:  # more than /dev/shm has free
        first = str(err).splitlines()[0][:160]
        path = tmp / "cache.bin"
        cached = CachedDataset(dataset, key=key, max_bytes=room, storage="disk", path=path)
        return cached, f"disk (the shared-memory arena failed: {first})"


def _loader(dataset: Any, plan: Plan, workers: int) -> DataLoader[Any]:
    return DataLoader(
        dataset,
        batch_size=plan.batch,
        num_workers=workers,
        persistent_workers=workers > 0,
        pin_memory=plan.pin,
    )


def _compare(
    plan: Plan, device: torch.device, plain: DataLoader[Any], cached: DataLoader[Any]
) -> dict[str, Any]:
    """Alternate an epoch of each, ``rounds`` times; rates and pixel sums."""
    rates: dict[str, list[float]] = {"plain": [], "cached": []}
    sums: dict[str, set[int]] = {"plain": set(), "cached": set()}
    for r in range(plan.rounds):
        order = ("plain", "cached") if r % 2 == 0 else ("cached", "plain")
        for name in order:
            seconds, samples, total = epoch(plain if name == "plain" else cached, device)
            rates[name].append(samples / seconds)
            sums[name].add(total)
    return {
        "plain": rates["plain"],
        "cached": rates["cached"],
        "plain_sums": sorted(sums["plain"]),
        "cached_sums": sorted(sums["cached"]),
    }


def run(ctx: Context) -> list[dict[str, Any]]:
    """The cache's epoch 2 against the decoding loader (see the module's docstring)."""
    plan = plan_for(ctx)
    if plan.dry:
        torch.set_num_threads(1)  # a shared 2-core machine: spinning intra-op threads stall
    device = torch.device(plan.device)
    start = time.perf_counter()
    blobs = jpeg_blobs(plan.images, plan.width, plan.height, classes=16)
    made_s = time.perf_counter() - start
    setting = (
        f"{plan.images} JPEGs {plan.width}x{plan.height} decoded to {plan.size}x{plan.size}, "
        f"batches of {plan.batch}, "
        + (
            "no copy (dry: CPU, pin_memory=False)"
            if plan.dry
            else f"pin_memory=True, non_blocking copy to {plan.device}"
        )
    )
    bound = f">= {BOUND:g}x the decoding loader's samples/s; equal pixel sums; 1 decode a sample"
    lines: list[dict[str, Any]] = []
    tmp = Path(tempfile.mkdtemp(prefix="speedpack-gpu-cache-"))
    cache, storage = _cached(JpegBlobs(blobs, plan.size), f"gpu-check-{plan.size}", tmp)
    try:
        fill_rate: float | None = None
        for workers in (*plan.workers, *((4,) if plan.dry else ())):
            check = f"cache/epoch2-w{workers}"
            if plan.dry and workers > 0:
                lines.append(
                    result(
                        check,
                        "SKIP",
                        "dry: 4 worker processes on a shared 2-core machine measure the "
                        "machine, not the cache; run on the GPU machine",
                        bound,
                    )
                )
                continue
            free = shutil.disk_usage(SHM).free if Path(SHM).exists() else 0
            if workers > 0 and free < MIN_SHM_FOR_WORKERS:
                lines.append(
                    result(
                        check,
                        "SKIP",
                        f"{SHM} has {free / 2**20:.0f} MiB free: {workers} workers hand their "
                        "batches over through it",
                        bound,
                    )
                )
                continue
            plain = _loader(JpegBlobs(blobs, plan.size), plan, workers)
            cached = _loader(cache, plan, workers)
            note = ""
            if fill_rate is None:
                seconds, samples, _ = epoch(cached, device)  # epoch 1: the cache fills
                fill_rate = samples / seconds
                note = f"epoch 1 (filling) {fill_rate:,.0f} samples/s"
            else:
                epoch(cached, device)  # starts the workers; the cache is warm already
                note = "cache warm from the 0-worker epochs"
            if workers > 0:
                epoch(plain, device)  # starts the plain loader's workers
            found = _compare(plan, device, plain, cached)
            del plain, cached  # persistent workers exit
            info = cache.cache_info()
            ratio = median(found["cached"]) / median(found["plain"])
            same = found["plain_sums"] == found["cached_sums"] and len(found["plain_sums"]) == 1
            once = info.misses == plan.images
            figure = (
                f"{setting}, {workers} workers: CachedDataset {median(found['cached']):,.0f} "
                f"samples/s vs decoding {median(found['plain']):,.0f} (medians of "
                f"{plan.rounds} alternating epochs): {ratio:.1f}x; {note}; pixel sums "
                f"{'equal' if same else 'DIFFER'}; {info.misses} decodes for {plan.images} "
                f"samples, {info.hits} hits; cache in {storage}"
            )
            ok = ratio >= BOUND and same and once
            lines.append(
                result(
                    check,
                    "PASS" if ok else "FAIL",
                    figure,
                    bound,
                    ratio=ratio,
                    fill_samples_per_sec=fill_rate,
                    jpeg_make_s=made_s,
                    hits=info.hits,
                    misses=info.misses,
                    storage=storage,
                    **found,
                )
            )
    finally:
        cache.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return lines
