"""cache_peers.py's parent side: start children, read their JSON lines, and the kill case.

``Runner`` re-invokes the entry-point script (``cache_peers.py --variant ...``) in a fresh
process per measurement and remembers every arena a child reported; ``kill_case`` SIGKILLs
``ours`` mid epoch 2 and counts the run's arenas left in /dev/shm.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any

import psutil
import torch
from torch.utils.data import TensorDataset

from lightning_speedpack import CachedDataset

__all__ = ["CHILD_TIMEOUT", "Runner", "gone", "kill_case", "probe_construction", "rotate"]

CHILD_TIMEOUT = 900.0


class Runner:
    """Starts children (``script --variant ...``), collects their JSON lines, remembers arenas."""

    def __init__(self, script: str, folder: str, n: int, scratch: str) -> None:
        self.script, self.folder, self.n, self.scratch = script, folder, n, scratch
        self.arenas: set[str] = set()
        self.failures = 0
        self.count = 0

    def start(self, variant: str, role: str, nw: int, transform: int, ddp: bool) -> Any:
        argv = [sys.executable, self.script, "--variant", variant, "--role", role]
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
