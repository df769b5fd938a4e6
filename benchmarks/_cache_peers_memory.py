"""cache_peers.py's memory probes: PSS per process of a tree, split by kind of mapping (smaps).

Kinds: the ``/dev/shm/speedpack-*`` arena, other shared memory (torch's batches in flight),
anonymous memory (heap), file-backed, other.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

import psutil
from torch.utils.data import DataLoader

from lightning_speedpack import CachedDataset

__all__ = ["KINDS", "MiB", "arena_info", "smaps_by_kind", "tree_snapshot", "worker_pids"]

KINDS = ("arena", "shm", "anon", "file", "other")
MiB = float(1 << 20)
_HEADER = re.compile(r"^[0-9a-f]+-[0-9a-f]+ [-rwxsp]{4} ")


def _kind(path: str) -> str:
    if path.startswith("/dev/shm/speedpack-"):
        return "arena"
    if path.startswith(("/dev/shm/", "/memfd:", "/SYSV", "/torch_")):
        return "shm"
    if path == "" or path.startswith(("[heap]", "[stack", "[anon")):
        return "anon"
    return "file" if path.startswith("/") else "other"


def smaps_by_kind(pid: int) -> dict[str, dict[str, int]]:
    """PSS, private and RSS bytes of ``pid`` per kind of mapping (see ``_kind``)."""
    out = {k: {"pss": 0, "private": 0, "rss": 0} for k in KINDS}
    current = out["other"]
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            if _HEADER.match(line):
                parts = line.split(None, 5)
                current = out[_kind(parts[5].strip() if len(parts) > 5 else "")]
            elif line.startswith("Pss:"):
                current["pss"] += int(line.split()[1]) << 10
            elif line.startswith(("Private_Clean:", "Private_Dirty:")):
                current["private"] += int(line.split()[1]) << 10
            elif line.startswith("Rss:"):
                current["rss"] += int(line.split()[1]) << 10
    return out


def tree_snapshot(worker_pids: Iterable[int]) -> list[dict[str, Any]]:
    """Every process of this process's tree: its role, psutil PSS/USS/shared and smaps kinds."""
    me = psutil.Process()
    workers = set(worker_pids)
    procs = []
    for p in [me, *me.children(recursive=True)]:
        try:
            full = p.memory_full_info()
            kinds = smaps_by_kind(p.pid)
        except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError):
            continue
        role = "main" if p.pid == me.pid else "worker" if p.pid in workers else "other"
        procs.append(
            {
                "role": role,
                "pid": p.pid,
                "pss": full.pss,
                "uss": full.uss,
                "shared": full.shared,
                "kinds": kinds,
            }
        )
    return procs


def worker_pids(dl: DataLoader[Any]) -> list[int]:
    it = getattr(dl, "_iterator", None)
    return [w.pid for w in getattr(it, "_workers", [])]


def arena_info(ds: Any) -> dict[str, Any]:
    if not isinstance(ds, CachedDataset) or ds.cache_path is None:
        return {}
    info = ds.cache_info()
    return {
        "arena": ds.cache_path,
        "arena_bytes_used": info.bytes_used,
        "arena_allocated": os.stat(ds.cache_path).st_blocks * 512,
        "hits": info.hits,
        "misses": info.misses,
    }
