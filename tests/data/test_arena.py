"""The arena's protocol: claims, publication, crashes, races, budget, stale files, clean-up."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from lightning_speedpack.data import arena as _arena
from lightning_speedpack.data.arena import MISSING, READY, WRITING, Arena, process_alive
from lightning_speedpack.data.codec import encode

FP = bytes(range(32))
OTHER_FP = bytes(32)


def open_arena(
    path: Path, n: int = 8, capacity: int = 1 << 20, kind: Any = "shared", fp: bytes = FP
) -> Arena:
    return Arena.open(str(path), fingerprint=fp, n_slots=n, capacity=capacity, kind=kind)


def sample(i: int) -> tuple[torch.Tensor, int]:
    return torch.full((i + 1, 3), i, dtype=torch.int32), i


def test_put_then_get_round_trips_and_counts(tmp_path: Path) -> None:
    arena = open_arena(tmp_path / "a")
    assert arena.created
    assert arena.get(3) is MISSING
    assert arena.put(3, encode(sample(3), 3)) == "stored"
    assert arena.put(3, encode(sample(3), 3)) == "skipped"  # already READY
    t, i = arena.get(3)
    assert torch.equal(t, sample(3)[0])
    assert i == 3
    arena.count(hit=True)
    arena.count(hit=False)
    arena.count(hit=False)
    stats = arena.stats()
    assert (stats["hits"], stats["misses"], stats["items"]) == (1, 2, 1)
    assert stats["bytes_used"] % 64 == 0
    assert 0 < stats["bytes_used"] <= 1024
    arena.close()
    assert not (tmp_path / "a").exists()  # last owner of a shared file unlinks it


def _claim_and_die(path: str, index: int) -> None:
    """A writer that reserves a slot, writes half of the payload, and is killed."""
    arena = Arena.attach(_state_of(path))
    original = arena._bytes.__setitem__

    enc = encode(sample(index), index)

    def write_half(dest: np.ndarray[Any, Any]) -> None:
        dest[: dest.size // 2] = 0xAB
        os.kill(os.getpid(), signal.SIGKILL)

    enc.write_into = write_half  # type: ignore[method-assign]
    del original
    arena.put(index, enc)


def _state_of(path: str) -> Any:
    st = os.stat(path)
    nonce = int(np.fromfile(path, dtype=np.int64, count=_arena.HEADER_WORDS)[_arena._NONCE])
    return _arena.ArenaState(path, st.st_ino, st.st_dev, nonce)


def test_writer_killed_mid_write_leaves_slot_unfilled_then_reclaimed(tmp_path: Path) -> None:
    arena = open_arena(tmp_path / "a")
    proc = mp.get_context("fork").Process(target=_claim_and_die, args=(str(tmp_path / "a"), 5))
    proc.start()
    proc.join(30)
    assert proc.exitcode == -signal.SIGKILL
    assert arena._slots[5, 0] == WRITING
    assert not process_alive(int(arena._slots[5, 1]))
    assert arena.get(5) is MISSING  # not published, never a torn sample
    used = arena.stats()["bytes_used"]
    assert arena.put(5, encode(sample(5), 5)) == "stored"
    assert arena.stats()["bytes_used"] == used  # the dead writer's space was reused
    t, i = arena.get(5)
    assert torch.equal(t, sample(5)[0])
    assert i == 5
    arena.close()


def test_a_live_writer_is_not_overtaken(tmp_path: Path) -> None:
    arena = open_arena(tmp_path / "a")
    arena._slots[2] = (WRITING, os.getppid(), 0, 64)  # someone alive is writing index 2
    assert arena.put(2, encode(sample(2), 2)) == "skipped"
    assert arena.get(2) is MISSING
    arena._slots[2] = 0
    arena.close()


def _race(path: str, n: int, barrier: Any, results: Any) -> None:
    arena = Arena.attach(_state_of(path))
    barrier.wait()
    stored = [i for i in range(n) if arena.put(i, encode(sample(i), i)) == "stored"]
    results.put(stored)


def test_racing_processes_publish_each_index_exactly_once(tmp_path: Path) -> None:
    n = 200
    arena = open_arena(tmp_path / "a", n=n)
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(3), ctx.Queue()
    procs = [
        ctx.Process(target=_race, args=(str(tmp_path / "a"), n, barrier, results)) for _ in range(3)
    ]
    for p in procs:
        p.start()
    stored = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
    flat = sorted(i for s in stored for i in s)
    assert flat == list(range(n))  # every index stored by exactly one process
    assert (arena._slots[:, 0] == READY).all()
    for i in range(n):
        t, j = arena.get(i)
        assert torch.equal(t, sample(i)[0])
        assert j == i
    assert arena.stats()["bytes_used"] == sum(encode(sample(i)).nbytes for i in range(n))
    arena.close()


def _count_in_child(path: str) -> None:
    arena = Arena.attach(_state_of(path))
    for _ in range(5):
        arena.count(hit=True)
    arena.count(hit=False)


def test_counts_from_exited_processes_are_kept(tmp_path: Path) -> None:
    arena = open_arena(tmp_path / "a")
    ctx = mp.get_context("fork")
    for _ in range(3):
        p = ctx.Process(target=_count_in_child, args=(str(tmp_path / "a"),))
        p.start()
        p.join(30)
    arena.count(hit=True)
    stats = arena.stats()
    assert (stats["hits"], stats["misses"]) == (16, 3)
    arena.close()


def test_budget_exhaustion_is_reported_once(tmp_path: Path) -> None:
    arena = open_arena(tmp_path / "a", capacity=1024)
    results = [arena.put(i, encode(sample(i), i)) for i in range(8)]
    first = results.index("budget_exhausted_now")
    assert results[:first] == ["stored"] * first
    assert first >= 1
    assert results[first + 1 :] == ["budget_exhausted"] * (7 - first)
    stats = arena.stats()
    assert stats["budget_exhausted"] == 1
    assert stats["bytes_used"] <= 1024
    arena.close()


def test_second_owner_attaches_and_last_owner_unlinks(tmp_path: Path) -> None:
    path = tmp_path / "a"
    first = open_arena(path)
    first.put(0, encode(sample(0), 0))
    second = open_arena(path)
    assert not second.created
    assert second.is_ready(0)
    first.close()
    assert path.exists()  # the second owner still uses it
    second.close()
    assert not path.exists()


def _open_and_get_killed(path: str) -> None:
    arena = open_arena(Path(path))
    arena.put(0, encode(sample(0), 0))
    os.kill(os.getpid(), signal.SIGKILL)


def test_stale_file_of_a_killed_run_is_replaced_not_reused(tmp_path: Path) -> None:
    path = tmp_path / "a"
    p = mp.get_context("fork").Process(target=_open_and_get_killed, args=(str(path),))
    p.start()
    p.join(30)
    assert path.exists()  # the killed run could not clean up
    stale_inode = path.stat().st_ino
    arena = open_arena(path)
    assert arena.created
    assert not arena.is_ready(0)
    assert path.stat().st_ino != stale_inode
    arena.close()
    assert not path.exists()
    assert not list(tmp_path.iterdir())  # no temporary files left either


def test_disk_file_is_reused_when_fingerprint_matches_and_rebuilt_otherwise(tmp_path: Path) -> None:
    path = tmp_path / "cache.bin"
    arena = open_arena(path, kind="disk")
    arena.put(1, encode(sample(1), 1))
    arena.count(hit=False)
    arena.close()
    assert path.exists()  # disk storage survives its owners
    again = open_arena(path, kind="disk")
    assert not again.created
    assert again.is_ready(1)
    assert again.stats()["misses"] == 0  # a new run counts from zero
    again.close()
    other = open_arena(path, kind="disk", fp=OTHER_FP)
    assert other.created
    assert not other.is_ready(1)
    other.close()
    resized = open_arena(path, n=9, kind="disk", fp=OTHER_FP)
    assert resized.created
    resized.close()


def test_attach_refuses_a_replaced_file(tmp_path: Path) -> None:
    arena = open_arena(tmp_path / "a")
    state = arena.state()
    arena.close()
    with pytest.raises(FileNotFoundError):
        Arena.attach(state)
    again = open_arena(tmp_path / "a")
    with pytest.raises(FileNotFoundError, match="replaced"):
        Arena.attach(state)
    again.close()


def test_process_alive() -> None:
    assert process_alive(os.getpid())
    assert not process_alive(0)
    assert not process_alive(os.getpid(), start=1)  # same pid, other start time: pid reused


def test_threads_of_one_process_publish_each_index_once(tmp_path: Path) -> None:
    import threading

    n = 100
    arena = open_arena(tmp_path / "a", n=n)
    stored: list[int] = []
    start = threading.Barrier(4)

    def work() -> None:
        start.wait()
        stored.extend(i for i in range(n) if arena.put(i, encode(sample(i), i)) == "stored")

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(stored) == list(range(n))
    assert arena.stats()["bytes_used"] == sum(encode(sample(i)).nbytes for i in range(n))
    arena.close()
