"""The timed fetcher and collate in the loading process: the dataset's time less the collate's."""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from lightning_speedpack.core import stages
from lightning_speedpack.data_xray.instrument import TimedCollate, TimedFetcher

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
