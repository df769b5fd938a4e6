"""``CachedDataset``: decode once, keep one copy per node, share it with every worker and rank."""

from __future__ import annotations

import contextlib
import hashlib
import operator
import os
import re
import shutil
import sys
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from types import FrameType
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, Subset, default_collate, get_worker_info
from torch.utils.data._utils.fetch import _MapDatasetFetcher

from lightning_speedpack.data import reclaim
from lightning_speedpack.data.arena import MISSING, Arena, GetMany
from lightning_speedpack.data.codec import encode
from lightning_speedpack.data.instrument import TimedCollate
from lightning_speedpack.data.node import node_id
from lightning_speedpack.data.stages import CACHE_HIT_STAGE, CACHE_MISS_STAGE, record_stage, stage
from lightning_speedpack.data.stages import active as stages_active

__all__ = [
    "TRANSFORM_STAGE",
    "CacheBudgetWarning",
    "CacheInfo",
    "CachedDataset",
    "check_options",
    "job_id",
    "open_arena",
]

SHM_DIR = reclaim.SHM_DIR
MIN_DEFAULT_BUDGET = 64 << 20  # below this the default budget refuses instead of caching nothing
_BUDGET_FRACTION = 0.5
#: The stage the random ``transform`` of a cache is recorded under.
TRANSFORM_STAGE = "transform"

_instances: dict[str, int] = {}
_instances_lock = threading.Lock()


def _new_instances_lock() -> None:
    global _instances_lock
    _instances_lock = threading.Lock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_new_instances_lock)


class CacheBudgetWarning(UserWarning):
    """The cache reached ``max_bytes``; further samples pass through uncached."""


@dataclass(frozen=True)
class CacheInfo:
    """Node-wide cache counters, summed over every process that uses the cache.

    Attributes:
        hits: samples served from the cache.
        misses: samples computed by the wrapped dataset (decode calls).
        items: indices stored in the cache.
        bytes_used: payload bytes stored (64-byte aligned).
        capacity_bytes: the payload budget (``max_bytes``).
        budget_exhausted: whether the budget stopped the cache from filling.
    """

    hits: int
    misses: int
    items: int
    bytes_used: int
    capacity_bytes: int
    budget_exhausted: bool

    @property
    def hit_rate(self) -> float:
        """Hits over all accesses (0.0 before the first access)."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


def job_id(exists: Callable[[str], bool] = lambda _: False) -> str:
    """Identify the job this process belongs to, the same on all its ranks on one node.

    In order: ``TORCHELASTIC_RUN_ID`` + ``MASTER_PORT`` (``torchrun``), ``SLURM_JOB_ID`` +
    ``SLURM_STEP_ID`` (``srun``), ``MASTER_ADDR`` + ``MASTER_PORT`` (any launcher, Lightning's
    included: its ranks inherit them), else this process's pid. A rank that Lightning's default
    ``ddp`` launcher started (``LOCAL_RANK`` > 0) checks first whether its parent -- local rank 0,
    which usually built the dataset before ``Trainer.fit`` set ``MASTER_PORT`` -- already made
    the cache under its pid (``exists("pid<ppid>")``). Two concurrent jobs differ in their run
    id, SLURM job or port (a port is held by one job at a time) or pid.
    """
    env = os.environ
    if env.get("TORCHELASTIC_RUN_ID"):
        return f"te{env['TORCHELASTIC_RUN_ID']}-{env.get('MASTER_PORT', '')}"
    if env.get("SLURM_JOB_ID"):
        return f"slurm{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '')}"
    if env.get("MASTER_PORT"):
        if env.get("LOCAL_RANK", "0") != "0" and exists(f"pid{os.getppid()}"):
            return f"pid{os.getppid()}"
        return f"port{env.get('MASTER_ADDR', '')}-{env['MASTER_PORT']}"
    return f"pid{os.getpid()}"


def _describe(obj: Any, depth: int = 2) -> str:
    """A stable, cheap description of a dataset's configuration (its simple attributes)."""
    if obj is None or isinstance(obj, (bool, int, float, str, bytes, Path)):
        return repr(obj)
    if isinstance(obj, (list, tuple)):
        items = list(obj) if len(obj) <= 64 else [*obj[:32], *obj[-32:]]
        inner = ",".join(_describe(x, depth) for x in items) if depth >= 0 else ""
        return f"{type(obj).__name__}{len(obj)}[{inner}]"
    if isinstance(obj, (set, frozenset)):
        return f"set{len(obj)}"
    if isinstance(obj, dict):
        if depth < 0:
            return f"dict{len(obj)}"
        pairs = list(obj.items())[:64]
        return (
            "{" + ",".join(f"{_describe(k, 0)}:{_describe(v, depth - 1)}" for k, v in pairs) + "}"
        )
    if isinstance(obj, torch.Tensor):
        head = obj.detach().reshape(-1)[:16].cpu().tolist() if obj.layout == torch.strided else []
        return f"tensor{tuple(obj.shape)}{obj.dtype}{head}"
    if isinstance(obj, np.ndarray):
        head = obj.reshape(-1)[:16].tolist() if not obj.dtype.hasobject else []
        return f"ndarray{obj.shape}{obj.dtype}{head}"
    kind = f"{type(obj).__module__}.{type(obj).__qualname__}"
    if depth > 0 and hasattr(obj, "__dict__"):
        attrs = sorted((k, v) for k, v in vars(obj).items() if not k.startswith("_"))
        return kind + "(" + ",".join(f"{k}={_describe(v, depth - 1)}" for k, v in attrs) + ")"
    return kind


def _fingerprint(dataset: Any, length: int, key: str | int | None) -> bytes:
    kind = type(dataset)
    text = f"{kind.__module__}.{kind.__qualname__}\0{length}\0{key!r}"
    if key is None:
        try:
            text += "\0" + _describe(dataset)
        except Exception:  # an exotic attribute: fall back to class and length only
            text += "\0?"
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def _fmt(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def _default_budget(storage: str, where: str) -> int:
    if storage == "disk":
        return int(shutil.disk_usage(where).free * _BUDGET_FRACTION)
    import psutil

    shm_free = shutil.disk_usage(SHM_DIR).free
    ram = psutil.virtual_memory().available
    budget = int(min(shm_free, ram) * _BUDGET_FRACTION)
    if budget < MIN_DEFAULT_BUDGET:
        raise RuntimeError(
            f"CachedDataset: only {_fmt(shm_free)} free in {SHM_DIR} and {_fmt(ram)} of RAM "
            f"available, so the default budget ({_BUDGET_FRACTION:.0%} of the smaller) would be "
            f"{_fmt(budget)}. {SHM_DIR} is probably a container's default (Docker gives 64 MB): "
            "start it with a larger one (`docker run --shm-size=16g` or `--ipc=host`), or use "
            "`storage='disk', path=...`, or pass a small `max_bytes` on purpose."
        )
    return budget


def open_arena(
    fingerprint: bytes,
    *,
    n_slots: int,
    max_bytes: int | None,
    storage: str,
    path: str | os.PathLike[str] | None,
) -> Arena:
    """Open (or create) the node's arena for a dataset; dead arenas are reclaimed first.

    A shared arena is named from the fingerprint, the node and the job; a disk one is ``path``.
    """
    if storage == "disk" and path is not None:  # path is required for disk (validated)
        file = str(Path(path).absolute())
        where = os.path.dirname(file)
    else:
        where = SHM_DIR
        if not os.path.isdir(SHM_DIR):
            raise RuntimeError(
                f"{SHM_DIR} does not exist on this system; use storage='disk', path=..."
            )
    budget = _default_budget(storage, where) if max_bytes is None else max_bytes
    if storage == "shared" and max_bytes is not None:
        free = shutil.disk_usage(SHM_DIR).free
        if max_bytes > free:
            raise ValueError(
                f"max_bytes={max_bytes} ({_fmt(max_bytes)}) exceeds the {_fmt(free)} free in "
                f"{SHM_DIR}; lower it, enlarge {SHM_DIR} (`docker run --shm-size=...`), or "
                "use storage='disk', path=..."
            )
    if os.path.isdir(SHM_DIR):
        with contextlib.suppress(OSError):  # e.g. another user's file: never fail for it
            reclaim.scan(SHM_DIR, remove=True)  # arenas of killed runs, any dataset
    if storage == "shared":
        digest = fingerprint.hex()[:16]
        with _instances_lock:
            seq = _instances.get(digest, 0)
            _instances[digest] = seq + 1
        stem = os.path.join(SHM_DIR, f"{reclaim.PREFIX}{digest}-{seq}-n{node_id()}-")
        job = job_id(lambda j: os.path.exists(stem + j))
        file = stem + re.sub(r"[^A-Za-z0-9._-]", "_", job)
    kind: Literal["shared", "disk"] = "disk" if storage == "disk" else "shared"
    return Arena.open(file, fingerprint=fingerprint, n_slots=n_slots, capacity=budget, kind=kind)


_FETCH_CODE = _MapDatasetFetcher.fetch.__code__
# Frames that hand this dataset's samples on unchanged: torch's `Subset` (`random_split`). The
# DataPipelineProfiler times torch's fetcher from outside, so the fetcher is still the caller.
_PASS_THROUGH = frozenset({Subset.__getitems__.__code__})
_MAX_PASS_THROUGH = 8


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
    if type(collate) is TimedCollate:
        collate = collate.fn
    return collate is default_collate


def check_options(
    transform: Any,
    max_bytes: Any,
    storage: Any,
    path: Any,
    key: Any,
    type_errors: list[str] | None = None,
    value_errors: list[str] | None = None,
) -> None:
    """Check the options both caches share, all at once; raise TypeError or ValueError."""
    type_errors = [] if type_errors is None else type_errors
    value_errors = [] if value_errors is None else value_errors
    if transform is not None and not callable(transform):
        type_errors.append(f"`transform` must be callable or None, got {type(transform).__name__}")
    if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int)):
        type_errors.append(f"`max_bytes` must be an int or None, got {type(max_bytes).__name__}")
    elif max_bytes is not None and max_bytes <= 0:
        value_errors.append(f"`max_bytes` must be a positive int, got {max_bytes}")
    if path is not None and not isinstance(path, (str, os.PathLike)):
        type_errors.append(f"`path` must be a str or os.PathLike, got {type(path).__name__}")
    if key is not None and (isinstance(key, bool) or not isinstance(key, (str, int))):
        type_errors.append(f"`key` must be a str, an int or None, got {type(key).__name__}")
    if storage not in ("shared", "disk"):
        value_errors.append(f"`storage` must be 'shared' or 'disk', got {storage!r}")
    if storage == "disk" and path is None:
        value_errors.append("`storage='disk'` needs `path=` (the cache file), got None")
    if storage == "shared" and path is not None:
        value_errors.append(f"`path` is only used with storage='disk', got {str(path)!r}")
    if type_errors:
        raise TypeError("; ".join(type_errors + value_errors))
    if value_errors:
        raise ValueError("; ".join(value_errors))
    if storage == "disk" and path is not None and os.path.isdir(path):
        raise ValueError(f"`path` must be a file, got the directory {path}")


def budget_warning(capacity: int, where: str) -> None:
    """Warn (once per process and cache) that the budget is reached."""
    warnings.warn(
        f"{where} reached its budget of {_fmt(capacity)}; further samples pass through "
        "uncached (raise `max_bytes`/`max_items`, or free /dev/shm)",
        CacheBudgetWarning,
        stacklevel=3,
    )


class CachedDataset(Dataset[Any]):
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
        fingerprint = _fingerprint(dataset, length, key)

        self._arena: Arena | None = open_arena(
            fingerprint, n_slots=length, max_bytes=max_bytes, storage=storage, path=path
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
            from lightning_speedpack.data.stream import CachedStream

            return CachedStream(*args, **kwargs)
        return super().__new__(cls)

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

        Hits are read in one pass with one counter update (and, while a profiler runs, one
        ``cache_read`` record for the batch); misses take the one-sample path. How hits are
        decoded depends on who asked:

        - torch's DataLoader about to call ``default_collate`` on them (directly, through a
          ``Subset`` or under the DataPipelineProfiler), with no ``transform``: their tensors
          are views into the cache, which ``default_collate`` copies into the batch before
          anyone sees them (one copy per byte, as from a ``TensorDataset``);
        - otherwise, in the main process: hits whose tensors have the same dtypes and shapes
          are decoded together, each tensor a row of one fresh tensor per leaf for the batch
          (its own bytes, safe to modify in place; the rows share that batch's storage);
        - otherwise, in a DataLoader worker: one sample at a time, each with its own tensors.
        """
        arena = self._arena
        if arena is None:
            return [self[i] for i in indices]
        profiling = stages_active()
        t0 = perf_counter() if profiling else 0.0
        samples = arena.get_many(indices, self._len, how=self._read_how())
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
        transform = self.transform
        if transform is None:
            return samples
        if profiling:
            t0 = perf_counter()
            out = [transform(s) for s in samples]
            record_stage(TRANSFORM_STAGE, perf_counter() - t0, len(out))
            return out
        return [transform(s) for s in samples]

    def _read_how(self) -> GetMany:
        """How :meth:`__getitems__` reads its hits (called from it: looks at its caller)."""
        if self.transform is None and _default_collate_follows(sys._getframe(2)):
            # torch's fetcher passes the samples straight to default_collate, which stacks
            # (copies) every tensor: views into the arena are never seen, so never written.
            return "views"
        # Decoding a batch together saves the main process (0 workers) a third of its time per
        # sample; in a worker the one-at-a-time path is as fast already, and needs no
        # batch-sized buffer that would stay in each worker's heap.
        return "together" if get_worker_info() is None else "each"

    def cache_info(self) -> CacheInfo:
        """Hits, misses, items, bytes used, capacity, budget state: summed over the node."""
        if self._arena is None or self._arena.closed:
            return CacheInfo(0, 0, 0, 0, 0, False)
        stats = self._arena.stats()
        return CacheInfo(
            hits=stats["hits"],
            misses=stats["misses"],
            items=stats["items"],
            bytes_used=stats["bytes_used"],
            capacity_bytes=stats["capacity_bytes"],
            budget_exhausted=bool(stats["budget_exhausted"]),
        )

    @property
    def cache_path(self) -> str | None:
        """The file that holds the arena (in ``/dev/shm`` for shared storage)."""
        return None if self._arena is None else self._arena.path

    def close(self) -> None:
        """Release the arena now (it is also released at exit); later accesses pass through."""
        if self._arena is not None:
            self._arena.close()
            self._arena = None

    def __enter__(self) -> CachedDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        arena = state.pop("_arena")
        state["_arena_state"] = None if arena is None or arena.closed else arena.state()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        arena_state = state.pop("_arena_state")
        self.__dict__.update(state)
        self._arena = None
        if arena_state is not None:
            try:
                self._arena = Arena.attach(arena_state)
            except FileNotFoundError as err:
                warnings.warn(
                    f"CachedDataset could not re-attach its cache ({err}); samples pass "
                    "through uncached in this process",
                    CacheBudgetWarning,
                    stacklevel=2,
                )

    def __repr__(self) -> str:
        info = self.cache_info()
        return (
            f"CachedDataset({type(self.dataset).__qualname__}, len={self._len}, "
            f"storage={self.storage!r}, items={info.items}, bytes_used={info.bytes_used})"
        )
