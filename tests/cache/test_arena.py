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

from lightning_speedpack.cache import arena as _arena
from lightning_speedpack.cache import structures as _structures
from lightning_speedpack.cache.arena import MISSING, READY, WRITING, Arena
from lightning_speedpack.cache.codec import encode
from tests.helpers.samples import assert_same

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

    def write_half(dest: np.ndarray[Any, Any], **_: Any) -> None:
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
    assert not arena._writer_alive(int(arena._slots[5, 1]))  # its row lock died with it
    assert arena.get(5) is MISSING  # not published, never a torn sample
    used = arena.stats()["bytes_used"]
    assert arena.put(5, encode(sample(5), 5)) == "stored"
    assert arena.stats()["bytes_used"] == used  # the dead writer's space was reused
    t, i = arena.get(5)
    assert torch.equal(t, sample(5)[0])
    assert i == 5
    arena.close()


def _claim_slot_and_wait(path: str, index: int, ready: Any, done: Any) -> None:
    """A live writer: claims ``index`` as a real writer would, then waits (never publishes)."""
    arena = Arena.attach(_state_of(path))
    arena._ensure_row()
    with arena._locked():
        arena._slots[index] = (WRITING, arena._writer, 0, 64)
    ready.set()
    done.wait(60)


def test_a_live_writer_is_not_overtaken_and_a_dead_one_is(tmp_path: Path) -> None:
    arena = open_arena(tmp_path / "a")
    ctx = mp.get_context("fork")
    ready, done = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_claim_slot_and_wait, args=(str(tmp_path / "a"), 2, ready, done))
    proc.start()
    try:
        assert ready.wait(60)
        assert arena.put(2, encode(sample(2), 2)) == "skipped"  # someone alive is writing it
        assert arena.get(2) is MISSING
    finally:
        done.set()
        proc.join(30)
    assert arena.put(2, encode(sample(2), 2)) == "stored"  # its writer exited: reclaimed
    arena.close()


def _claim_slot_and_die(path: str, index: int) -> None:
    arena = Arena.attach(_state_of(path))
    arena._ensure_row()
    with arena._locked():
        arena._slots[index] = (WRITING, arena._writer, 0, 64)
    os.kill(os.getpid(), signal.SIGKILL)


def _take_a_row_and_wait(path: str, ready: Any, done: Any, rows: Any) -> None:
    arena = Arena.attach(_state_of(path))
    arena.count(hit=True)
    rows.put(arena._row)
    ready.set()
    done.wait(60)


def test_a_dead_writer_stays_dead_when_a_new_process_takes_its_row(tmp_path: Path) -> None:
    """The pid-reuse case: a new, live process in the dead writer's place must not block it."""
    arena = open_arena(tmp_path / "a")
    ctx = mp.get_context("fork")
    dead = ctx.Process(target=_claim_slot_and_die, args=(str(tmp_path / "a"), 4))
    dead.start()
    dead.join(30)
    assert dead.exitcode == -signal.SIGKILL
    writer = int(arena._slots[4, 1])
    ready, done, rows = ctx.Event(), ctx.Event(), ctx.Queue()
    heir = ctx.Process(target=_take_a_row_and_wait, args=(str(tmp_path / "a"), ready, done, rows))
    heir.start()
    try:
        assert ready.wait(60)
        assert rows.get(timeout=30) == (writer & 0xFFFF) - 1  # the dead writer's row, reused
        assert arena.put(4, encode(sample(4), 4)) == "stored"
    finally:
        done.set()
        heir.join(30)
    arena.close()


def test_a_copy_that_raises_hands_the_slot_back_at_once(tmp_path: Path) -> None:
    arena = open_arena(tmp_path / "a")
    enc = encode(sample(1), 1)

    def fail(dest: np.ndarray[Any, Any], **_: Any) -> None:
        raise KeyboardInterrupt

    enc.write_into = fail  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        arena.put(1, enc)
    assert arena._slots[1, 0] == WRITING
    assert not arena._writer_alive(int(arena._slots[1, 1]))  # though this process lives on
    other = Arena.attach(arena.state())
    used = arena.stats()["bytes_used"]
    assert other.put(1, encode(sample(1), 1)) == "stored"
    assert arena.stats()["bytes_used"] == used  # the abandoned space was reused
    other.close()
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


def _fill_like_a_dataset(path: str, n: int, seed: int, barrier: Any, results: Any) -> None:
    """What CachedDataset does per access, over every index in a random order, twice."""
    arena = Arena.attach(_state_of(path))
    order = np.random.default_rng(seed).permutation(np.tile(np.arange(n), 2))
    barrier.wait()
    hits = misses = 0
    stored: list[int] = []
    for i in order.tolist():
        if arena.get(i) is MISSING:
            misses += 1
            arena.count(hit=False)
            if arena.put(i, encode(sample(i), i)) == "stored":
                stored.append(i)
        else:
            hits += 1
            arena.count(hit=True)
    results.put((stored, hits, misses))


@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_many_processes_filling_at_once_publish_each_index_once_and_counts_agree(
    tmp_path: Path, context: str
) -> None:
    n, procs_n = 300, 5
    arena = open_arena(tmp_path / "a", n=n)
    ctx: Any = mp.get_context(context)
    barrier, results = ctx.Barrier(procs_n), ctx.Queue()
    procs = [
        ctx.Process(
            target=_fill_like_a_dataset, args=(str(tmp_path / "a"), n, seed, barrier, results)
        )
        for seed in range(procs_n)
    ]
    for p in procs:
        p.start()
    try:
        reports = [results.get(timeout=240) for _ in procs]
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    stored = sorted(i for report in reports for i in report[0])
    assert stored == list(range(n))  # published exactly once each, none lost
    stats = arena.stats()
    assert stats["items"] == n
    assert stats["hits"] == sum(r[1] for r in reports)  # node-wide counters agree exactly
    assert stats["misses"] == sum(r[2] for r in reports)
    assert stats["hits"] + stats["misses"] == 2 * n * procs_n
    assert not (arena._slots[:, 0] == WRITING).any()
    for i in range(n):
        t, j = arena.get(i)
        assert torch.equal(t, sample(i)[0])
        assert j == i
    arena.close()


def _use_after_fork(arena: Arena, results: Any) -> None:
    arena.count(hit=True)
    results.put(arena.put(6, encode(sample(6), 6)))


@pytest.mark.slow
def test_a_fork_while_another_thread_holds_the_arena_locks_cannot_deadlock(
    tmp_path: Path,
) -> None:
    import threading

    arena = open_arena(tmp_path / "a")
    arena.count(hit=False)
    handle = arena._h
    held, release = threading.Event(), threading.Event()

    def hold_locks() -> None:
        with arena._locked(), handle.count_lock:
            held.set()
            release.wait(60)

    thread = threading.Thread(target=hold_locks)
    thread.start()
    try:
        assert held.wait(30)
        ctx = mp.get_context("fork")
        results = ctx.Queue()
        child = ctx.Process(target=_use_after_fork, args=(arena, results))
        child.start()  # forked while the other thread holds the thread locks and the flock
        assert results.get(timeout=60) == "stored"  # the child has its own locks and descriptor
        child.join(30)
        assert child.exitcode == 0
    finally:
        release.set()
        thread.join(30)
    stats = arena.stats()
    assert (stats["hits"], stats["misses"], stats["items"]) == (1, 1, 1)
    arena.close()
    assert not (tmp_path / "a").exists()  # the child never owned it: the parent's close unlinks


def _varied(i: int) -> Any:
    """Samples of several structures; some batch-decodable, some decoded one at a time."""
    kinds = [
        lambda: (torch.full((3, 4), i, dtype=torch.uint8), i % 3),  # labels differ: same layout
        lambda: {"x": torch.arange(6, dtype=torch.bfloat16) * i, "y": [i, torch.tensor(float(i))]},
        lambda: (np.arange(4, dtype=np.float32) + i, b"raw" * i),  # numpy and bytes leaves
        lambda: (torch.zeros(0, 2), torch.ones(2, requires_grad=True) * 1.0),  # empty; grad
        lambda: [torch.tensor(i, dtype=torch.int64), (), {}],  # a 0-d tensor, empty containers
    ]
    return kinds[i % len(kinds)]()


def test_a_batch_decodes_to_the_same_samples_as_one_at_a_time(tmp_path: Path) -> None:
    n = 40
    arena = open_arena(tmp_path / "a", n=n)
    for i in range(n):
        if i != 7:  # one index never published
            assert arena.put(i, encode(_varied(i), i)) == "stored"
    order = [5, 0, 10, 7, 15, 20, 1, 25, 6, 30, 11, 2, 3, 4, 39, 35]
    batch = arena.get_many(order, n)
    each = arena.get_many(order, n, how="each")  # what DataLoader workers use
    views = arena.get_many(order, n, how="views")  # what default_collate is given
    for index, got, alone, view in zip(order, batch, each, views, strict=True):
        if index == 7:
            assert got is MISSING
            assert alone is MISSING
            assert view is MISSING
        else:
            assert_same(got, arena.get(index))
            assert_same(alone, arena.get(index))
            assert_same(view, arena.get(index))
    same_layout = [0, 5, 10, 15, 20, 25, 30, 35]  # only `(uint8 tensor, label)` samples
    for index, got in zip(same_layout, arena.get_many(same_layout, n), strict=True):
        assert_same(got, (torch.full((3, 4), index, dtype=torch.uint8), index % 3))
    arena.close()


def test_samples_of_a_batch_may_be_modified_without_touching_the_cache(tmp_path: Path) -> None:
    arena = open_arena(tmp_path / "a", n=4)
    for i in range(4):
        arena.put(i, encode((torch.full((2, 2), float(i)), i), i))
    first = arena.get_many([0, 1, 2, 3], 4)
    for x, _ in first:
        x.mul_(-1).add_(100)  # an in-place transform
    again = arena.get_many([0, 1, 2, 3], 4)
    assert [float(x[0, 0]) for x, _ in again] == [0.0, 1.0, 2.0, 3.0]
    assert [float(x[0, 0]) for x, _ in first] == [100.0, 99.0, 98.0, 97.0]  # rows independent
    arena.close()


def test_past_the_decoder_cap_samples_are_decoded_one_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_structures, "_MAX_PUBLISHED", 0)  # every blob carries its text
    monkeypatch.setattr(_structures, "_MAX_DECODERS", 2)
    arena = open_arena(tmp_path / "a", n=6)
    for i in range(6):  # six labels: six structure texts, one tensor layout
        arena.put(i, encode((torch.full((2,), i, dtype=torch.int16), i), i))
    for _ in range(2):  # the second read takes the learned path for the first two
        batch = arena.get_many(list(range(6)), 6)
        for i, got in enumerate(batch):
            assert_same(got, (torch.full((2,), i, dtype=torch.int16), i))
    assert len(arena._decoders) == 2  # no decoder was built past the cap
    arena.close()
