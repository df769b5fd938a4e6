"""The timed fetcher and collate in the loading process: the dataset's time less the collate's."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from lightning_speedpack.core import stages
from lightning_speedpack.data_xray import instrument
from lightning_speedpack.data_xray.instrument import (
    CPU_READ_EVERY,
    CPU_READ_FLOOR_S,
    TimedCollate,
    TimedFetcher,
)

_COLLATE_S = 0.02


class _Fast(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((2,), float(i))


class _Stream(IterableDataset[torch.Tensor]):
    def __iter__(self) -> Any:
        return (torch.full((2,), float(i)) for i in range(10))


def _slow_collate(batch: list[torch.Tensor]) -> torch.Tensor:
    time.sleep(_COLLATE_S)
    return torch.stack(batch)


def _timed_batches(data: Any) -> tuple[list[list[float]], stages.RowSnapshot, Any]:
    loader = DataLoader(data, batch_size=4, collate_fn=TimedCollate(_slow_collate))
    table = stages.CounterTable(rows=1)
    rec = stages.activate(table, 0)
    try:
        it = iter(loader)
        it._dataset_fetcher = TimedFetcher(it._dataset_fetcher)
        batches = [b[:, 0].tolist() for b in it]
    finally:
        stages.deactivate()
    return batches, table.read()[0], rec


def test_the_fetch_leaves_out_the_collate_it_runs() -> None:
    batches, row, rec = _timed_batches(_Fast())
    assert batches == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0], [8.0, 9.0]]
    assert (row.samples, row.batches) == (10.0, 3.0)
    assert row.collate_seconds >= 3 * _COLLATE_S
    # the collate sleeps inside the fetch: none of its seconds are the dataset's
    assert row.fetch_seconds < row.collate_seconds / 2
    # the recorder's own collate totals are the row's (the fetcher reads them twice a batch)
    assert (rec.collate_s, rec.collates) == (row.collate_seconds, 3)


def test_a_streams_short_last_batch_counts_the_samples_collated() -> None:
    batches, row, _ = _timed_batches(_Stream())
    assert [len(b) for b in batches] == [4, 4, 2]
    assert (row.samples, row.batches) == (10.0, 3.0)
    assert row.fetch_seconds < row.collate_seconds / 2


class _Clocks:
    """A wall clock and a compute clock that a fake fetch moves: no timing on a busy machine."""

    def __init__(self) -> None:
        self.now = self.computed = 0.0
        self.reads = 0  # compute-clock reads (two a fetch read)

    def wall(self) -> float:
        return self.now

    def compute(self) -> float:
        self.reads += 1
        return self.computed


class _Fetch:
    """A torch fetcher whose fetch takes ``seconds``, ``share`` of them computing."""

    auto_collation = True

    def __init__(self, clocks: _Clocks) -> None:
        self.clocks, self.seconds, self.share = clocks, 1e-4, 0.5

    def fetch(self, index: list[int]) -> list[int]:
        self.clocks.now += self.seconds
        self.clocks.computed += self.seconds * self.share
        return index


def test_a_fast_fetchs_compute_time_is_sampled_and_a_slow_ones_read_every_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clocks = _Clocks()
    monkeypatch.setattr(instrument, "_clock", clocks.wall)
    inner = _Fetch(clocks)
    fetcher = TimedFetcher(inner)
    fetcher._cpu = clocks.compute  # the schedstat reads, counted
    table = stages.CounterTable(rows=1)
    stages.activate(table, 0)
    try:
        for _ in range(CPU_READ_EVERY + 1):  # fast: the first of each CPU_READ_EVERY is read
            fetcher.fetch([0, 1])
        fast_reads = clocks.reads
        inner.share = 0.25  # computing less: charged at the share last read until one is read
        fetcher.fetch([0, 1])
        inner.seconds = 2 * CPU_READ_FLOOR_S  # slow, not read: it has the next ones read
        for _ in range(3):
            fetcher.fetch([0, 1])
        slow_reads = clocks.reads - fast_reads
    finally:
        stages.deactivate()
    row = table.read()[0]
    assert (fast_reads, slow_reads) == (2 * 2, 2 * 2)  # two compute-clock reads a fetch read
    assert row.samples == 2 * (CPU_READ_EVERY + 5)
    # every fetch's compute time is charged: measured, or at the share last measured
    fast_s, slow_s = (CPU_READ_EVERY + 2) * 1e-4, 3 * 2 * CPU_READ_FLOOR_S
    charged = (fast_s + 2 * CPU_READ_FLOOR_S) * 0.5 + 2 * 2 * CPU_READ_FLOOR_S * 0.25
    assert row.fetch_cpu_seconds == pytest.approx(charged)
    assert row.fetch_seconds == pytest.approx(fast_s + slow_s)
