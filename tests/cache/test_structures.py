"""Structure texts kept once per arena (issue 38): bytes stored, exact round trips, old files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_speedpack.cache import structures as _structures
from lightning_speedpack.cache.arena import Arena
from lightning_speedpack.cache.arena_file import _NSTRUCT, _VERSION
from lightning_speedpack.cache.cached_dataset import CachedDataset
from lightning_speedpack.cache.codec import encode
from tests.helpers.samples import assert_same

TOKENS = 96


class Tokens(Dataset[torch.Tensor]):
    """Issue 38's samples: 96 int64 tokens each, one structure for all."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.arange(i, i + TOKENS, dtype=torch.int64)


class Mixed(Dataset[Any]):
    """Samples whose structures differ: a label per class, shapes that vary, a dict now and then."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if i % 7 == 6:
            return {"ids": torch.arange(i % 5 + 1), "name": f"s{i}", "w": np.float32(i / 3)}
        x = torch.full((2, 3), float(i))
        if i % 3 == 2:
            x = torch.full((i % 4 + 1,), i, dtype=torch.int16)  # a shape of its own
        return x, i % 4  # the label lives in the structure text


def _arena(path: Path, n: int) -> Arena:
    return Arena.open(str(path), fingerprint=b"s" * 32, n_slots=n, capacity=1 << 22, kind="disk")


def test_samples_of_one_structure_take_their_payload_and_one_text(tmp_path: Path) -> None:
    """Issue 38: every blob carried its own 64-byte structure header, 832 bytes for 768."""
    n = 500
    with CachedDataset(Tokens(n), storage="disk", path=tmp_path / "c", max_bytes=1 << 22) as c:
        c.fill(processes=0)
        used = c.cache_info().bytes_used
        assert_same(c[7], torch.arange(7, 7 + TOKENS))
    assert n * TOKENS * 8 <= used <= n * TOKENS * 8 + 64  # the one text, padded to 64 bytes


@pytest.mark.parametrize("how", ["one", "each", "together", "views"])
def test_mixed_structures_round_trip_exactly(tmp_path: Path, how: str) -> None:
    data = Mixed(40)
    arena = _arena(tmp_path / "a", len(data))
    for i in range(len(data)):
        assert arena.put(i, encode(data[i], i)) == "stored"
    indices = [5, 0, 13, 2, 6, 39, 1, 20, 3]
    if how == "one":
        got = [arena.get(i) for i in indices]
    else:
        got = arena.get_many(indices, len(data), how=how)  # type: ignore[arg-type]
    for i, sample in zip(indices, got, strict=True):
        assert_same(sample, data[i])
    arena.close()


def test_texts_past_the_table_are_stored_with_their_blob(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fallback: a structure the full table has no room for is kept in its blob."""
    monkeypatch.setattr(_structures, "_MAX_PUBLISHED", 2)
    data = Mixed(30)
    arena = _arena(tmp_path / "a", len(data))
    for i in range(len(data)):
        arena.put(i, encode(data[i], i))
    assert int(arena._words[_NSTRUCT]) == 2
    whole = [i for i in range(len(data)) if not arena._slots[i, 3] >> 48]
    assert len(whole) > len(data) // 2  # most samples took the fallback
    for how in ("each", "together", "views"):
        batch = arena.get_many(list(range(len(data))), len(data), how=how)  # type: ignore[arg-type]
        for i, sample in enumerate(batch):
            assert_same(sample, data[i])
    for i in whole:
        assert_same(arena.get(i), data[i])
    arena.close()


def test_processes_filling_together_publish_each_structure_once(tmp_path: Path) -> None:
    data = Mixed(200)
    with CachedDataset(data, storage="disk", path=tmp_path / "c", max_bytes=1 << 22) as c:
        c.fill(processes=2)
        arena = c._arena
        assert arena is not None
        texts = [arena._structure_text(k) for k in range(int(arena._words[_NSTRUCT]))]
        assert len(texts) == len(set(texts)) == len({encode(data[i]).text for i in range(200)})
        batches = DataLoader(c, batch_size=16, num_workers=2, collate_fn=list)
        for i, sample in enumerate(s for batch in batches for s in batch):
            assert_same(sample, data[i])


def test_a_disk_cache_of_the_old_format_is_rebuilt_not_misread(tmp_path: Path) -> None:
    """A file whose blobs each carry their text (format 3) must not be read as data only."""
    path = tmp_path / "c"
    with CachedDataset(Tokens(8), storage="disk", path=path, max_bytes=1 << 20) as c:
        c.fill(processes=0)
    words = np.memmap(path, dtype=np.int64, mode="r+", shape=(64,))
    words[_VERSION] = 3  # as the previous release wrote it
    words.flush()
    del words
    with CachedDataset(Tokens(8), storage="disk", path=path, max_bytes=1 << 20) as c:
        assert c._arena is not None
        assert c._arena.created
        assert c.cache_info().items == 0
        assert_same(c[3], torch.arange(3, 3 + TOKENS))
    with CachedDataset(Tokens(8), storage="disk", path=path, max_bytes=1 << 20) as c:
        assert c._arena is not None
        assert not c._arena.created
        assert c.cache_info().items == 1
