"""What a cache object is besides its reads: a handle on a node's arena.

Both caches pickle as a reference to the arena (a ``spawn`` worker or a DDP rank re-attaches the
same file instead of copying the data), report the node's counts, release the arena on
:meth:`close` and work as context managers.
"""

from __future__ import annotations

import warnings
from typing import Any

from typing_extensions import Self

from lightning_speedpack.cache.arena import Arena
from lightning_speedpack.cache.options import CacheBudgetWarning, CacheInfo

__all__ = ["ArenaHandle"]


class ArenaHandle:
    """Base of the caches: an ``_arena`` that pickles by reference and can be released."""

    _arena: Arena | None

    def cache_info(self) -> CacheInfo:
        """Hits, misses, items, bytes used, capacity, budget state: summed over the node."""
        if self._arena is None or self._arena.closed:
            return CacheInfo(0, 0, 0, 0, 0, False)
        stats = self._arena.stats()
        return CacheInfo(
            hits=stats["hits"],
            misses=stats["misses"],
            items=stats["items"],
            bytes_used=stats["bytes_used"],
            capacity_bytes=stats["capacity_bytes"],
            budget_exhausted=bool(stats["budget_exhausted"]),
        )

    @property
    def cache_path(self) -> str | None:
        """The file that holds the arena (in ``/dev/shm`` for shared storage)."""
        return None if self._arena is None else self._arena.path

    def close(self) -> None:
        """Release the arena now (it is also released at exit); later reads pass through."""
        if self._arena is not None:
            self._arena.close()
            self._arena = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        arena = state.pop("_arena")
        state["_arena_state"] = None if arena is None or arena.closed else arena.state()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        arena_state = state.pop("_arena_state")
        self.__dict__.update(state)
        self._arena = None
        if arena_state is not None:
            try:
                self._arena = Arena.attach(arena_state)
            except FileNotFoundError as err:
                warnings.warn(
                    f"{type(self).__name__} could not re-attach its cache ({err}); samples pass "
                    "through uncached in this process",
                    CacheBudgetWarning,
                    stacklevel=2,
                )
