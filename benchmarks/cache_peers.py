"""CachedDataset beside MONAI's CacheDataset and a naive list cache: epoch time and memory.

Method. The parent writes N JPEGs once to a temporary folder (default 1,500, sources 64-320 px
written with PIL as ``benchmarks/cache.py`` does; ``JpegFolder`` decodes and resizes each to a
3x96x96 uint8 tensor, label ``i % 10``: the deterministic work worth caching). Every
measurement runs in a FRESH child process (this script re-invoked with ``sys.executable`` and
``--variant``) that prints one ``RESULT {json}`` line; the parent alternates the variants round
by round (``--rounds``, default 3) and prints medians and ranges (min-max). Every child imports
the same modules (torch, monai, Lightning via ``cache.py``), so their baselines match.

Variants, each with and without a random transform after the cache (``augment``: random
horizontal flip + random 88x88 crop of the cached uint8 tensor, a plain function):

- ``uncached``: ``JpegFolder`` itself (the transform applied in ``__getitem__``);
- ``monai_eager``: ``monai.data.CacheDataset(data=[{"index": i}], transform=Compose([decode,
  augment]), cache_rate=1.0, num_workers=os.cpu_count(), progress=False)``: MONAI caches up to
  the first transform that is not a deterministic ``monai.transforms.Transform`` (``augment``),
  filling in the constructor (its time counts in epoch 1), and ``deepcopy``s the cached item
  before ``augment`` (MONAI's default ``copy_cache=True``);
- ``monai_runtime``: the same with ``runtime_cache="process"`` (a ``Manager().list``, what
  MONAI's docstring recommends for one process with DataLoader workers) at 1+ workers and
  ``runtime_cache=True`` at 0 workers; it fills during epoch 1;
- ``naive_list``: ``cache.NaiveListCache``, a per-process list filled on first access;
- ``ours``: ``CachedDataset(JpegFolder(...), transform=augment or None)``.

DataLoader: batch 64, ``shuffle=True``, forked persistent workers (``cache.loader``), at 0, 2
and 4 workers. Two children per cell and round:

- ``time``: epoch 1 = dataset construction + the first epoch; epoch 2 = the second epoch,
  uninterrupted;
- ``mem``: epoch 1, then epoch 2 paused after half its batches (0.3 s for the workers' prefetch
  to settle): psutil ``memory_full_info().pss`` summed over the process tree (main, DataLoader
  workers, MONAI's manager process), and per process its ``/proc/<pid>/smaps`` PSS and private
  bytes split by mapping: the ``/dev/shm/speedpack-*`` arena, other shared memory (torch's
  batches in flight), anonymous memory (heap), file-backed. The pause lets workers run ahead,
  which is why epoch 2 is timed in its own child.

Memory is reported as (PSS_tree(variant) - PSS_tree(uncached, same setting, same round)) /
decoded payload (N x 3 x 96 x 96 bytes). Batches in flight are computed, not measured:
workers x prefetch_factor (2) x batch bytes. The arena's allocated size (``st_blocks``, RAM in
/dev/shm even where no process has touched a page, so absent from every PSS) is reported too.

DDP: 2 ranks (``torch.multiprocessing.spawn``, gloo, ``DistributedSampler``, 2 workers each):
epoch 1 and the total PSS of both ranks' trees mid epoch 2, for ``uncached``, ``monai_eager``
(every rank caches the whole dataset), ``monai_partitioned`` (MONAI's ``partition_dataset``:
each rank caches and shuffles only its half, no DistributedSampler) and ``ours`` (one arena per
node). Kill: ``ours`` with 2 workers is SIGKILLed mid epoch 2 (the whole process; and rank 1 of
a DDP run, whose launcher then terminates rank 0): is the run's arena still in /dev/shm right
after the kill, after a ``CachedDataset`` construction while orphaned workers live, once every
process of the run is gone, and after the next construction (which reclaims dead arenas).

Run ``.venv/bin/python benchmarks/cache_peers.py [--quick] [--rounds 3] [--workers 0,2,4]
[--only single,ddp,kill,<variant>,...]`` (the full run: about an hour on 2 cores).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist
from monai.data import CacheDataset, partition_dataset
from monai.transforms import Compose, Transform
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

sys.path.insert(0, str(Path(__file__).parent))
from _common import print_table
from cache import JpegFolder, NaiveListCache, epoch_seconds, loader, write_jpegs

from lightning_speedpack import CachedDataset

VARIANTS = ("uncached", "monai_eager", "monai_runtime", "naive_list", "ours", "ours_filled")
DDP_VARIANTS = ("uncached", "monai_eager", "monai_partitioned", "ours", "ours_filled")
SECTIONS = ("single", "ddp", "kill")
SIZE, CROP, BATCH, PREFETCH = 96, 88, 64, 2
SRC_PX = (64, 320)
SETTLE = 0.3  # seconds between reaching mid epoch 2 and measuring
CHILD_TIMEOUT = 900.0
KINDS = ("arena", "shm", "anon", "file", "other")
MiB = float(1 << 20)
_HEADER = re.compile(r"^[0-9a-f]+-[0-9a-f]+ [-rwxsp]{4} ")


# ------------------------------------------------------------------ datasets and transforms
def augment(x: torch.Tensor) -> torch.Tensor:
    """Random horizontal flip and random CROP x CROP crop of a cached 3xHxW uint8 tensor."""
    if random.random() < 0.5:
        x = x.flip(-1)
    i = random.randint(0, x.shape[-2] - CROP)
    j = random.randint(0, x.shape[-1] - CROP)
    return x[:, i : i + CROP, j : j + CROP].contiguous()


def augment_pair(sample: tuple[torch.Tensor, int]) -> tuple[torch.Tensor, int]:
    x, y = sample
    return augment(x), y


def augment_item(item: dict[str, Any]) -> dict[str, Any]:
    """The random part of the MONAI pipeline: a plain function, so MONAI caches before it."""
    return {"img": augment(item["img"]), "label": item["label"]}


class Transformed(Dataset[Any]):
    """``fn`` applied to each sample of ``dataset`` (the uncached and naive variants)."""

    def __init__(self, dataset: Any, fn: Callable[[Any], Any]) -> None:
        self.dataset = dataset
        self.fn = fn

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> Any:
        return self.fn(self.dataset[i])


class DecodeItem(Transform):  # type: ignore[misc]
    """MONAI's deterministic (cached) part: the very ``JpegFolder`` decode, as a dict."""

    def __init__(self, folder: JpegFolder) -> None:
        self.folder = folder

    def __call__(self, item: dict[str, Any]) -> dict[str, Any]:
        x, y = self.folder[item["index"]]
        return {"img": x, "label": y}


def build(
    variant: str, files: list[str], transform: bool, workers: int, rank: int = 0, world: int = 1
) -> Any:
    base = JpegFolder(files, SIZE)
    if variant == "uncached":
        return Transformed(base, augment_pair) if transform else base
    if variant == "naive_list":
        naive = NaiveListCache(base, len(base))
        return Transformed(naive, augment_pair) if transform else naive
    if variant in ("ours", "ours_filled"):
        cached = CachedDataset(base, transform=augment_pair if transform else None)
        if variant == "ours_filled":  # decode before training, in processes that exit
            cached.fill()
        return cached
    data = [{"index": i} for i in range(len(base))]
    if variant == "monai_partitioned":
        data = partition_dataset(data, num_partitions=world, shuffle=False, even_divisible=True)[
            rank
        ]
    runtime: bool | str = False
    if variant == "monai_runtime":
        runtime = "process" if workers > 0 else True
    pipeline = Compose([DecodeItem(base), augment_item] if transform else [DecodeItem(base)])
    return CacheDataset(
        data=data,
        transform=pipeline,
        cache_rate=1.0,
        num_workers=os.cpu_count(),
        progress=False,
        runtime_cache=runtime,
    )


# ------------------------------------------------------------------------- measuring memory
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


def emit(tag: str, payload: dict[str, Any]) -> None:
    # One write per line: two DDP ranks share the stdout pipe, and print() may split a long
    # line into several writes that the other rank's line then interleaves.
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), f"{tag} {json.dumps(payload)}\n".encode())


# --------------------------------------------------------------------------------- children
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


# ----------------------------------------------------------------------------------- parent
class Runner:
    """Starts children, collects their JSON lines, remembers every arena they reported."""

    def __init__(self, folder: str, n: int, scratch: str) -> None:
        self.folder, self.n, self.scratch = folder, n, scratch
        self.arenas: set[str] = set()
        self.failures = 0
        self.count = 0

    def start(self, variant: str, role: str, nw: int, transform: int, ddp: bool) -> Any:
        argv = [sys.executable, os.path.abspath(__file__), "--variant", variant, "--role", role]
        argv += ["--nw", str(nw), "--transform", str(transform), "--folder", self.folder]
        argv += ["--n", str(self.n)] + (["--ddp"] if ddp else [])
        self.count += 1
        err = open(os.path.join(self.scratch, f"child-{self.count}.err"), "w+")  # noqa: SIM115
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True
        )
        proc.err_file = err  # type: ignore[attr-defined]
        proc.line_queue = queue.Queue()  # type: ignore[attr-defined]

        def pump() -> None:  # a thread: a selector would miss lines readline() buffered
            for line in proc.stdout:
                proc.line_queue.put(line)
            proc.line_queue.put(None)

        threading.Thread(target=pump, daemon=True).start()
        return proc

    def lines(self, proc: Any, tag: str, want: int, timeout: float) -> list[dict[str, Any]]:
        """Read ``want`` lines tagged ``tag`` from ``proc`` (fewer if it exits or times out)."""
        found: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while len(found) < want:
            try:
                line = proc.line_queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:  # end of its output
                break
            if line.startswith(tag + " "):
                record = json.loads(line[len(tag) + 1 :])
                if record.get("arena"):
                    self.arenas.add(record["arena"])
                found.append(record)
        return found

    def finish(self, proc: Any, *, expect_ok: bool = True) -> None:
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if expect_ok and proc.returncode != 0:
            self.failures += 1
            proc.err_file.seek(0)
            tail = proc.err_file.read()[-3000:]
            print(f"  child failed (exit {proc.returncode}):\n{tail}", file=sys.stderr)
        proc.err_file.close()
        # Leftovers of a failed child (orphaned workers): its whole process group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    def run(self, variant: str, role: str, nw: int, transform: int, ddp: bool = False) -> Any:
        proc = self.start(variant, role, nw, transform, ddp)
        found = self.lines(proc, "RESULT", 1, CHILD_TIMEOUT)
        self.finish(proc)
        if not found:
            return None
        record = found[0]
        record.update(variant=variant, role=role, workers=nw, transform=transform, ddp=ddp)
        return record


def probe_construction() -> None:
    """One CachedDataset construction (it reclaims dead arenas first), closed at once."""
    probe = CachedDataset(TensorDataset(torch.zeros(2, 1)), max_bytes=1 << 20, key="peers-probe")
    probe.close()


def gone(pids: Iterable[int]) -> bool:
    # A zombie leader is not enough: its other threads may still be exiting, and hold the
    # arena's liveness locks until they have (/proc/<pid>/status "Threads" counts them).
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE or p.num_threads() > 1:
                return False
    return True


def wait_gone(pids: list[int], timeout: float = 60.0) -> float:
    start = time.monotonic()
    while not gone(pids) and time.monotonic() - start < timeout:
        time.sleep(0.1)
    return time.monotonic() - start


def kill_case(runner: Runner, ddp: bool) -> dict[str, Any]:
    """SIGKILL ``ours`` mid epoch 2 (the whole process, or rank 1); count its arenas left."""
    proc = runner.start("ours", "kill", 2, 0, ddp)
    ready = runner.lines(proc, "READY", 2 if ddp else 1, CHILD_TIMEOUT)
    row: dict[str, Any] = {"case": "DDP: rank 1 of 2" if ddp else "1 process + 2 workers"}
    if len(ready) < (2 if ddp else 1):
        runner.finish(proc)
        row["error"] = "no READY line"
        return row
    arenas = sorted({r["arena"] for r in ready})
    if ddp:
        victim = next(r for r in ready if r["rank"] == 1)["pid"]
        pids = [p for r in ready for p in [r["pid"], *r["workers"]]]
    else:
        victim = proc.pid
        pids = ready[0]["pids"]

    def left() -> int:
        return sum(os.path.exists(a) for a in arenas)

    os.kill(victim, signal.SIGKILL)
    row["left right after the kill"] = left()
    runner.finish(proc, expect_ok=False)  # DDP: mp.spawn terminates rank 0, then exits
    row["launcher exit code"] = proc.returncode
    row["left once the launcher exited"] = left()
    row["processes of the run alive then"] = sum(not gone([p]) for p in pids)
    probe_construction()
    row["left after a construction right then"] = left()
    row["s until all exited"] = round(wait_gone(pids), 1)
    row["left once all exited"] = left()
    probe_construction()
    row["left after the next construction"] = left()
    return row


def rotate(names: list[str], r: int) -> list[str]:
    return names[r % len(names) :] + names[: r % len(names)]


# ---------------------------------------------------------------------------------- report
def stat(values: list[float], digits: int = 3) -> str:
    if not values:
        return "n/a"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def select(records: list[dict[str, Any]], **match: Any) -> list[dict[str, Any]]:
    return [r for r in records if all(r.get(k) == v for k, v in match.items())]


def by_round(records: list[dict[str, Any]], **match: Any) -> dict[int, dict[str, Any]]:
    return {r["round"]: r for r in select(records, **match)}


def paired(
    a: dict[int, dict[str, Any]], b: dict[int, dict[str, Any]], f: Callable[..., float | None]
) -> list[float]:
    out = []
    for rnd in sorted(set(a) & set(b)):
        value = f(a[rnd], b[rnd])
        if value is not None:
            out.append(value)
    return out


def kind_sum(record: dict[str, Any], role: str, kind: str, field: str = "pss") -> float:
    return float(
        sum(p["kinds"][kind][field] for p in record["procs"] if role in ("all", p["role"]))
    )


def role_sum(record: dict[str, Any], role: str, field: str) -> float:
    return float(sum(p[field] for p in record["procs"] if role in ("all", p["role"])))


def batch_bytes(transform: int) -> int:
    side = CROP if transform else SIZE
    return BATCH * (3 * side * side + 8)  # uint8 images + int64 labels


def nonfile(record: dict[str, Any]) -> float:
    """The tree's PSS outside file-backed mappings: anonymous + shared memory + arena.

    File-backed pages (torch's libraries) are shared with every other process on the machine
    that maps them, so their PSS moves with whatever else runs; these kinds are this tree's own.
    """
    return sum(kind_sum(record, "all", k) for k in ("anon", "shm", "arena"))


def report(
    records: list[dict[str, Any]],
    kills: list[dict[str, Any]],
    n: int,
    rounds: int,
    workers: list[int],
    variants: list[str],
    ddp_variants: list[str],
) -> None:
    payload = n * 3 * SIZE * SIZE
    single = [r for r in records if not r["ddp"]]
    ddp = [r for r in records if r["ddp"]]
    tag = {0: "no", 1: "yes"}

    def extra(rec: dict[str, Any], base: dict[str, Any]) -> float:
        return (rec["pss_tree"] - base["pss_tree"]) / payload

    def extra_nf(rec: dict[str, Any], base: dict[str, Any]) -> float:
        return (nonfile(rec) - nonfile(base)) / payload

    def extra_ratio(
        ours: dict[int, Any], peer: dict[int, Any], base: dict[int, Any], f: Callable[..., float]
    ) -> list[float]:
        return [
            f(ours[rnd], base[rnd]) / f(peer[rnd], base[rnd])
            for rnd in sorted(set(ours) & set(peer) & set(base))
        ]

    rows = []
    for transform in (0, 1):
        for nw in workers:
            base_mem = by_round(
                single, variant="uncached", role="mem", workers=nw, transform=transform
            )
            for v in variants:
                t = select(single, variant=v, role="time", workers=nw, transform=transform)
                mem = by_round(single, variant=v, role="mem", workers=nw, transform=transform)
                rows.append(
                    [
                        tag[transform],
                        nw,
                        v,
                        stat([r["epoch1"] for r in t]),
                        stat([r["construct"] for r in t]),
                        stat([r["epoch2"] for r in t]),
                        stat([r["pss_tree"] / MiB for r in mem.values()], 0),
                        stat(paired(mem, base_mem, extra), 2),
                        stat([nonfile(r) / MiB for r in mem.values()], 0),
                        stat(paired(mem, base_mem, extra_nf), 2),
                    ]
                )
    print_table(
        f"{n} JPEGs -> 3x{SIZE}x{SIZE} uint8 (payload {payload / MiB:.1f} MiB), batch {BATCH}, "
        f"shuffle, persistent forked workers; each run a fresh process; median (min-max) of "
        f"{rounds} alternating rounds. Epoch 1 includes the dataset's construction (MONAI eager: "
        f"its whole fill). Memory mid epoch 2, summed over the process tree: psutil PSS, and the "
        f"PSS of its anonymous + shared-memory + arena mappings (non-file: immune to other "
        f"processes mapping the same libraries); extra = minus uncached's in the same round and "
        f"setting, over the payload",
        [
            "random transform",
            "workers",
            "variant",
            "epoch 1 s",
            "of which construction s",
            "epoch 2 s",
            "tree PSS MiB",
            "extra PSS / payload",
            "non-file PSS MiB",
            "extra non-file PSS / payload",
        ],
        rows,
    )

    ratio_rows = []
    for transform in (0, 1):
        for nw in workers:

            def cells(v: str, role: str, nw: int = nw, transform: int = transform) -> Any:
                return by_round(single, variant=v, role=role, workers=nw, transform=transform)

            monai_t, monai_m = cells("monai_eager", "time"), cells("monai_eager", "mem")
            base_m = cells("uncached", "mem")
            for ours in ("ours", "ours_filled"):
                if ours not in variants:
                    continue
                ours_t, ours_m = cells(ours, "time"), cells(ours, "mem")
                ratio_rows.append(
                    [
                        tag[transform],
                        nw,
                        ours,
                        stat(paired(ours_t, monai_t, lambda a, b: a["epoch2"] / b["epoch2"]), 2),
                        stat(
                            paired(
                                ours_t,
                                cells("uncached", "time"),
                                lambda a, b: a["epoch1"] / b["epoch1"],
                            ),
                            2,
                        ),
                        stat(paired(ours_t, monai_t, lambda a, b: a["epoch1"] / b["epoch1"]), 2),
                        stat(extra_ratio(ours_m, monai_m, base_m, extra), 2),
                        stat(extra_ratio(ours_m, monai_m, base_m, extra_nf), 2),
                        stat(
                            paired(ours_m, monai_m, lambda a, b: a["pss_tree"] / b["pss_tree"]), 3
                        ),
                    ]
                )
    print_table(
        "Ratios (ours = the variant named), median (min-max) over rounds of the ratio within "
        "each round",
        [
            "random transform",
            "workers",
            "ours",
            "ours / monai_eager epoch 2",
            "ours / uncached epoch 1",
            "ours / monai_eager epoch 1",
            "ours / monai_eager extra PSS",
            "ours / monai_eager extra non-file PSS",
            "ours / monai_eager tree PSS",
        ],
        ratio_rows,
    )

    print_table(
        "Batches in flight (computed, not measured): workers x prefetch_factor x batch bytes; "
        "they live in torch's shared memory while queued, on top of every variant's PSS",
        ["random transform", "workers", "batch bytes", "in flight MiB", "in flight / payload"],
        [
            [
                tag[t],
                nw,
                f"{batch_bytes(t):,}",
                f"{nw * PREFETCH * batch_bytes(t) / MiB:.2f}",
                f"{nw * PREFETCH * batch_bytes(t) / payload:.3f}",
            ]
            for t in (0, 1)
            for nw in workers
        ],
    )

    arena_rows = []
    for transform in (0, 1):
        for nw in workers:
            mem = select(single, variant="ours", role="mem", workers=nw, transform=transform)
            mem = [r for r in mem if "arena_allocated" in r]
            if mem:
                arena_rows.append(
                    [
                        tag[transform],
                        nw,
                        stat([r["arena_bytes_used"] / payload for r in mem]),
                        stat([r["arena_allocated"] / payload for r in mem]),
                        stat([kind_sum(r, "all", "arena") / payload for r in mem]),
                        stat([kind_sum(r, "all", "arena", "rss") / payload for r in mem]),
                    ]
                )
    if arena_rows:
        print_table(
            "ours: the arena mid epoch 2, over the payload. Allocated = the /dev/shm file's "
            "blocks (RAM, reserved ahead in 16 MiB chunks); PSS = what the tree's mappings of "
            "it add up to (pages no process touched count in no PSS)",
            [
                "random transform",
                "workers",
                "bytes used",
                "file allocated",
                "arena PSS (all processes)",
                "arena RSS summed",
            ],
            arena_rows,
        )

    breakdown(single, payload, workers, variants)

    if ddp:
        rows = []
        for transform in (0, 1):
            base = by_round(ddp, variant="uncached", transform=transform)
            for v in ddp_variants:
                mem = by_round(ddp, variant=v, transform=transform)
                rows.append(
                    [
                        tag[transform],
                        v,
                        stat([r["epoch1"] for r in mem.values()]),
                        stat([r["pss_tree"] / MiB for r in mem.values()], 0),
                        stat(paired(mem, base, extra), 2),
                        stat([nonfile(r) / MiB for r in mem.values()], 0),
                        stat(paired(mem, base, extra_nf), 2),
                        stat([kind_sum(r, "all", "arena") / payload for r in mem.values()], 2),
                    ]
                )
            m = by_round(ddp, variant="monai_eager", transform=transform)
            for ours in ("ours", "ours_filled"):
                if ours not in ddp_variants:
                    continue
                o = by_round(ddp, variant=ours, transform=transform)
                rows.append(
                    [
                        tag[transform],
                        f"ratio {ours} / monai_eager",
                        stat(paired(o, m, lambda a, b: a["epoch1"] / b["epoch1"]), 2),
                        stat(paired(o, m, lambda a, b: a["pss_tree"] / b["pss_tree"]), 3),
                        stat(extra_ratio(o, m, base, extra), 2),
                        "",
                        stat(extra_ratio(o, m, base, extra_nf), 2),
                        "",
                    ]
                )
        print_table(
            "DDP, 2 ranks x 2 workers (gloo, DistributedSampler): memory of both ranks' trees "
            f"mid epoch 2 (as above); epoch 1 = construction + epoch 1 of the slower rank; "
            f"median (min-max) of {rounds} rounds",
            [
                "random transform",
                "variant",
                "epoch 1 s",
                "tree PSS MiB",
                "extra PSS / payload",
                "non-file PSS MiB",
                "extra non-file PSS / payload",
                "arena PSS / payload",
            ],
            rows,
        )

    if kills:
        keys = [k for k in kills[0] if k != "case"]
        print_table(
            "Kill: ours, 2 workers, SIGKILL mid epoch 2; the run's /dev/shm/speedpack-* files",
            ["case", *keys],
            [[k.get("case"), *[k.get(key, "") for key in keys]] for k in kills],
        )


def breakdown(
    single: list[dict[str, Any]], payload: int, workers: list[int], variants: list[str]
) -> None:
    """Where the memory is: PSS per process role and kind of mapping, MiB, medians."""
    shown = [
        v for v in ("ours", "ours_filled", "uncached", "monai_eager", "naive_list") if v in variants
    ]
    rows = []
    for nw in workers:
        for v in shown:
            for transform in (0, 1):
                mem = select(single, variant=v, role="mem", workers=nw, transform=transform)
                if not mem:
                    continue

                def med(f: Callable[[dict[str, Any]], float], mem: Any = mem) -> str:
                    return f"{statistics.median(f(r) for r in mem) / MiB:.1f}"

                rows.append(
                    [
                        nw,
                        v,
                        "yes" if transform else "no",
                        med(lambda r: role_sum(r, "main", "pss")),
                        med(lambda r: kind_sum(r, "main", "anon")),
                        med(lambda r: kind_sum(r, "main", "arena")),
                        med(lambda r: kind_sum(r, "main", "shm")),
                        med(lambda r: role_sum(r, "worker", "pss")),
                        med(lambda r: role_sum(r, "worker", "uss")),
                        med(lambda r: kind_sum(r, "worker", "anon")),
                        med(lambda r: kind_sum(r, "worker", "anon", "private")),
                        med(lambda r: kind_sum(r, "worker", "arena")),
                        med(lambda r: kind_sum(r, "worker", "shm")),
                        med(lambda r: kind_sum(r, "worker", "file")),
                        med(lambda r: role_sum(r, "other", "pss")),
                    ]
                )
    print_table(
        "Where the memory is mid epoch 2 (MiB, medians over rounds): PSS by process and by "
        "mapping (smaps): anon = heap and anonymous mappings, arena = /dev/shm/speedpack-*, "
        "shm = torch's shared batches; workers summed; other = MONAI's manager process",
        [
            "workers",
            "variant",
            "transform",
            "main PSS",
            "main anon",
            "main arena",
            "main shm",
            "workers PSS",
            "workers USS",
            "workers anon PSS",
            "workers anon private",
            "workers arena",
            "workers shm",
            "workers file",
            "other PSS",
        ],
        rows,
    )
    delta_rows = []
    for nw in workers:
        for v in shown:
            a = by_round(single, variant=v, role="mem", workers=nw, transform=1)
            b = by_round(single, variant=v, role="mem", workers=nw, transform=0)
            if not (a and b):
                continue

            def d(f: Callable[[dict[str, Any]], float], a: Any = a, b: Any = b) -> str:
                return stat(paired(a, b, lambda x, y: (f(x) - f(y)) / MiB), 1)

            delta_rows.append(
                [
                    nw,
                    v,
                    d(lambda r: r["pss_tree"]),
                    d(lambda r: kind_sum(r, "main", "anon")),
                    d(lambda r: kind_sum(r, "main", "arena")),
                    d(lambda r: kind_sum(r, "worker", "anon")),
                    d(lambda r: kind_sum(r, "worker", "arena")),
                    d(lambda r: kind_sum(r, "all", "shm")),
                    d(lambda r: kind_sum(r, "all", "file") + kind_sum(r, "all", "other")),
                ]
            )
    print_table(
        "With the random transform minus without, same variant, workers and round (MiB, median "
        "(min-max)): which process and which mapping grows",
        [
            "workers",
            "variant",
            "tree PSS",
            "main anon",
            "main arena",
            "workers anon",
            "workers arena",
            "shm (all)",
            "file + other (all)",
        ],
        delta_rows,
    )


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="300 images, 1 round (smoke run)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", default="0,2,4", help="DataLoader worker counts")
    parser.add_argument(
        "--only",
        default="",
        help="comma list of sections (single, ddp, kill) and/or variants to run; uncached, "
        "the baseline, always runs",
    )
    parser.add_argument("--n", type=int, default=0, help="number of images (default 1500)")
    parser.add_argument("--save", default="", help="also write the raw records (JSON) here")
    # Child mode (set by the parent):
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--role", default="time", help=argparse.SUPPRESS)
    parser.add_argument("--nw", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--transform", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--ddp", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse()
    if args.variant:
        child(args)
        return
    n = args.n or (300 if args.quick else 1500)
    rounds = 1 if args.quick else args.rounds
    workers = [int(w) for w in args.workers.split(",")]
    only = {x for x in args.only.split(",") if x}
    unknown = only - set(SECTIONS) - set(VARIANTS) - set(DDP_VARIANTS)
    if unknown:
        raise SystemExit(f"--only: unknown {sorted(unknown)}")
    sections = [s for s in SECTIONS if s in only] or list(SECTIONS)
    picked = only - set(SECTIONS)
    variants = [v for v in VARIANTS if not picked or v in picked or v == "uncached"]
    ddp_variants = [v for v in DDP_VARIANTS if not picked or v in picked or v == "uncached"]
    t0 = time.perf_counter()
    records: list[dict[str, Any]] = []
    kills: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="speedpack-bench-peers-") as tmp:
        folder = os.path.join(tmp, "jpegs")
        os.mkdir(folder)
        write_jpegs(Path(folder), n, *SRC_PX)
        print(
            f"{n} JPEGs {SRC_PX[0]}-{SRC_PX[1]} px -> 3x{SIZE}x{SIZE}; sections {sections}; "
            f"workers {workers}; {rounds} round(s); python {sys.version.split()[0]}, torch "
            f"{torch.__version__}, {os.cpu_count()} CPUs",
            flush=True,
        )
        runner = Runner(folder, n, tmp)
        try:
            for rnd in range(rounds):
                if "single" in sections:
                    for nw in workers:
                        for transform in (0, 1):
                            for v in rotate(variants, rnd):
                                for role in ("time", "mem"):
                                    rec = runner.run(v, role, nw, transform)
                                    progress(rnd, rounds, rec, v, role, nw, transform, t0)
                                    if rec is not None:
                                        records.append({**rec, "round": rnd})
                if "ddp" in sections:
                    for transform in (0, 1):
                        for v in rotate(ddp_variants, rnd):
                            rec = runner.run(v, "mem", 2, transform, ddp=True)
                            progress(rnd, rounds, rec, f"DDP {v}", "mem", 2, transform, t0)
                            if rec is not None:
                                records.append({**rec, "round": rnd})
                if "kill" in sections:
                    for ddp in (False, True):
                        row = kill_case(runner, ddp)
                        print(f"[round {rnd + 1}] kill: {row}", file=sys.stderr, flush=True)
                        kills.append({**row, "case": f"round {rnd + 1}: {row['case']}"})
        finally:
            left = sorted(a for a in runner.arenas if os.path.exists(a))
            for path in left:  # every process of ours has exited: these are dead
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            print(
                f"\nclean-up: {len(runner.arenas)} arena(s) reported by the children, "
                f"{len(left)} still in /dev/shm at the end, removed: {left}",
                flush=True,
            )
        report(records, kills, n, rounds, workers, variants, ddp_variants)
    if args.save:
        with open(args.save, "w") as f:
            json.dump({"records": records, "kills": kills, "n": n}, f)
    print(
        f"\nchildren: {runner.count}, failed: {runner.failures}; total "
        f"{time.perf_counter() - t0:.0f} s" + (f"; raw records in {args.save}" if args.save else "")
    )


def progress(
    rnd: int,
    rounds: int,
    rec: dict[str, Any] | None,
    variant: str,
    role: str,
    nw: int,
    transform: int,
    t0: float,
) -> None:
    if rec is None:
        what = "FAILED"
    elif role == "time":
        what = f"epoch 1 {rec['epoch1']:.2f} s, epoch 2 {rec['epoch2']:.3f} s"
    else:
        what = f"epoch 1 {rec['epoch1']:.2f} s, tree PSS {rec['pss_tree'] / MiB:.0f} MiB"
    print(
        f"[round {rnd + 1}/{rounds} {time.perf_counter() - t0:6.0f} s] {variant} w={nw} "
        f"t={transform} {role}: {what}",
        file=sys.stderr,
        flush=True,
    )


if __name__ == "__main__":
    main()
