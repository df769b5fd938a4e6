"""What both caches share: their options, budget, arena naming and the warnings they give.

:class:`~lightning_speedpack.cache.cached_dataset.CachedDataset` and
:class:`~lightning_speedpack.cache.stream.CachedStream` both import this module and neither
imports the other at import time.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from lightning_speedpack.cache import reclaim
from lightning_speedpack.cache.arena import Arena
from lightning_speedpack.cache.node import node_id

__all__ = [
    "MIN_DEFAULT_BUDGET",
    "SHM_DIR",
    "TRANSFORM_STAGE",
    "CacheBudgetWarning",
    "CacheInfo",
    "budget_warning",
    "check_options",
    "dataset_fingerprint",
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


def dataset_fingerprint(dataset: Any, length: int, key: str | int | None) -> bytes:
    """What names a dataset's arena: its class, length, ``key`` and a glimpse of its state."""
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
