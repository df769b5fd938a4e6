"""Batch sizes and bytes for the batch types people train on (PyG, TensorDict, dataclasses...)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import pytest
import torch

from lightning_speedpack.core.batch import (
    BatchSize,
    BatchSizeError,
    BatchSizer,
    batch_bytes,
    infer_batch_size,
    read_batch_size,
)


def _pyg_batch(graphs: int = 5) -> Any:
    data = pytest.importorskip("torch_geometric.data")
    items = [
        data.Data(
            x=torch.randn(3 + i, 4),
            edge_index=torch.zeros(2, 6, dtype=torch.long),
            y=torch.tensor([i % 2]),
        )
        for i in range(graphs)
    ]
    return data.Batch.from_data_list(items)


def test_a_pyg_batch_counts_graphs_not_nodes() -> None:
    batch = _pyg_batch(5)
    assert batch.x.shape[0] == 3 + 4 + 5 + 6 + 7  # the first tensor counts nodes
    size = read_batch_size(batch)
    assert (size.n, size.unit) == (5, "graphs")
    assert size.source == "DataBatch.num_graphs"
    assert read_batch_size((batch, {"extra": torch.zeros(9)})).n == 5  # nested too


def test_a_pyg_batch_bytes_are_its_attribute_tensors() -> None:
    batch = _pyg_batch(5)
    expected = sum(t.nelement() * t.element_size() for t in batch.to_dict().values())
    assert expected > 0
    assert batch_bytes(batch) == expected  # x, edge_index, y, batch, ptr


def test_neighbor_loader_style_data_counts_seed_nodes() -> None:
    data = pytest.importorskip("torch_geometric.data")
    sub = data.Data(x=torch.randn(40, 4), edge_index=torch.zeros(2, 10, dtype=torch.long))
    sub.batch_size = 8  # what NeighborLoader sets: the seed nodes come first
    assert read_batch_size(sub) == BatchSize(8, "nodes", "Data.batch_size (seed nodes)")


def test_tensordict_uses_its_batch_dimension() -> None:
    tensordict = pytest.importorskip("tensordict")
    td = tensordict.TensorDict({"obs": torch.zeros(6, 3, 7), "r": torch.zeros(6, 3)}, [6, 3])
    assert read_batch_size(td).n == 6
    assert batch_bytes(td) == (6 * 3 * 7 + 6 * 3) * 4


def test_objects_dataclasses_and_named_tuples() -> None:
    class Custom:
        def __init__(self) -> None:
            self.batch_size = 12
            self.tokens = torch.zeros(12 * 128, dtype=torch.long)  # flat: dim 0 is not it

    @dataclass
    class Pair:
        name: str
        x: torch.Tensor

    class Sample(NamedTuple):
        x: torch.Tensor
        y: torch.Tensor

    assert read_batch_size(Custom()) == BatchSize(12, "samples", "Custom.batch_size")
    assert infer_batch_size(Pair("a", torch.zeros(7, 2))) == 7
    assert batch_bytes(Pair("a", torch.zeros(7, 2))) == 56
    assert infer_batch_size(Sample(torch.zeros(4, 2), torch.zeros(4))) == 4


def test_nothing_sizable_raises_with_the_arguments_that_supply_it() -> None:
    with pytest.raises(BatchSizeError, match=r"self\.log\(\.\.\., batch_size=n\)") as info:
        read_batch_size({"names": ["a", "b"]})
    assert "batch_size_fn" in str(info.value)
    with pytest.raises(BatchSizeError):
        infer_batch_size(torch.tensor(3.0))  # 0-d


def test_the_sizer_falls_back_on_the_logged_size_then_counts_batches() -> None:
    logged: list[int | None] = [None]
    sizer = BatchSizer(logged=lambda: logged[0])
    assert sizer((torch.zeros(8, 2), torch.zeros(8))) == 8
    logged[0] = 5
    assert sizer({"names": ["a"] * 5}) == 5
    assert (sizer.unit, sizer.source) == ("samples", "self.log(..., batch_size=...)")
    logged[0] = None
    assert sizer({"names": ["a"] * 5}) == 1  # counts the batch
    assert sizer.unit == "batches"
    assert sizer.unsized_batches == 1
    assert sizer.not_measured is not None
    assert "dict" in sizer.not_measured


def test_a_strict_sizer_raises() -> None:
    with pytest.raises(BatchSizeError):
        BatchSizer(strict=True)({"names": ["a"]})
