"""``CachedDataset``: decode once, keep one copy per node, share it with every worker and rank."""

from __future__ import annotations

import operator
import os
import sys
from collections.abc import Callable
from time import perf_counter
from types import FrameType
from typing import Any, Literal

from torch.utils.data import Dataset, IterableDataset, Subset, default_collate, get_worker_info
from torch.utils.data._utils.fetch import _MapDatasetFetcher

from lightning_speedpack.cache.arena import MISSING, Arena, GetMany
from lightning_speedpack.cache.codec import encode
from lightning_speedpack.cache.fill import FillResult, fill_arena, fill_processes, missing_indices
from lightning_speedpack.cache.handle import ArenaHandle
from lightning_speedpack.cache.options import (
    TRANSFORM_STAGE,
    CacheBudgetWarning,
    CacheInfo,
    budget_warning,
    check_options,
    dataset_fingerprint,
    open_arena,
)
from lightning_speedpack.cache.stream import CachedStream
from lightning_speedpack.core.stages import CACHE_HIT_STAGE, CACHE_MISS_STAGE, record_stage, stage
from lightning_speedpack.core.stages import active as stages_active

__all__ = ["CacheBudgetWarning", "CacheInfo", "CachedDataset"]

_FETCH_CODE = _MapDatasetFetcher.fetch.__code__
# Frames that hand this dataset's samples on unchanged: torch's `Subset` (`random_split`). The
# DataPipelineProfiler times torch's fetcher from outside, so the fetcher is still the caller.
_PASS_THROUGH = frozenset({Subset.__getitems__.__code__})
_MAX_PASS_THROUGH = 8
#: In a DataLoader worker, samples smaller than this are copied one at a time rather than read
#: as views: a view saves such a sample ~1 us, and reading views costs each forked worker
#: ~0.5 MiB more copy-on-write memory (torch's view path touches more of the parent's heap),
#: which is 6% of a 30 MB cache of 768-byte samples at 4 workers (issue 38).
_VIEW_MIN_BYTES = 4096


def _default_collate_follows(frame: FrameType) -> bool:
    """Whether ``frame`` is torch's map-style fetcher, about to call ``default_collate``.

    Torch's own function (also under the DataPipelineProfiler, which times the fetcher from
    outside and the collate function around it), reached directly or through frames that return
    the samples unchanged (a ``Subset`` of ``random_split``); a user's collate (which might
    modify samples in place) never counts. If torch renames its fetcher this says False: the
    samples are then copied, as for any other caller.
    """
    for _ in range(_MAX_PASS_THROUGH):
        if frame.f_code not in _PASS_THROUGH or frame.f_back is None:
            break
        frame = frame.f_back
    if frame.f_code is not _FETCH_CODE:
        return False
    collate = getattr(frame.f_locals.get("self"), "collate_fn", None)
    if collate is not None and getattr(type(collate), "speedpack_timer", False):  # X-ray timer
        collate = collate.fn
    return collate is default_collate


def _small(arena: Arena, indices: list[int]) -> bool:
    """Whether the batch's first sample is stored and smaller than :data:`_VIEW_MIN_BYTES`."""
    try:
        first = operator.index(indices[0])
    except (IndexError, TypeError):
        return False
    return 0 < arena.stored_nbytes(first) < _VIEW_MIN_BYTES


class CachedDataset(ArenaHandle, Dataset[Any]):
    """Cache a map-style dataset's decoded samples once per node, shared by all workers and ranks.

    Most slow input pipelines decode and resize the same images every epoch. Wrap the dataset
    that does the deterministic part (decode, resize) and pass the random augmentation as
    ``transform``: ``dataset[i]`` is computed once, the first time any process on the node asks
    for it, stored in one preallocated shared-memory arena, and every later access by any
    DataLoader worker (persistent or not, ``fork``, ``spawn`` or ``forkserver``) or DDP rank
    copies it out of that arena; ``transform`` runs on every access, after the cache.

    There is one copy of the payload in RAM: worker memory does not grow with the samples read
    (unlike a list or dict cache, which also gets 0% hits with non-persistent workers, since
    each worker fills its own copy and then exits). Samples may be tensors (any dtype, CPU),
    numpy arrays and scalars, Python numbers, ``str``, ``bytes``, and tuples, lists and dicts of
    them, with shapes that vary per index.

    Storage: ``"shared"`` puts the arena in ``/dev/shm``, named from the dataset's fingerprint
    (class, length, ``key``, or the dataset's simple attributes when no ``key`` is given), the
    node (see ``node_id``) and the job (see ``job_id``), so every rank of one job on one node --
    including ranks Lightning's ``ddp`` launcher starts by re-running the script -- opens the
    same arena, whoever comes first creates it, and each index is computed once per node.
    ``"disk"`` keeps the arena in the file ``path``, which survives and is reused by the next run
    when the fingerprint matches, and rebuilt otherwise.

    Clean-up, guaranteed: a shared file is removed when the last process that built a
    ``CachedDataset`` on it exits, also after an exception or Ctrl-C. A process killed with
    ``SIGKILL`` cannot do that, so every construction first removes each ``/dev/shm/speedpack-*``
    arena on the node that no live process maps any more, whatever its dataset or job
    (``speedpack cache clean`` does the same by hand). Liveness is a lock every process holds
    while it maps the file, dropped by the kernel when it dies: a reused pid cannot fake it, and
    an arena a live process (or its DataLoader worker) still uses is never removed. Not
    guaranteed: a file stays until the next construction or ``speedpack cache clean`` when every
    user was killed; arenas written by another version of this format are left alone.

    Fork safety: the arena's descriptor and thread locks are renewed in a forked child
    (``os.register_at_fork``), so forking while another thread uses the cache cannot deadlock
    the child; no background thread is started.

    Rank policy: runs in every process; there is nothing to synchronise (the arena is the
    shared state). Nothing here touches a GPU; samples are CPU tensors, as a DataLoader expects.

    Args:
        dataset: a map-style dataset (``__getitem__`` and ``__len__``) whose samples are
            deterministic for a given index.
        transform: called on each sample after the cache, on every access (random augmentation).
        max_bytes: payload budget. Default: half of the smaller of the free space in ``/dev/shm``
            and the available RAM (``storage="shared"``), or half of the free disk space at
            ``path``. Samples past the budget are passed through uncached, with one
            ``CacheBudgetWarning``.
        storage: ``"shared"`` (``/dev/shm``, one per job and node) or ``"disk"``.
        path: the cache file for ``storage="disk"``.
        key: a string or int that tells apart two datasets of the same class and length (e.g. the
            preprocessing version); when given, it replaces the dataset's attributes in the
            fingerprint.

    Raises:
        TypeError: ``dataset`` is neither a map-style dataset nor an ``IterableDataset`` (a
            stream gets a :class:`~.stream.CachedStream`), or an argument has the wrong type;
            a sample of an unsupported type (named, with its index) on access.
        ValueError: an argument has an invalid value, or ``max_bytes`` exceeds free ``/dev/shm``.
        RuntimeError: ``/dev/shm`` is too small for the default budget.

    Example:
        >>> import torch
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> from lightning_speedpack import CachedDataset
        >>> base = TensorDataset(torch.arange(8.0).view(8, 1))
        >>> cached = CachedDataset(base, transform=lambda s: s[0] * 2, max_bytes=1 << 20)
        >>> for epoch in range(2):
        ...     batches = [b for b in DataLoader(cached, batch_size=4)]
        >>> batches[1].flatten().tolist()
        [8.0, 10.0, 12.0, 14.0]
        >>> info = cached.cache_info()
        >>> (info.hits, info.misses, info.items)
        (8, 8, 8)
        >>> cached.close()
    """

    def __init__(
        self,
        dataset: Dataset[Any],
        transform: Callable[[Any], Any] | None = None,
        *,
        max_bytes: int | None = None,
        storage: Literal["shared", "disk"] = "shared",
        path: str | os.PathLike[str] | None = None,
        key: str | int | None = None,
    ) -> None:
        length = self._validate(dataset, transform, max_bytes, storage, path, key)
        self.dataset = dataset
        self.transform = transform
        self.storage = storage
        self.key = key
        self._len = length
        self._arena: Arena | None = open_arena(
            dataset_fingerprint(dataset, length, key),
            n_slots=length,
            max_bytes=max_bytes,
            storage=storage,
            path=path,
        )

    @staticmethod
    def _validate(
        dataset: Any, transform: Any, max_bytes: Any, storage: Any, path: Any, key: Any
    ) -> int:
        if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise TypeError(
                "`dataset` must be a map-style dataset with __getitem__ and __len__, or an "
                f"IterableDataset (a stream), got {type(dataset).__qualname__}"
            )
        check_options(transform, max_bytes, storage, path, key)
        return len(dataset)

    def __len__(self) -> int:
        return self._len

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        """A stream (``IterableDataset``) gets a :class:`~.stream.CachedStream` instead."""
        dataset = args[0] if args else kwargs.get("dataset")
        if cls is CachedDataset and isinstance(dataset, IterableDataset):
            return CachedStream(*args, **kwargs)
        return super().__new__(cls)

    def fill(self, processes: int | None = None) -> FillResult:
        """Decode every sample not cached yet, now, in processes that exit when done.

        Optional: without it the cache fills during epoch 1, which then runs at the uncached
        speed. With it, epoch 1 reads from the cache too, and with persistent workers the
        memory is lower: a worker that decodes keeps the decoder's working set (about 6 MiB per
        worker for JPEGs, ``benchmarks/cache_peers.py``) for the rest of the run, a fill
        process takes it with it when it exits. The training process never decodes either.

        Under DDP, call it in every rank before ``fit``: the ranks of a node split the missing
        samples between them (by ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``, which torchrun and
        Lightning's launcher set) and skip what another rank published meanwhile.

        Args:
            processes: fill processes (forked). Default: the cores this process may use,
                divided among the node's local ranks. ``0`` decodes in this process (also what
                happens where ``fork`` is not available).

        Returns:
            How many samples this call decoded, and whether the budget ran out (then the rest
            passes through uncached, with one ``CacheBudgetWarning``).

        Raises:
            TypeError, ValueError: ``processes`` is not an int >= 0.
            Exception: what the dataset raised for a sample in a fill process, or
                ``RuntimeError`` if a fill process died (what was published stays cached).

        Example:
            >>> import torch
            >>> from torch.utils.data import TensorDataset
            >>> from lightning_speedpack import CachedDataset
            >>> cached = CachedDataset(TensorDataset(torch.arange(6.0)), max_bytes=1 << 20)
            >>> cached.fill(processes=2)
            FillResult(decoded=6, budget_exhausted=False)
            >>> cached.cache_info().items
            6
            >>> cached.close()
        """
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        local_size = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        processes = fill_processes(processes, local_size)
        if self._arena is None:
            return FillResult(0, False)
        indices = missing_indices(
            self._arena, self._len, local_rank=local_rank, local_size=local_size
        )
        result = fill_arena(self._arena, self.dataset.__getitem__, indices, processes)
        if result.budget_exhausted:
            budget_warning(self._arena.capacity, "CachedDataset.fill")
        return result

    def __getitem__(self, index: int) -> Any:
        sample = self._untransformed(index)
        if self.transform is not None:
            with stage(TRANSFORM_STAGE):
                sample = self.transform(sample)
        return sample

    def _untransformed(self, index: Any) -> Any:
        """The sample at ``index``, from the cache or (a miss) the dataset, which fills it."""
        i = operator.index(index)
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(f"index {index} out of range for a dataset of length {self._len}")
        arena = self._arena
        if arena is None:
            return self.dataset[i]
        profiling = stages_active()
        t0 = perf_counter() if profiling else 0.0
        sample = arena.get(i)
        if sample is not MISSING:
            arena.count(hit=True)
            if profiling:  # a hit is a cache read; a miss's look-up is not counted as one
                record_stage(CACHE_HIT_STAGE, perf_counter() - t0)
            return sample
        with stage(CACHE_MISS_STAGE):
            sample = self.dataset[i]
        arena.count(hit=False)
        if arena.put(i, encode(sample, i)) == "budget_exhausted_now":
            budget_warning(arena.capacity, f"CachedDataset (at index {i})")
        return sample

    def __getitems__(self, indices: list[int]) -> list[Any]:
        """A batch of samples: the DataLoader calls this with a whole batch of indices.

        Hits are counted with one counter update (and, while a profiler runs, one
        ``cache_read`` record for the batch); misses take the one-sample path. With a
        ``transform``, each sample is read and transformed before the next is read (no batch of
        read copies held). Without one, how hits are read depends on who asked:

        - torch's DataLoader about to call ``default_collate`` on them (directly, through a
          ``Subset`` or under the DataPipelineProfiler): their tensors
          are views into the cache, which ``default_collate`` copies into the batch before
          anyone sees them (one copy per byte, as from a ``TensorDataset``) -- except, in a
          DataLoader worker, samples stored in fewer than 4 KiB, copied one at a time (views
          cost each forked worker more memory than they save such samples in time);
        - otherwise, in the main process: hits whose tensors have the same dtypes and shapes
          are decoded together, each tensor a row of one fresh tensor per leaf for the batch
          (its own bytes, safe to modify in place; the rows share that batch's storage);
        - otherwise, in a DataLoader worker: one sample at a time, each with its own tensors.
        """
        arena = self._arena
        if arena is None:
            return [self[i] for i in indices]
        if self.transform is not None:
            return self._transformed_each(arena, indices)
        profiling = stages_active()
        t0 = perf_counter() if profiling else 0.0
        samples = arena.get_many(indices, self._len, how=self._read_how(arena, indices))
        read = perf_counter() - t0 if profiling else 0.0  # before any miss is decoded
        hits = len(indices)
        for k, sample in enumerate(samples):
            if sample is MISSING:
                hits -= 1
                samples[k] = self._untransformed(indices[k])
        if hits:
            arena.count(hit=True, n=hits)
            if profiling:
                record_stage(CACHE_HIT_STAGE, read, hits)
        return samples

    def _transformed_each(self, arena: Arena, indices: list[int]) -> list[Any]:
        """Read, then transform, one sample at a time: each read copy is dropped at once.

        Reading the batch first and transforming it after held every read copy until the last
        sample was transformed: a batch of decoded samples more in each worker, measured at
        +1.7 / +5.2 MiB of PSS at 2 / 4 workers in ``benchmarks/cache_peers.py``.
        """
        transform = self.transform
        assert transform is not None
        profiling = stages_active()
        out: list[Any] = []
        hits, read, spent = 0, 0.0, 0.0
        for index in indices:
            t0 = perf_counter() if profiling else 0.0
            i = operator.index(index)
            sample = arena.get(i) if 0 <= i < self._len else MISSING
            if sample is MISSING:
                sample = self._untransformed(i)
            else:
                hits += 1
                if profiling:
                    read += perf_counter() - t0
            t1 = perf_counter() if profiling else 0.0
            out.append(transform(sample))
            del sample  # the read copy goes now, not with the batch
            if profiling:
                spent += perf_counter() - t1
        if hits:
            arena.count(hit=True, n=hits)
        if profiling:
            if hits:
                record_stage(CACHE_HIT_STAGE, read, hits)
            record_stage(TRANSFORM_STAGE, spent, len(out))
        return out

    def _read_how(self, arena: Arena, indices: list[int]) -> GetMany:
        """How :meth:`__getitems__` reads its hits (called from it: looks at its caller)."""
        if _default_collate_follows(sys._getframe(2)):
            # torch's fetcher passes the samples straight to default_collate, which stacks
            # (copies) every tensor: views into the arena are never seen, so never written.
            if get_worker_info() is not None and _small(arena, indices):
                return "each"
            return "views"
        # Decoding a batch together saves the main process (0 workers) a third of its time per
        # sample; in a worker the one-at-a-time path is as fast already, and needs no
        # batch-sized buffer that would stay in each worker's heap.
        return "together" if get_worker_info() is None else "each"

    def __repr__(self) -> str:
        info = self.cache_info()
        return (
            f"CachedDataset({type(self.dataset).__qualname__}, len={self._len}, "
            f"storage={self.storage!r}, items={info.items}, bytes_used={info.bytes_used})"
        )
