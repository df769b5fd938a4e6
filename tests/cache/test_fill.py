"""CachedDataset.fill: decode before training in processes that exit, nothing decoded twice."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_speedpack.cache.cached_dataset import CacheBudgetWarning, CachedDataset
from lightning_speedpack.cache.fill import FillResult, RemoteTraceback, missing_indices


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


class Logged(Dataset[Any]):
    """Samples of varying shapes; each decode appends ``pid index`` to a file."""

    def __init__(self, log: Path, n: int = 40, fail_at: int = -1, kill_at: int = -1) -> None:
        self.log, self.n, self.fail_at, self.kill_at = log, n, fail_at, kill_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if i == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if i == self.fail_at:
            raise KeyError(f"no sample {i}")
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()} {i}\n")
        return torch.full((3, 2 + i % 5), i, dtype=torch.int16), i % 4

    def decodes(self) -> list[tuple[int, int]]:
        if not self.log.exists():
            return []
        return [tuple(map(int, line.split())) for line in self.log.read_text().splitlines()]


def test_fill_decodes_each_sample_once_outside_this_process_and_epoch_one_only_hits(
    tmp_path: Path,
) -> None:
    base = Logged(tmp_path / "log")
    before = children()
    with CachedDataset(base, max_bytes=1 << 20) as cached:
        assert cached.fill(processes=2) == FillResult(decoded=40, budget_exhausted=False)
        decodes = base.decodes()
        assert sorted(i for _, i in decodes) == list(range(40))
        pids = {pid for pid, _ in decodes}
        assert len(pids) == 2
        assert os.getpid() not in pids
        assert children() <= before  # and they are gone
        batches = list(DataLoader(cached, batch_size=8, num_workers=2, collate_fn=list))
        assert len(base.decodes()) == 40  # epoch 1 decoded nothing
        info = cached.cache_info()
        assert (info.items, info.hits) == (40, 40)
        fresh = Logged(tmp_path / "unused")
        for i, (x, y) in enumerate(sample for batch in batches for sample in batch):
            want_x, want_y = fresh[i]
            assert torch.equal(x, want_x)
            assert y == want_y
        assert cached.fill() == FillResult(decoded=0, budget_exhausted=False)  # nothing missing


def test_fill_in_this_process_and_what_a_loader_already_cached_is_skipped(tmp_path: Path) -> None:
    base = Logged(tmp_path / "log", n=12)
    with CachedDataset(base, max_bytes=1 << 20) as cached:
        cached[3], cached[7]
        assert cached.fill(processes=0) == FillResult(decoded=10, budget_exhausted=False)
        assert {pid for pid, _ in base.decodes()} == {os.getpid()}
        assert sorted(i for _, i in base.decodes()) == list(range(12))


def test_a_failing_sample_raises_here_with_the_fill_process_traceback(tmp_path: Path) -> None:
    base = Logged(tmp_path / "log", n=30, fail_at=21)
    before = children()
    with CachedDataset(base, max_bytes=1 << 20) as cached:
        with pytest.raises(KeyError, match="no sample 21") as err:
            cached.fill(processes=2)
        assert isinstance(err.value.__cause__, RemoteTraceback)
        assert "__getitem__" in str(err.value.__cause__)
        assert children() <= before
        published = cached.cache_info().items
        assert 0 < published < 30
        assert int(cached[0][1]) == 0  # what was published reads back; the rest fills on access


def test_a_killed_fill_process_is_reported_and_the_cache_stays_usable(tmp_path: Path) -> None:
    base = Logged(tmp_path / "log", n=20, kill_at=9)
    before = children()
    with CachedDataset(base, max_bytes=1 << 20) as cached:
        with pytest.raises(RuntimeError, match="died with exit code -9"):
            cached.fill(processes=2)
        assert children() <= before
        base.kill_at = -1
        x, y = cached[9]  # the dead process's sample: decoded on access
        assert torch.equal(x, torch.full((3, 6), 9, dtype=torch.int16))
        assert y == 1


def test_fill_stops_at_the_budget_and_warns_once(tmp_path: Path) -> None:
    base = Logged(tmp_path / "log", n=200)
    with CachedDataset(base, max_bytes=4096) as cached:
        with pytest.warns(CacheBudgetWarning, match="CachedDataset.fill reached its budget"):
            result = cached.fill(processes=2)
        assert result.budget_exhausted
        assert result.decoded < 200
        assert cached.cache_info().items < 200


@pytest.mark.parametrize(
    ("processes", "error", "match"),
    [
        (1.5, TypeError, "`processes` must be an int or None"),
        (True, TypeError, "got bool"),
        (-1, ValueError, "must be >= 0"),
    ],
)
def test_bad_processes_are_refused(tmp_path: Path, processes: Any, error: Any, match: str) -> None:
    with (
        CachedDataset(Logged(tmp_path / "log"), max_bytes=1 << 20) as cached,
        pytest.raises(error, match=match),
    ):
        cached.fill(processes)


def test_ranks_filling_at_once_start_at_different_places(tmp_path: Path) -> None:
    with CachedDataset(Logged(tmp_path / "log", n=10), max_bytes=1 << 20) as cached:
        cached[0], cached[1]
        assert cached._arena is not None
        assert missing_indices(cached._arena, 10) == list(range(2, 10))
        assert missing_indices(cached._arena, 10, local_rank=1, local_size=2) == [
            6,
            7,
            8,
            9,
            2,
            3,
            4,
            5,
        ]
