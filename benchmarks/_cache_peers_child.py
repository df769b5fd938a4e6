"""cache_peers.py's child mode: one measurement in a fresh process, one ``RESULT`` JSON line.

``run_single``: one process (and its DataLoader workers); ``ddp_rank``: one of 2 gloo ranks
under ``torch.multiprocessing.spawn``. With ``--role kill`` a child prints ``READY`` mid epoch 2
and waits for the parent's SIGKILL.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, str(Path(__file__).parent))
from _cache_peers_memory import arena_info, tree_snapshot, worker_pids
from _cache_peers_variants import BATCH, build
from cache import epoch_seconds, loader

from lightning_speedpack import CachedDataset

__all__ = ["child", "ddp_rank", "emit", "run_single"]

SETTLE = 0.3  # seconds between reaching mid epoch 2 and measuring


def emit(tag: str, payload: dict[str, Any]) -> None:
    # One write per line: two DDP ranks share the stdout pipe, and print() may split a long
    # line into several writes that the other rank's line then interleaves.
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), f"{tag} {json.dumps(payload)}\n".encode())


def child_setup() -> None:
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*worker processes in total.*")  # 4 on 2 cores


def run_single(args: argparse.Namespace, files: list[str]) -> None:
    t0 = time.perf_counter()
    ds = build(args.variant, files, bool(args.transform), args.nw)
    construct = time.perf_counter() - t0
    dl = loader(ds, args.nw, BATCH)
    for _ in dl:
        pass
    out: dict[str, Any] = {"construct": construct, "epoch1": time.perf_counter() - t0}
    if args.role == "time":
        out["epoch2"] = epoch_seconds(dl)
    else:
        half = len(dl) // 2
        for k, _batch in enumerate(dl):
            if k + 1 == half:
                time.sleep(SETTLE)
                if args.role == "kill":
                    pids = [os.getpid(), *worker_pids(dl)]
                    emit("READY", {"pids": pids, **arena_info(ds)})
                    time.sleep(3600)  # the parent SIGKILLs this process now
                out["procs"] = tree_snapshot(worker_pids(dl))
        out["pss_tree"] = sum(p["pss"] for p in out["procs"])
    out.update(arena_info(ds))
    emit("RESULT", out)
    del dl
    if isinstance(ds, CachedDataset):
        ds.close()


def ddp_rank(rank: int, args: argparse.Namespace, files: list[str]) -> None:
    child_setup()
    world = 2
    os.environ.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))  # as torchrun sets them
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=300))
    dist.barrier()
    t0 = time.perf_counter()
    ds = build(args.variant, files, bool(args.transform), args.nw, rank=rank, world=world)
    construct = time.perf_counter() - t0
    sampler = None
    if args.variant != "monai_partitioned":  # a partition is this rank's own: shuffle it locally
        sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
    dl = DataLoader(
        ds,
        batch_size=BATCH,
        sampler=sampler,
        shuffle=sampler is None,
        num_workers=args.nw,
        persistent_workers=args.nw > 0,
        multiprocessing_context="fork" if args.nw else None,
    )
    if sampler is not None:
        sampler.set_epoch(0)
    for _ in dl:
        pass
    dist.barrier()
    epoch1 = time.perf_counter() - t0  # the slower rank's: both wait at the barrier
    if sampler is not None:
        sampler.set_epoch(1)
    half = len(dl) // 2
    gathered: list[Any] = [None] * world
    for k, _batch in enumerate(dl):
        if k + 1 == half:
            dist.barrier()  # both ranks mid epoch 2
            time.sleep(SETTLE)
            if args.role == "kill":
                pids = worker_pids(dl)
                emit("READY", {"rank": rank, "pid": os.getpid(), "workers": pids, **arena_info(ds)})
                time.sleep(3600)  # the parent SIGKILLs rank 1; the launcher ends rank 0
            procs = tree_snapshot(worker_pids(dl))
            for p in procs:
                p["rank"] = rank
            dist.all_gather_object(gathered, {"procs": procs, "construct": construct})
    dist.barrier()
    if rank == 0:
        procs = [p for g in gathered for p in g["procs"]]
        out = {
            "construct": max(g["construct"] for g in gathered),
            "epoch1": epoch1,
            "procs": procs,
            "pss_tree": sum(p["pss"] for p in procs),
            **arena_info(ds),
        }
        emit("RESULT", out)
    del dl
    if isinstance(ds, CachedDataset):
        ds.close()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child(args: argparse.Namespace) -> None:
    child_setup()
    files = sorted(str(p) for p in Path(args.folder).glob("*.jpg"))[: args.n]
    if not args.ddp:
        run_single(args, files)
        return
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    torch.multiprocessing.spawn(ddp_rank, args=(args, files), nprocs=2, join=True)
