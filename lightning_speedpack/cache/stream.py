"""``CachedStream``: cache a stream (``IterableDataset``) in its first pass, serve it from RAM.

``CachedDataset(stream)`` returns one, so the guide's pattern -- cache the first N samples of a
WebDataset stream -- is one line; the class is also importable under its own name.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from itertools import islice
from types import FrameType
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import IterableDataset, default_collate, get_worker_info
from torch.utils.data._utils.fetch import _IterableDatasetFetcher

from lightning_speedpack.cache.arena import MISSING, Arena
from lightning_speedpack.cache.arena_file import MAX_FILLERS
from lightning_speedpack.cache.codec import encode
from lightning_speedpack.cache.handle import ArenaHandle
from lightning_speedpack.cache.options import (
    TRANSFORM_STAGE,
    CacheBudgetWarning,
    budget_warning,
    check_options,
    dataset_fingerprint,
    open_arena,
)
from lightning_speedpack.core.stages import CACHE_HIT_STAGE, CACHE_MISS_STAGE, record_stage, stage
from lightning_speedpack.core.stages import active as stages_active

__all__ = ["DEFAULT_MAX_ITEMS", "CachedStream", "local_topology"]

#: Slots of a stream cache whose stream has no ``len`` and no ``max_items`` (32 bytes each,
#: allocated in RAM only when used).
DEFAULT_MAX_ITEMS = 1 << 20
_POLL = 0.005
_CHUNK = 64  # cached items read from the arena at once in a later pass
_FETCH_CODE = _IterableDatasetFetcher.fetch.__code__


def _batched_by_default_collate(frame: FrameType | None) -> bool:
    """Whether ``frame`` (the caller of a pass's ``next``) is torch's iterable fetcher, batching.

    With automatic batching, torch's fetcher appends each item it gets to the batch and hands
    the batch to ``default_collate``, which stacks (copies) every tensor before anyone sees it:
    the items may then be views into the arena. Without batching (``batch_size=None``) the item
    itself is handed on, and a user's collate function might modify it: never a view then.
    """
    if frame is None or frame.f_code is not _FETCH_CODE:
        return False
    fetcher = frame.f_locals.get("self")
    if not getattr(fetcher, "auto_collation", False):
        return False
    collate = getattr(fetcher, "collate_fn", None)
    if collate is not None and getattr(type(collate), "speedpack_timer", False):  # X-ray timer
        collate = collate.fn
    return collate is default_collate


def local_topology(snapshot: tuple[int, int] | None = None) -> tuple[int, int]:
    """``(local rank, ranks on this node)`` of this process (or of the rank a worker serves).

    From ``torch.distributed`` when initialised, else ``RANK``/``WORLD_SIZE``, else ``snapshot``
    (what the main process saw when it pickled the dataset for a ``spawn`` worker); the node's
    share from ``LOCAL_WORLD_SIZE``/``LOCAL_RANK`` (``torchrun`` sets them), else one node.
    """
    env = os.environ
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    elif "WORLD_SIZE" in env:
        rank, world = int(env.get("RANK", "0")), int(env["WORLD_SIZE"])
    elif snapshot is not None:
        rank, world = snapshot
    else:
        rank, world = 0, 1
    local_world = int(env.get("LOCAL_WORLD_SIZE", world))
    local_rank = int(env.get("LOCAL_RANK", rank % max(local_world, 1)))
    return local_rank, max(local_world, 1)


def _caller(frame: FrameType) -> FrameType:
    """The frame that resumed a pass: past this module's own generators (``yield from``)."""
    while frame.f_code in _OWN_CODES and frame.f_back is not None:
        frame = frame.f_back
    return frame


class CachedStream(ArenaHandle, IterableDataset[Any]):
    """Cache a stream's samples on its first pass, one copy per node; serve later passes from RAM.

    The data-loading guide's own pattern: a WebDataset-style stream (an ``IterableDataset``)
    decodes every sample every epoch. Wrapped, the **first pass** streams from the source --
    each DataLoader worker and DDP rank its own shard, as the stream splits itself -- while
    filling the node's shared arena (the same file, protocol and clean-up as
    :class:`~lightning_speedpack.CachedDataset`: one copy per node, crash-safe, removed when the
    last user exits or by the next construction after a ``SIGKILL``). **Later passes** never
    call the source: the cached items are split across the node's workers and ranks without
    duplicates (process ``k`` of ``n`` serves a share fixed by ``seed``: with ``shuffle=False``
    items ``k, k + n, ...``, with ``shuffle=True`` a random ``1/n`` of them, in an order drawn
    anew each pass). The shares never depend on how many passes a process has counted, so a
    second reader of the same stream (another DataLoader, a probe) never makes a pass of the
    fit repeat or skip an item.
    ``transform`` runs on every item, after the cache.

    A pass that starts after this process's shard is stored but before the other shards are
    waits for them (the ranks of one job reach the epoch's end together). A first pass cut
    short (``break``, a killed worker) is resumed by position on the next pass: the stream must
    yield the same items in the same order in each shard (true for WebDataset without a
    per-epoch shuffle of the shards). Budget: ``max_items`` slots and ``max_bytes`` bytes; past
    either the rest of the stream passes through uncached, with one ``CacheBudgetWarning``,
    and later passes serve the cached items and then each shard's uncached tail from the
    source (which then must be split the same way as in the first pass).

    Rank policy: runs in every process; ranks and workers agree through the shared arena.
    Multi-node: each node caches and serves the shards its own ranks streamed (the node's
    ranks come from ``LOCAL_WORLD_SIZE``, which ``torchrun`` sets).

    Args:
        stream: the ``IterableDataset`` to cache; it splits itself across workers and ranks.
        transform: called on each item after the cache, on every pass (random augmentation).
        max_items: at most this many items are cached. Default: ``len(stream)`` if it has one,
            else ``DEFAULT_MAX_ITEMS``.
        max_bytes: payload budget, as for ``CachedDataset``.
        shuffle: serve each process's share of the cached items in a new order each pass.
        seed: the shuffle's seed.
        storage: ``"shared"`` (``/dev/shm``) or ``"disk"``; ``path``: the file for ``"disk"``.
        key: tells apart two streams of the same class (e.g. the preprocessing version).
        wait_timeout: seconds a pass waits for other shards' first pass before streaming from
            the source uncached (with a warning).

    Raises:
        TypeError: ``stream`` is not an ``IterableDataset``, or an argument has the wrong type.
        ValueError: an argument has an invalid value.

    Example:
        >>> import torch
        >>> from torch.utils.data import DataLoader, IterableDataset
        >>> from lightning_speedpack import CachedDataset
        >>> class Squares(IterableDataset):
        ...     def __iter__(self):
        ...         return (torch.tensor([i * i]) for i in range(6))
        >>> cached = CachedDataset(Squares(), max_bytes=1 << 20, shuffle=True, seed=0)
        >>> type(cached).__name__
        'CachedStream'
        >>> first = [int(x) for x in DataLoader(cached, batch_size=None)]  # streams and fills
        >>> second = [int(x) for x in DataLoader(cached, batch_size=None)]  # from the cache
        >>> first, sorted(second)
        ([0, 1, 4, 9, 16, 25], [0, 1, 4, 9, 16, 25])
        >>> info = cached.cache_info()
        >>> (info.misses, info.hits, info.items)
        (6, 6, 6)
        >>> cached.close()
    """

    def __init__(
        self,
        stream: IterableDataset[Any],
        transform: Callable[[Any], Any] | None = None,
        *,
        max_items: int | None = None,
        max_bytes: int | None = None,
        shuffle: bool = False,
        seed: int = 0,
        storage: Literal["shared", "disk"] = "shared",
        path: str | os.PathLike[str] | None = None,
        key: str | int | None = None,
        wait_timeout: float = 600.0,
    ) -> None:
        if not isinstance(stream, IterableDataset):
            raise TypeError(
                f"`stream` must be a torch IterableDataset, got {type(stream).__qualname__}"
            )
        type_errors: list[str] = []
        value_errors: list[str] = []
        if max_items is not None and (
            isinstance(max_items, bool) or not isinstance(max_items, int)
        ):
            type_errors.append(
                f"`max_items` must be an int or None, got {type(max_items).__name__}"
            )
        elif max_items is not None and max_items <= 0:
            value_errors.append(f"`max_items` must be a positive int, got {max_items}")
        if not isinstance(shuffle, bool):
            type_errors.append(f"`shuffle` must be a bool, got {type(shuffle).__name__}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            type_errors.append(f"`seed` must be an int, got {type(seed).__name__}")
        if isinstance(wait_timeout, bool) or not isinstance(wait_timeout, (int, float)):
            type_errors.append(
                f"`wait_timeout` must be a number of seconds, got {type(wait_timeout).__name__}"
            )
        elif wait_timeout < 0:
            value_errors.append(f"`wait_timeout` must be >= 0, got {wait_timeout}")
        check_options(transform, max_bytes, storage, path, key, type_errors, value_errors)
        if max_items is None:
            try:
                max_items = len(stream)  # type: ignore[arg-type]
            except TypeError:
                max_items = DEFAULT_MAX_ITEMS
        self.stream = stream
        self.transform = transform
        self.max_items = max(int(max_items), 1)
        self.shuffle = shuffle
        self.seed = seed
        self.storage = storage
        self.key = key
        self.wait_timeout = float(wait_timeout)
        self._topology: tuple[int, int] | None = None
        self._warned = False
        self._arena: Arena | None = open_arena(
            dataset_fingerprint(stream, self.max_items, key),
            n_slots=self.max_items,
            max_bytes=max_bytes,
            storage=storage,
            path=path,
        )

    # ------------------------------------------------------------------------- iteration
    def __iter__(self) -> Iterator[Any]:
        arena = self._arena
        if arena is None or arena.closed:
            return self._from_source(None, skip=0)
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        local_rank, local_world = local_topology(self._topology)
        me, shards = local_rank * workers + worker, local_world * workers
        if shards > MAX_FILLERS:
            self._warn(f"more than {MAX_FILLERS} loading processes on one node: not cached")
            return self._from_source(arena, skip=0)
        return self._run(arena, me, shards, workers)

    def _run(self, arena: Arena, me: int, shards: int, workers: int) -> Iterator[Any]:
        epoch = arena.next_pass(me)
        if not arena.complete:
            joined = arena.join_fill(me, shards, workers)
            if joined and not arena.fill_done(me):
                yield from self._fill(arena, me)
                return
            if not joined:
                self._warn(
                    "the first pass runs with another number of workers or ranks than this one: "
                    "this pass streams from the source"
                )
                yield from self._from_source(arena, skip=0)
                return
            if not self._wait_complete(arena):
                self._warn(
                    f"the other shards' first pass did not end within {self.wait_timeout:.0f} s: "
                    "this pass streams from the source"
                )
                yield from self._from_source(arena, skip=0)
                return
        same_split = arena.fill_config() == (shards, workers)
        if arena.cut and not same_split:
            self._warn(
                "the budget cut the cache and this pass splits the stream differently from the "
                "first: this pass streams from the source"
            )
            yield from self._from_source(arena, skip=0)
            return
        yield from self._serve(arena, me, shards, epoch)
        if arena.cut:  # the tail of this shard that did not fit
            yield from self._from_source(arena, skip=arena.fill_position(me))

    def _fill(self, arena: Arena, me: int) -> Iterator[Any]:
        stored = arena.fill_position(me)  # a first pass cut short resumes here
        position, cut = 0, False
        source = iter(self.stream)
        transform = self.transform
        while True:
            with stage(CACHE_MISS_STAGE):
                try:
                    item = next(source)
                except StopIteration:
                    break
            arena.count(hit=False)
            if position >= stored and not cut:
                result, _ = arena.append(encode(item))
                if result == "stored":
                    stored = position + 1
                    arena.set_fill_position(me, stored)
                else:
                    cut = True
                    if result == "budget_exhausted_now":
                        budget_warning(arena.capacity, "CachedStream")
            position += 1
            if transform is not None:
                with stage(TRANSFORM_STAGE):
                    item = transform(item)
            yield item
        arena.finish_fill(me, cut=cut)

    def _serve(self, arena: Arena, me: int, shards: int, epoch: int) -> Iterator[Any]:
        share = self.share(arena.ready_items(), me, shards, epoch).tolist()
        if self.transform is not None:
            yield from self._serve_transformed(arena, share)
            return
        # Items are read a chunk at a time (one pass over the slots, one counter update). The
        # chunk is read as views into the arena when torch's fetcher asks for them to batch with
        # default_collate (its stack is the only copy, as for a TensorDataset), else each item
        # is decoded into tensors of its own. The caller is looked at again for each item: an
        # item read as a view goes to that fetcher or is copied first.
        bound = int(max(share, default=-1)) + 1
        for start in range(0, len(share), _CHUNK):
            chunk = share[start : start + _CHUNK]
            views = _batched_by_default_collate(_caller(sys._getframe(1)))
            profiling = stages_active()
            t0 = time.perf_counter() if profiling else 0.0
            samples = arena.get_many(chunk, bound, how="views" if views else "each")
            if profiling:
                record_stage(CACHE_HIT_STAGE, time.perf_counter() - t0, len(chunk))
            arena.count(hit=True, n=len(chunk))
            for index, sample in zip(chunk, samples, strict=True):
                if sample is MISSING:  # pragma: no cover - a ready slot never changes
                    continue
                if views and _caller(sys._getframe(1)).f_code is not _FETCH_CODE:
                    sample = arena.get(index)  # handed elsewhere: a copy of its own
                yield sample

    def _serve_transformed(self, arena: Arena, share: list[int]) -> Iterator[Any]:
        transform = self.transform
        assert transform is not None
        for index in share:
            with stage(CACHE_HIT_STAGE):
                sample = arena.get(index)
            if sample is MISSING:  # pragma: no cover - a ready slot never changes
                continue
            arena.count(hit=True)
            with stage(TRANSFORM_STAGE):
                sample = transform(sample)
            yield sample

    def share(
        self, items: np.ndarray[Any, Any], me: int, shards: int, epoch: int
    ) -> np.ndarray[Any, Any]:
        """The cached items process ``me`` of ``shards`` serves in its pass number ``epoch``.

        Which items a process serves depends on ``seed`` alone, never on the pass number: the
        processes of one pass (workers, ranks) then split the items without a repeat or a gap
        even when they count their passes differently -- a second reader of the same cache (a
        probe, another DataLoader) adds passes to some counters and not to others. With
        ``shuffle`` the order within each share is drawn anew each pass.

        Example:
            >>> import numpy as np
            >>> stream = CachedStream.__new__(CachedStream)
            >>> stream.shuffle, stream.seed = True, 0
            >>> items = np.arange(10)
            >>> shares = [stream.share(items, me, 2, epoch=me) for me in range(2)]  # passes differ
            >>> sorted(np.concatenate(shares).tolist()) == list(range(10))
            True
        """
        if not self.shuffle:
            return items[me::shards]
        mine = items[np.random.default_rng([self.seed]).permutation(len(items))][me::shards]
        return mine[np.random.default_rng([self.seed, epoch, me]).permutation(len(mine))]

    def _from_source(self, arena: Arena | None, *, skip: int) -> Iterator[Any]:
        transform = self.transform
        source = islice(iter(self.stream), skip, None) if skip else iter(self.stream)
        while True:
            with stage(CACHE_MISS_STAGE):
                try:
                    item = next(source)
                except StopIteration:
                    return
            if arena is not None and not arena.closed:
                arena.count(hit=False)
            if transform is not None:
                with stage(TRANSFORM_STAGE):
                    item = transform(item)
            yield item

    def _wait_complete(self, arena: Arena) -> bool:
        deadline = time.monotonic() + self.wait_timeout
        while not arena.complete:
            if time.monotonic() > deadline:
                return False
            time.sleep(_POLL)
        return True

    def _warn(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(f"CachedStream: {why}", CacheBudgetWarning, stacklevel=3)

    # --------------------------------------------------------------------------- the rest
    @property
    def complete(self) -> bool:
        """Whether the first pass stored every shard (later passes never call the source)."""
        return self._arena is not None and not self._arena.closed and self._arena.complete

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            state["_topology"] = (torch.distributed.get_rank(), torch.distributed.get_world_size())
        return state

    def __repr__(self) -> str:
        info = self.cache_info()
        return (
            f"CachedStream({type(self.stream).__qualname__}, max_items={self.max_items}, "
            f"storage={self.storage!r}, items={info.items}, complete={self.complete})"
        )


_OWN_CODES = frozenset({CachedStream._run.__code__, CachedStream._serve.__code__})
