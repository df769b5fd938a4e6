"""CachedDataset over a stream (CachedStream): fill in the first pass, serve later passes."""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from lightning_speedpack.cache.cached_dataset import CacheBudgetWarning, CachedDataset
from lightning_speedpack.cache.stream import CachedStream
from tests.helpers.ddp import run_ddp


def shm_entries() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("speedpack-")}


@pytest.fixture(autouse=True)
def _no_leftovers() -> Any:
    before = shm_entries()
    yield
    assert {n for n in shm_entries() - before if f"pid{os.getpid()}" in n} == set()


class SlowStream(IterableDataset[dict[str, Any]]):
    """Items 0..n-1, each after a short sleep; splits itself across ranks and workers."""

    def __init__(self, n: int, log: str | None = None, sleep: float = 0.0) -> None:
        self.n = n
        self.log = log
        self.sleep = sleep

    def __iter__(self) -> Any:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        shard, shards = rank * workers + worker, world * workers
        for i in range(shard, self.n, shards):
            if self.sleep:
                time.sleep(self.sleep)
            if self.log is not None:
                with open(self.log, "a") as f:
                    f.write(f"{i}\n")
            yield {"x": torch.full((4,), i, dtype=torch.int64), "i": i}


def ids(batches: list[Any]) -> list[int]:
    return [int(i) for b in batches for i in b["i"]]


def source_calls(log: Path) -> int:
    return len(log.read_text().split()) if log.exists() else 0


@pytest.mark.parametrize("workers", [0, 2])
def test_slow_stream_cached_then_served_without_the_source(tmp_path: Path, workers: int) -> None:
    log = tmp_path / "source.txt"
    cached = CachedDataset(SlowStream(512, str(log), sleep=0.002), shuffle=True, max_bytes=8 << 20)
    assert isinstance(cached, CachedStream)
    try:
        loader = DataLoader(
            cached,
            batch_size=16,
            num_workers=workers,
            multiprocessing_context="fork" if workers else None,
        )
        epochs = [ids(list(loader)) for _ in range(3)]
        assert source_calls(log) == 512  # epochs 2 and 3 never called the source
        for seen in epochs:
            assert sorted(seen) == list(range(512))  # every item exactly once per epoch
        assert epochs[1] != epochs[2]  # reshuffled each epoch
        info = cached.cache_info()
        assert (info.misses, info.hits, info.items) == (512, 1024, 512)
        assert cached.complete
    finally:
        cached.close()


@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffled", "in-order"])
@pytest.mark.parametrize("side", ["main-process", "half-a-pass"])
def test_a_second_reader_never_makes_a_pass_repeat_or_skip_an_item(
    shuffle: bool, side: str
) -> None:
    """A second reader of the same cache (another DataLoader, a probe) between and during the
    fit's passes: each pass of the fit's own 2-worker loader still yields every item once."""
    cached = CachedDataset(SlowStream(96), shuffle=shuffle, seed=3, max_bytes=8 << 20)
    try:
        fit = DataLoader(cached, batch_size=8, num_workers=2, multiprocessing_context="fork")
        passes = [ids(list(fit))]  # fills the cache
        for _epoch in range(3):
            if side == "main-process":  # counts a pass for worker 0's slot only
                other = [s["i"] for s in cached]
            else:  # a 2-worker reader stopped after 3 batches (as a probe does)
                reader = iter(
                    DataLoader(cached, batch_size=8, num_workers=2, multiprocessing_context="fork")
                )
                other = ids([next(reader) for _ in range(3)])
                del reader
            assert len(other) == len(set(other))
            passes.append(ids(list(fit)))
        for seen in passes:
            assert sorted(seen) == list(range(96))  # every item exactly once per pass
        assert cached.cache_info().misses == 96  # the source was read once
    finally:
        cached.close()


def test_transform_runs_on_every_pass_after_the_cache() -> None:
    with CachedStream(SlowStream(8), transform=lambda s: s["i"] * 10, max_bytes=1 << 20) as c:
        assert list(c) == [i * 10 for i in range(8)]
        assert sorted(c) == [i * 10 for i in range(8)]


def test_budget_passes_the_rest_through_with_one_warning_and_serves_all_later() -> None:
    with CachedStream(SlowStream(30), max_items=10, max_bytes=1 << 20) as cached:
        with pytest.warns(CacheBudgetWarning, match="budget") as record:
            first = [s["i"] for s in cached]
        assert len(record) == 1
        assert first == list(range(30))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            second = [s["i"] for s in cached]
        assert sorted(second) == list(range(30))  # 10 from the cache, 20 from the source
        info = cached.cache_info()
        assert (info.items, info.hits, info.misses, info.budget_exhausted) == (10, 10, 50, True)


def test_a_first_pass_cut_short_is_resumed_without_duplicates() -> None:
    with CachedStream(SlowStream(20), max_bytes=1 << 20) as cached:
        for s in cached:
            if s["i"] == 6:
                break
        assert not cached.complete
        assert [s["i"] for s in cached] == list(range(20))  # resumed at 7: nothing stored twice
        assert cached.complete
        assert cached.cache_info().items == 20
        assert sorted(s["i"] for s in cached) == list(range(20))


def test_pickled_copy_serves_the_same_cache() -> None:
    import pickle

    with CachedStream(SlowStream(6), max_bytes=1 << 20) as cached:
        list(cached)
        copy = pickle.loads(pickle.dumps(cached))
        assert sorted(s["i"] for s in copy) == list(range(6))
        assert cached.cache_info().hits == 6
        copy.close()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"max_items": 0}, ValueError, "`max_items` must be a positive int, got 0"),
        ({"max_items": 1.5}, TypeError, "`max_items` must be an int or None, got float"),
        ({"shuffle": 1}, TypeError, "`shuffle` must be a bool, got int"),
        ({"seed": "a"}, TypeError, "`seed` must be an int, got str"),
        ({"wait_timeout": -1}, ValueError, "`wait_timeout` must be >= 0"),
        ({"max_bytes": -1}, ValueError, "`max_bytes` must be a positive int"),
    ],
)
def test_arguments_are_validated(kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        CachedStream(SlowStream(3), **kwargs)
    with pytest.raises(TypeError, match="IterableDataset"):
        CachedStream([1, 2])  # type: ignore[arg-type]


# --------------------------------------------------------------------------------- real DDP
def _ddp_rank(log: str) -> tuple[int, list[list[int]], str]:
    torch.distributed.init_process_group("gloo")
    try:
        cached = CachedDataset(SlowStream(512, log), shuffle=True, seed=3, max_bytes=8 << 20)
        loader = DataLoader(cached, batch_size=16, num_workers=2, multiprocessing_context="fork")
        epochs = []
        for _ in range(3):
            epochs.append(ids(list(loader)))
            torch.distributed.barrier()
        path = str(cached.cache_path)
        torch.distributed.barrier()
        cached.close()
        return torch.distributed.get_rank(), epochs, path
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_ddp_ranks_and_two_workers_each_see_every_item_once_per_epoch(tmp_path: Path) -> None:
    log = tmp_path / "source.txt"
    (r0, epochs0, path0), (r1, epochs1, path1) = run_ddp(_ddp_rank, str(log), timeout=200)
    assert (r0, r1) == (0, 1)
    assert path0 == path1  # one arena for the node
    assert source_calls(log) == 512  # only the first epoch read the source
    for a, b in zip(epochs0, epochs1, strict=True):
        assert sorted(a + b) == list(range(512))  # no duplicates across ranks and workers
    # Each rank serves the same share every pass (fixed by the seed, so a second reader can
    # never unbalance the split), in an order drawn anew each pass.
    assert set(epochs0[1]) == set(epochs0[2])
    assert epochs0[1] != epochs0[2]
    assert not os.path.exists(path0)


class Rows(IterableDataset[tuple[torch.Tensor, int]]):
    """Twelve (row, label) items, the same every pass."""

    def __iter__(self) -> Any:
        return ((torch.full((6,), i, dtype=torch.int64), i) for i in range(12))


def test_a_later_pass_batched_by_default_collate_reads_views_not_copies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Epoch 2 under torch's batching: every item a view that ``default_collate`` copies once.

    Issue 38: the stream decoded each item into tensors of its own (a copy) that the collate then
    copied again, where a ``TensorDataset`` is copied once; its epoch 2 ran 1.34-1.40x the
    ``TensorDataset``'s.
    """
    import lightning_speedpack.cache.structures as arena_module

    made: list[int] = []
    real = arena_module.leaf_views

    def counting(flat: torch.Tensor, bases: list[int], leaf: Any) -> Any:
        made.append(len(bases))
        return real(flat, bases, leaf)

    monkeypatch.setattr(arena_module, "leaf_views", counting)
    with CachedStream(Rows(), max_bytes=1 << 20) as cached:
        first = list(DataLoader(cached, batch_size=5))
        assert made == []  # the first pass streams from the source
        second = list(DataLoader(cached, batch_size=5))
        assert sum(made) == 12  # every cached item read as a view, in one pass over the arena
        assert [b[0].tolist() for b in second] == [b[0].tolist() for b in first]
        info = cached.cache_info()
        assert (info.misses, info.hits) == (12, 12)


@pytest.mark.parametrize("loader", ["unbatched", "own collate", "direct"])
def test_an_item_handed_on_as_is_is_a_copy_of_its_own(loader: str) -> None:
    """Without torch's batching into default_collate, an item may be modified in place."""
    with CachedStream(Rows(), max_bytes=1 << 20) as cached:
        list(cached)  # first pass: fills
        if loader == "unbatched":
            items = list(DataLoader(cached, batch_size=None))
        elif loader == "own collate":
            items = [b[0] for b in DataLoader(cached, batch_size=1, collate_fn=list)]
        else:
            items = list(cached)
        for row, _ in items:
            row.fill_(-1)
        again = sorted(int(row[0]) for row, _ in cached)
        assert again == list(range(12))
