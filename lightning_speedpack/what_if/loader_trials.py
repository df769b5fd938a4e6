"""The loader side of the trials: the same DataLoader with other settings, read aside from the fit.

Every variant is a *side copy* of the fit's DataLoader (:func:`variant`): a shallow copy that
shares the dataset, the sampler (the distributed one Lightning injected included), the batch
sampler, the collate function, ``worker_init_fn`` and the generator, with its own iterator and
the settings changed. Its ceiling is the data X-ray's loader ceiling: a fresh iterator, warm-up
batches untimed, then samples/s of the next batches (:func:`~lightning_speedpack.data_xray.
ceilings.loader_ceiling`, which also puts the RNG states back so the fit draws the same
shuffle). Worker safety comes first (:func:`worker_memory`, :func:`fits_in_memory`,
:func:`stream_duplicates`): a worker count that would not fit in memory or in ``/dev/shm`` is
not tried, and a stream that does not shard by ``get_worker_info()`` never gets more workers.
"""

from __future__ import annotations

import copy
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler, Subset

from lightning_speedpack.core.batch import batch_bytes
from lightning_speedpack.core.nested import leaves
from lightning_speedpack.data_xray.ceilings import loader_ceiling

__all__ = [
    "LIBRARY_STREAMS",
    "SETTINGS",
    "WorkerMemory",
    "batch_bytes",
    "cache_pair",
    "children",
    "epoch_start_seconds",
    "fits_in_memory",
    "is_library_stream",
    "rate",
    "side_copy",
    "stream_duplicates",
    "variant",
    "whole_cycles",
    "worker_memory",
]

#: Streams from these packages keep state a second reader would change or collide with
#: (LitData's resumable position, MosaicML's shared memory, the pack's own cached stream).
LIBRARY_STREAMS = ("litdata", "streaming", "lightning_speedpack")

SETTINGS = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory")


def is_library_stream(dataset: Any) -> bool:
    """Whether ``dataset`` is a stream of a library that is never read aside from the fit."""
    if not isinstance(dataset, IterableDataset):
        return False
    return any(
        (klass.__module__ or "").split(".")[0] in LIBRARY_STREAMS for klass in type(dataset).__mro__
    )


def side_copy(loader: DataLoader[Any], **settings: Any) -> DataLoader[Any]:
    """A shallow copy of ``loader`` with its own iterator and ``settings`` changed.

    ``settings`` are among ``num_workers``, ``prefetch_factor``, ``persistent_workers`` and
    ``pin_memory``; the prefetch factor follows the worker count as ``DataLoader`` itself wants
    it (None without workers, 2 by default with them). The copy is written through its
    ``__dict__``: a DataLoader refuses ``persistent_workers`` after construction, to protect an
    iterator the copy does not have.

    Example:
        >>> loader = DataLoader(range(8), batch_size=4)
        >>> side = side_copy(loader, num_workers=2)
        >>> side.num_workers, side.prefetch_factor, loader.num_workers
        (2, 2, 0)
        >>> side.dataset is loader.dataset and side.sampler is loader.sampler
        True
    """
    unknown = set(settings) - set(SETTINGS)
    if unknown:
        raise ValueError(f"not loader settings: {sorted(unknown)}; allowed: {list(SETTINGS)}")
    side = copy.copy(loader)
    state = side.__dict__
    state.update(settings)
    state["_iterator"] = None
    if state["num_workers"] == 0:
        state["prefetch_factor"] = None
        state["persistent_workers"] = False
    elif state.get("prefetch_factor") is None:
        state["prefetch_factor"] = 2
    return side


def close(side: DataLoader[Any]) -> None:
    """Shut down the worker pool a side copy may keep (persistent workers)."""
    iterator = side.__dict__.pop("_iterator", None)
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


@contextmanager
def variant(loader: DataLoader[Any], **settings: Any) -> Iterator[DataLoader[Any]]:
    """:func:`side_copy` for the length of a ``with`` block; its workers stop at the end."""
    side = side_copy(loader, **settings)
    try:
        yield side
    finally:
        close(side)


#: Fewer timed batches than this after the warm-up is no rate: with workers, those batches were
#: prefetched while the iterator started, and their "rate" is only the handover's.
MIN_TIMED_BATCHES = 3


def whole_cycles(batches: int, workers: int) -> int:
    """``batches`` rounded up to whole rounds of the workers: a multiple of ``workers``.

    The workers take batches in turn and, all busy, finish theirs together: batches arrive in
    bursts of ``workers``. A timed window that ends inside a burst counts the burst's first
    batches without the wait for the rest of the round: 3 batches timed of 2 workers' bursts
    take one round, not one and a half, and read 1.5x too fast (issue 38: a 2.9x trial gain
    for a 2.2x fit). Between a batch and the one ``workers`` later lies exactly one round,
    wherever the window starts.

    Example:
        >>> whole_cycles(3, 0), whole_cycles(3, 2), whole_cycles(4, 2), whole_cycles(3, 4)
        (3, 4, 4, 4)
    """
    if workers <= 1:
        return batches
    return -(-batches // workers) * workers


def rate(
    loader: DataLoader[Any], batches: int, shares: list[float] | None = None
) -> tuple[float | None, Any]:
    """The loader ceiling of ``loader`` (samples/s) and the last batch it drew.

    The warm-up is every batch the workers prefetch, plus one; a loader too short to time
    :data:`MIN_TIMED_BATCHES` after it gives no rate (None), rather than the rate of batches
    that were ready before the clock started. With workers, whole rounds of them are timed
    (:func:`whole_cycles`). Without workers, ``shares`` (when given) gets the pass's CPU
    share: CPU seconds over wall seconds (a loader that sleeps or waits on I/O: near 0; one
    that computes: near 1).
    """
    warmup = loader.num_workers * (loader.prefetch_factor or 2) + 1 if loader.num_workers else 1
    batches = whole_cycles(batches, loader.num_workers)
    wall, cpu = time.perf_counter(), time.process_time()
    result = loader_ceiling(loader, batches=batches, warmup=warmup)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if shares is not None and not loader.num_workers and wall > 0:
        shares.append(min(1.0, cpu / wall))
    if result.batches < min(MIN_TIMED_BATCHES, batches):
        return None, result.batch
    return result.samples_per_sec, result.batch


def epoch_start_seconds(side: DataLoader[Any], batches: int = 2) -> float | None:
    """Seconds from the *second* ``iter()`` of ``side`` to its first batch (an epoch's start).

    The side copy gets a short epoch of its own (the first ``batches`` batches, in order), read
    to its end once; then the second pass's start-up is what every epoch after the first pays:
    a new worker pool without ``persistent_workers``, the kept pool resumed with it. Returns
    None for a loader without a batch size (a custom batch sampler).
    """
    if not side.batch_size or isinstance(side.dataset, IterableDataset):
        return None
    length = len(side.dataset)  # type: ignore[arg-type]
    indices = range(min(length, batches * side.batch_size))
    sampler = SequentialSampler(indices)
    side.__dict__["sampler"] = sampler
    side.__dict__["batch_sampler"] = BatchSampler(sampler, side.batch_size, side.drop_last)
    for _batch in side:  # the first epoch, to its end
        pass
    start = time.perf_counter()
    iterator = iter(side)
    next(iterator, None)
    seconds = time.perf_counter() - start
    for _batch in iterator:
        pass
    del iterator
    return seconds


@dataclass(frozen=True)
class WorkerMemory:
    """What one loading worker holds, and the room this machine has for more of them.

    Attributes:
        per_worker_bytes: memory unique to one worker (USS; RSS where USS cannot be read).
        available_bytes: memory the system can still give (``psutil.virtual_memory``).
        shm_free_bytes: free bytes in ``/dev/shm`` (None: no /dev/shm on this system).
        batch_bytes: tensor bytes of one batch (each worker keeps ``prefetch_factor`` of them
            in shared memory).
    """

    per_worker_bytes: int
    available_bytes: int
    shm_free_bytes: int | None
    batch_bytes: int


def children() -> set[int]:
    """The process ids of this process's children now (to tell a new worker pool's apart)."""
    import psutil

    return {child.pid for child in psutil.Process().children()}


def worker_memory(side: DataLoader[Any], batch: Any, before: set[int]) -> WorkerMemory | None:
    """Read the memory of ``side``'s live workers (call while its iterator is running).

    ``before`` are the child processes that existed before the iterator started (another DDP
    rank launched from this one, an earlier pool): they are not this loader's workers.
    Returns None when ``psutil`` cannot see any new worker process.
    """
    import psutil

    sizes = []
    for child in psutil.Process().children():
        if child.pid in before:
            continue
        try:
            info = child.memory_full_info()
            sizes.append(int(getattr(info, "uss", info.rss)))
        except (psutil.Error, OSError):
            continue
    if not sizes:
        return None
    shm = shutil.disk_usage("/dev/shm").free if os.path.isdir("/dev/shm") else None
    return WorkerMemory(max(sizes), int(psutil.virtual_memory().available), shm, batch_bytes(batch))


def fits_in_memory(memory: WorkerMemory, workers: int, prefetch_factor: int) -> str | None:
    """Why ``workers`` workers would not fit (None: they would), from a measured worker.

    Workers take ``per_worker_bytes`` each from the available memory (a margin of 20% kept),
    and hold ``prefetch_factor`` batches each, plus one being handed over, in ``/dev/shm`` (a
    full /dev/shm is the guides' "bus error").

    Example:
        >>> m = WorkerMemory(per_worker_bytes=2**30, available_bytes=3 * 2**30,
        ...                  shm_free_bytes=64 * 2**20, batch_bytes=16 * 2**20)
        >>> fits_in_memory(m, 2, 2) is None, fits_in_memory(m, 3, 2)
        (False, '3 workers x 1.0 GiB measured each > 80% of the 3.0 GiB available')
    """
    gib = 2**30
    need = workers * memory.per_worker_bytes
    if need > 0.8 * memory.available_bytes:
        return (
            f"{workers} workers x {memory.per_worker_bytes / gib:.1f} GiB measured each > 80% of "
            f"the {memory.available_bytes / gib:.1f} GiB available"
        )
    if memory.shm_free_bytes is not None:
        shm = workers * (prefetch_factor + 1) * memory.batch_bytes
        if shm > memory.shm_free_bytes:
            return (
                f"{workers} workers x {prefetch_factor + 1} batches of "
                f"{memory.batch_bytes / 2**20:.0f} MiB > the {memory.shm_free_bytes / 2**20:.0f} "
                "MiB free in /dev/shm (a bus error)"
            )
    return None


def stream_duplicates(loader: DataLoader[Any]) -> bool:
    """Whether a stream yields the same items in every worker (it ignores ``get_worker_info()``).

    Reads the first batch of each of two workers (a 2-worker side copy hands out batches from
    the workers in turn) and compares them; a stream that shards gives different batches.
    """
    with variant(loader, num_workers=2, prefetch_factor=1, persistent_workers=False) as side:
        iterator = iter(side)
        first = next(iterator, None)
        second = next(iterator, None)
        del iterator
    if first is None or second is None:
        return False
    return _same(first, second)


def _same(a: Any, b: Any) -> bool:
    left, right = leaves(a, torch.Tensor), leaves(b, torch.Tensor)
    if not left or len(left) != len(right):
        return bool(a == b) if not left and not right else False
    return all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(left, right, strict=True))


@contextmanager
def cache_pair(
    loader: DataLoader[Any], samples: int, key: str
) -> Iterator[tuple[DataLoader[Any], DataLoader[Any]]]:
    """Two loaders over the same first ``samples`` items: as they are, and in a warm cache.

    Both use ``loader``'s batch size, collate function and worker settings; the cached one
    wraps the subset in :class:`~lightning_speedpack.CachedDataset`, filled once before
    (so its ceiling is the warm cache's). The cache assumes ``__getitem__`` is deterministic.
    """
    from lightning_speedpack.cache.cached_dataset import CachedDataset

    subset = Subset(loader.dataset, range(samples))  # type: ignore[arg-type]
    cached = CachedDataset(subset, key=key)
    kwargs: dict[str, Any] = {
        "batch_size": loader.batch_size,
        "collate_fn": loader.collate_fn,
        "num_workers": loader.num_workers,
        "worker_init_fn": loader.worker_init_fn,
        "pin_memory": loader.pin_memory,
    }
    if loader.num_workers:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    plain = DataLoader(subset, **kwargs)
    warm = DataLoader(cached, **kwargs)
    try:
        cached.fill()
        yield plain, warm
    finally:
        arena = getattr(cached, "_arena", None)
        if arena is not None:
            arena.close()
