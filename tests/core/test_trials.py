"""Trial machinery: batches drawn in this process, the loaders put back as they were."""

from __future__ import annotations

from typing import Any

import pytest
from torch.utils.data import DataLoader

from lightning_speedpack.core.trials import iterate_batches, main_process_loading


def _loader(workers: int) -> DataLoader[Any]:
    return DataLoader(list(range(8)), batch_size=4, num_workers=workers)


def test_nested_loaders_load_in_this_process_and_are_put_back() -> None:
    a, b, c = _loader(2), _loader(0), _loader(1)
    other = [[1, 2], [3, 4]]  # not a DataLoader: left as it is
    loaders = {"a": a, "rest": [b, (c, other)]}
    with main_process_loading(loaders) as inside:
        assert inside is loaders
        assert (a.num_workers, b.num_workers, c.num_workers) == (0, 0, 0)
        assert [batch.tolist() for batch in iterate_batches(a)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert next(iterate_batches(c)).tolist() == [0, 1, 2, 3]
    assert (a.num_workers, b.num_workers, c.num_workers) == (2, 0, 1)


def test_loaders_are_put_back_after_an_error() -> None:
    loader = _loader(2)
    with pytest.raises(KeyError), main_process_loading(loader):
        raise KeyError("in the trial")
    assert loader.num_workers == 2
