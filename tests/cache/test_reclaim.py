"""Arenas of killed runs are reclaimed by the next CachedDataset; arenas in use never are."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

from lightning_speedpack.cache import liveness, node_id
from lightning_speedpack.cache.cached_dataset import CachedDataset
from lightning_speedpack.cache.reclaim import scan
from tests.cache.procs import kill_group, python_group, read_line

HOLDER = """
import multiprocessing as mp, os, pickle, sys, time
import torch
from torch.utils.data import TensorDataset
from lightning_speedpack.cache.cached_dataset import CachedDataset

def hold(blob):
    copy = pickle.loads(blob)  # a spawned worker attaches to the arena
    copy[1]
    print("child", os.getpid(), flush=True)
    time.sleep(600)

if __name__ == "__main__":
    key, child = sys.argv[1], sys.argv[2]
    cached = CachedDataset(TensorDataset(torch.arange(4.0)), max_bytes=1 << 20, key=key)
    cached[0]
    print(cached.cache_path, flush=True)
    if child == "fork":
        pid = os.fork()
        if pid == 0:
            cached[2]  # the forked child uses the arena through its own descriptor
            print("child", os.getpid(), flush=True)
            time.sleep(600)
            os._exit(0)
        sys.stdout.flush()
    elif child == "spawn":
        proc = mp.get_context("spawn").Process(target=hold, args=(pickle.dumps(cached),))
        proc.start()
    else:
        print("child none", flush=True)
    time.sleep(600)
"""


@pytest.fixture
def holder(tmp_path: Path) -> Path:
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    return script


def unique(name: str) -> str:
    return f"{name}-{os.getpid()}-{time.monotonic_ns()}"


def wait_gone(pid: int) -> None:
    """Until ``pid`` (our child) is reaped, or at least no longer running."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done:
            return
        time.sleep(0.02)


def reclaim_by_constructing() -> None:
    with CachedDataset(TensorDataset(torch.zeros(2)), max_bytes=1 << 16, key=unique("next")):
        pass


def status_of(path: str) -> str:
    (entry,) = [f for f in scan() if f.path == path]
    return entry.status


@pytest.mark.slow
def test_sigkilled_owner_is_reclaimed_by_any_next_dataset_a_live_one_never(holder: Path) -> None:
    with (
        python_group(holder, unique("killed"), "none") as killed,
        python_group(holder, unique("alive"), "none") as alive,
    ):
        dead_path, live_path = read_line(killed), read_line(alive)
        assert dead_path.startswith("/dev/shm/speedpack-")
        assert live_path.startswith("/dev/shm/speedpack-")
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(30)
        assert os.path.exists(dead_path)  # a SIGKILLed run cannot clean up after itself
        assert status_of(dead_path) == "dead"
        assert status_of(live_path) == "in use"
        reclaim_by_constructing()  # another dataset entirely
        assert not os.path.exists(dead_path)
        assert os.path.exists(live_path)  # its process still runs: never removed
        assert alive.poll() is None


@pytest.mark.slow
@pytest.mark.parametrize("child", ["fork", "spawn"])
def test_a_worker_still_using_the_arena_keeps_it_after_its_parent_is_killed(
    holder: Path, child: str
) -> None:
    with python_group(holder, unique(child), child) as proc:
        path = read_line(proc)
        word, pid = read_line(proc).split()
        assert word == "child"
        try:
            os.kill(proc.pid, signal.SIGKILL)  # the owner only: its worker lives on
            proc.wait(30)
            reclaim_by_constructing()
            assert os.path.exists(path)
            assert status_of(path) == "in use"
        finally:
            kill_group(proc.pid)  # the worker is in the owner's session
        deadline = time.monotonic() + 30
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.02)  # reparented to init, which reaps it
        reclaim_by_constructing()
        assert not os.path.exists(path)


def test_a_file_being_opened_is_not_removed_under_its_opener(tmp_path: Path) -> None:
    """The reclaimer takes its lock and removes; an opener that then locks sees the path moved."""
    path = tmp_path / "speedpack-race"
    path.write_bytes(b"\0" * 64)  # a draft: ours by its name below
    draft = tmp_path / "speedpack-x.tmp"
    draft.write_bytes(b"")
    fd = os.open(draft, os.O_RDWR)
    try:
        liveness.lock(fd, liveness.USERS)  # someone is writing this draft
        found = {Path(f.path).name: f for f in scan(str(tmp_path), remove=True)}
    finally:
        os.close(fd)
    assert found["speedpack-x.tmp"].status == "in use"
    assert draft.exists()
    assert found["speedpack-race"].status == "unknown"  # not our format: left alone
    assert path.exists()
    assert [f.removed for f in scan(str(tmp_path), remove=True)] == [False, True]
    assert not draft.exists()


def test_node_id_reads_the_override_then_the_launchers(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("LIGHTNING_SPEEDPACK_NODE_ID", "GROUP_RANK", "NODE_RANK", "SLURM_NODEID"):
        monkeypatch.delenv(var, raising=False)
    assert node_id() == "0"
    monkeypatch.setenv("SLURM_NODEID", "3")
    assert node_id() == "3"
    monkeypatch.setenv("NODE_RANK", "2")
    assert node_id() == "2"
    monkeypatch.setenv("GROUP_RANK", "1")
    assert node_id() == "1"
    monkeypatch.setenv("LIGHTNING_SPEEDPACK_NODE_ID", "sim node/7")
    assert node_id() == "sim_node_7"


def test_two_simulated_nodes_on_one_host_get_an_arena_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "two-nodes")  # one job, as torchrun --nnodes 2
    monkeypatch.setenv("MASTER_PORT", "29511")
    base = TensorDataset(torch.arange(4.0))
    key = unique("nodes")
    monkeypatch.setenv("GROUP_RANK", "0")
    with CachedDataset(base, max_bytes=1 << 16, key=key) as node0:
        monkeypatch.setenv("GROUP_RANK", "1")
        with CachedDataset(base, max_bytes=1 << 16, key=key) as node1:
            assert node0.cache_path != node1.cache_path
            assert "-n0-" in str(node0.cache_path)
            assert "-n1-" in str(node1.cache_path)
            node0[0]
            assert node1.cache_info().items == 0  # each node fills its own
