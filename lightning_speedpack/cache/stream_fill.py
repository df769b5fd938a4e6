"""A stream cache's first pass, kept inside the arena: which shard is stored how far, and done.

The arena's stream half (:class:`~lightning_speedpack.cache.arena.Arena` inherits it): the
filling configuration fixed by the first process that joins, each shard's stored position and
state, whether the cache is complete or was cut by the budget, and each process's pass count.
All of it lives in the shared file, so every worker and rank of the node sees the same.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from lightning_speedpack.cache.arena_file import (
    _COMPLETE,
    _FILL_EXPECTED,
    _FILL_WORKERS,
    _NEXT,
    MAX_FILLERS,
    READY,
)

__all__ = ["StreamFill"]


class StreamFill:
    """The first-pass bookkeeping of a stream cache (a part of the arena, over its header)."""

    _words: np.ndarray[Any, Any]
    _fillers: np.ndarray[Any, Any]
    _slots: np.ndarray[Any, Any]

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        raise NotImplementedError

    def join_fill(self, filler: int, expected: int, workers: int) -> bool:
        """Take part in filling as shard ``filler`` of ``expected`` (``workers`` per rank).

        The first caller fixes the configuration; returns False for a caller with another
        one (it must not fill: its shards would not match).
        """
        with self._locked():
            words = self._words
            if words[_FILL_EXPECTED] == 0:
                words[_FILL_EXPECTED], words[_FILL_WORKERS] = expected, workers
            same = (int(words[_FILL_EXPECTED]), int(words[_FILL_WORKERS])) == (expected, workers)
            return same and 0 <= filler < min(expected, MAX_FILLERS)

    def fill_position(self, filler: int) -> int:
        """How many items of shard ``filler`` are stored (or were passed over by the budget)."""
        return int(self._fillers[filler, 0])

    def set_fill_position(self, filler: int, position: int) -> None:
        """Record progress of shard ``filler`` (only its own filler writes it)."""
        self._fillers[filler, 0] = position

    def fill_done(self, filler: int) -> int:
        """0 while shard ``filler`` is being filled, 1 when complete, 2 when the budget cut it."""
        return int(self._fillers[filler, 1])

    def finish_fill(self, filler: int, *, cut: bool) -> None:
        """Mark shard ``filler`` done; the cache is complete when every expected shard is."""
        with self._locked():
            self._fillers[filler, 1] = 2 if cut else 1
            expected = int(self._words[_FILL_EXPECTED])
            if expected and np.all(self._fillers[: min(expected, MAX_FILLERS), 1] != 0):
                self._words[_COMPLETE] = 1

    def fill_config(self) -> tuple[int, int]:
        """The filling configuration: (expected shards, workers per rank); (0, 0) before."""
        return int(self._words[_FILL_EXPECTED]), int(self._words[_FILL_WORKERS])

    @property
    def complete(self) -> bool:
        """Whether every shard of the first pass is stored (a stream cache)."""
        return bool(self._words[_COMPLETE])

    @property
    def cut(self) -> bool:
        """Whether the budget cut some shard (its tail is only in the source)."""
        expected = min(int(self._words[_FILL_EXPECTED]), MAX_FILLERS)
        return bool(np.any(self._fillers[:expected, 1] == 2))

    def next_pass(self, consumer: int) -> int:
        """The number of passes ``consumer`` started before this one (the epoch it serves)."""
        with self._locked():
            row = self._fillers[consumer % MAX_FILLERS]
            passes = int(row[2])
            row[2] = passes + 1
            return passes

    def ready_items(self) -> np.ndarray[Any, Any]:
        """The published slots of a stream cache, in the order they were appended."""
        return np.flatnonzero(self._slots[: int(self._words[_NEXT]), 0] == READY)
