"""The run's settings the wall-time findings read, and the epoch-start finding they shape."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_speedpack.wall_time.findings import _epoch_starts
from lightning_speedpack.wall_time.settings import RunSettings, _start_method


def _loader(**kwargs: object) -> DataLoader[tuple[torch.Tensor, ...]]:
    return DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=4, **kwargs)  # type: ignore[arg-type]


def test_the_workers_start_method_is_the_loaders_context_or_the_default() -> None:
    assert _start_method(_loader()) is None  # no workers: nothing starts
    assert _start_method(_loader(num_workers=2, multiprocessing_context="spawn")) == "spawn"
    assert _start_method(_loader(num_workers=2, multiprocessing_context="fork")) == "fork"
    default = torch.multiprocessing.get_context().get_start_method()
    assert _start_method(_loader(num_workers=2)) == default


def _ledger(starts: list[float]) -> SimpleNamespace:
    return SimpleNamespace(epoch_starts=starts, seconds=lambda: {"epoch_start": sum(starts)})


def test_a_first_epoch_start_paid_once_by_spawned_workers_is_named_so() -> None:
    # What a short fit with 2 persistent workers started by "spawn" measured: 4.2 s, then 4 ms.
    spawned = RunSettings(workers=2, persistent_workers=True, worker_start="spawn")
    (finding,) = _epoch_starts(_ledger([4.2456, 0.004]), 0.79, spawned)
    assert "(4.2 s over 2 epochs): the first epoch's first batch took 4.2 s (the second 4 ms)" in (
        finding.message
    )
    assert "once per fit: its 2 DataLoader workers start with 'spawn'" in finding.message
    assert "paid once per epoch" not in finding.message  # what it said before
    assert "multiprocessing_context='fork'" in (finding.fix or "")
    forked = RunSettings(workers=2, persistent_workers=True, worker_start="fork")
    (finding,) = _epoch_starts(_ledger([4.2456, 0.004]), 0.79, forked)
    assert finding.message.endswith("once per fit")
    assert "first item cheap" in (finding.fix or "")


def test_a_start_paid_at_every_epoch_without_workers_is_the_loaders_first_batch() -> None:
    (finding,) = _epoch_starts(_ledger([0.5, 0.5, 0.5]), 0.3, RunSettings())
    assert finding.message.endswith("the loader's first batch, paid once per epoch")
