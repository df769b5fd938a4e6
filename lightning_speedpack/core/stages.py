"""Named stages of a data pipeline, and the shared counter table they are recorded in.

``with stage("decode"):`` (or ``@stage("decode")``) marks a stretch of a dataset's
``__getitem__``/``__iter__``, a transform or a collate function. While no
:class:`~lightning_speedpack.data_xray.profiler.DataPipelineProfiler` runs in the process, a stage
is a no-op costing well under a microsecond (one global read on enter and on exit).

While a profiler runs, each process that loads data (every DataLoader worker, or the main
process with ``num_workers=0``) owns one row of a :class:`CounterTable`: a small float64 table
in shared memory (a ``torch`` shared tensor, so it reaches ``fork`` and ``spawn`` workers
alike). A worker adds its fetch, collate and stage timings to its own row with plain memory
writes -- no per-sample IPC, no locks (one writer per row) -- and the main process reads the
whole table when it logs.

Row layout (float64): start time, pid, fetch seconds, samples fetched, collate seconds,
batches collated (= the sequence number of the next batch), a stage-overflow flag, a ring of
the last ``RING`` batches' completion times (for the queue wait), then ``(seconds, count)``
for up to ``MAX_STAGES`` named stages whose names are kept in a parallel ``uint8`` table.
Times are ``time.perf_counter()`` values, which on Linux are ``CLOCK_MONOTONIC`` and so
comparable across processes of one machine.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

import numpy as np
import torch

__all__ = [
    "CACHE_HIT_STAGE",
    "CACHE_MISS_STAGE",
    "MAX_STAGES",
    "RING",
    "CounterTable",
    "RowSnapshot",
    "Stage",
    "activate",
    "active",
    "deactivate",
    "record_stage",
    "stage",
]

#: The stage a cache records a hit under (``data/cache_hit_rate`` = hits / (hits + misses)).
CACHE_HIT_STAGE = "cache_read"
#: The stage a cache records a miss (a fetch from its source) under.
CACHE_MISS_STAGE = "source_fetch"

MAX_STAGES = 16
NAME_BYTES = 32
RING = 32

# row fields
F_START, F_PID, F_FETCH_S, F_FETCH_N, F_COLLATE_S, F_COLLATE_N, F_OVERFLOW, F_FETCH_CPU = range(8)
F_RING = 8
F_STAGES = F_RING + RING
FIELDS = F_STAGES + 2 * MAX_STAGES

_F = TypeVar("_F", bound=Callable[..., Any])
_clock = time.perf_counter


class CounterTable:
    """Per-process rows of counters in shared memory (created in the main process).

    Args:
        rows: the number of rows (one per loading process that may run at once).

    Example:
        >>> table = CounterTable(rows=2)
        >>> rec = activate(table, row=1)
        >>> with stage("decode"):
        ...     pass
        >>> deactivate()
        >>> snap = table.read()[1]
        >>> sorted(snap.stages), snap.stages["decode"][1]
        (['decode'], 1.0)
    """

    def __init__(self, rows: int) -> None:
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ValueError(f"`rows` must be a positive int, got {rows!r}")
        self.rows = rows
        self.values = torch.zeros(rows, FIELDS, dtype=torch.float64).share_memory_()  # type: ignore[no-untyped-call]
        self.names = torch.zeros(rows, MAX_STAGES, NAME_BYTES, dtype=torch.uint8).share_memory_()  # type: ignore[no-untyped-call]
        self._views()

    def _views(self) -> None:
        # numpy views of the shared tensors, made once: reading them per batch calls no torch
        # Tensor method (cheaper, and nothing a sync detector watching tensors would report).
        self.cells: np.ndarray[Any, Any] = self.values.numpy()
        self.name_bytes: np.ndarray[Any, Any] = self.names.numpy()
        # ...and flat memoryviews of them: a cell or a slice read from Python, no numpy call
        self.flat_cells: Any = self.cells.reshape(-1).data  # format "d": floats in, floats out
        self.flat_names: memoryview = self.name_bytes.reshape(-1).data

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for view in ("cells", "name_bytes", "flat_cells", "flat_names"):
            del state[view]  # the tensors carry the shared memory
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._views()

    def read(self) -> list[RowSnapshot]:
        """A consistent-enough copy of every row (aligned 8-byte writes are atomic)."""
        values = self.cells.copy()
        names = self.name_bytes.copy()
        out = []
        for r in range(self.rows):
            row = values[r]
            stages: dict[str, tuple[float, float]] = {}
            for s in range(MAX_STAGES):
                count = float(row[F_STAGES + 2 * s + 1])
                raw = bytes(names[r, s]).rstrip(b"\0")
                if raw and count:
                    name = raw.decode("utf-8", "replace")
                    seconds = float(row[F_STAGES + 2 * s])
                    old = stages.get(name, (0.0, 0.0))
                    stages[name] = (old[0] + seconds, old[1] + count)
            out.append(
                RowSnapshot(
                    start=float(row[F_START]),
                    pid=int(row[F_PID]),
                    fetch_seconds=float(row[F_FETCH_S]),
                    samples=float(row[F_FETCH_N]),
                    collate_seconds=float(row[F_COLLATE_S]),
                    batches=float(row[F_COLLATE_N]),
                    overflow=bool(row[F_OVERFLOW]),
                    stages=stages,
                    ring=[float(v) for v in row[F_RING:F_STAGES]],
                    fetch_cpu_seconds=float(row[F_FETCH_CPU]),
                )
            )
        return out

    def clear_row(self, row: int) -> None:
        """Zero one row (its owner does this when it starts)."""
        self.cells[row] = 0.0
        self.name_bytes[row] = 0


@dataclass
class RowSnapshot:
    """One row of a :class:`CounterTable` as read by the main process."""

    start: float
    pid: int
    fetch_seconds: float
    samples: float
    collate_seconds: float
    batches: float
    overflow: bool
    stages: dict[str, tuple[float, float]]  # name -> (seconds, count)
    ring: list[float]
    fetch_cpu_seconds: float = 0.0  # CPU time of the fetches (collate included)

    @property
    def busy_seconds(self) -> float:
        """Seconds this process spent fetching and collating."""
        return self.fetch_seconds + self.collate_seconds

    def done_time(self, seq: int) -> float | None:
        """When batch ``seq`` of this row was collated, if it is still in the ring."""
        if seq < 0 or seq >= self.batches or self.batches - seq > RING:
            return None
        return self.ring[seq % RING]


class _Recorder:
    """Writes one process's timings into its row (plain memory writes, one writer per row)."""

    __slots__ = ("base", "collate_s", "collates", "items", "mv", "names", "slots", "stack")

    def __init__(self, table: CounterTable, row: int) -> None:
        table.clear_row(row)
        self.mv: Any = table.flat_cells  # a memoryview of the float64 cells
        self.names = table.name_bytes[row]
        self.base = row * FIELDS
        self.slots: dict[str, int] = {}
        self.stack: list[float] = []
        self.items = 0  # samples handed to the last collate (a stream's batch may be short)
        # The row's collate seconds and count, kept here too: the timed fetcher reads them
        # twice a batch (one writer per row, so they equal the row's cells).
        self.collate_s = 0.0
        self.collates = 0
        self.mv[self.base + F_PID] = float(os.getpid())
        self.mv[self.base + F_START] = _clock()

    def add_fetch(self, seconds: float, samples: int, cpu_seconds: float = 0.0) -> None:
        mv, b = self.mv, self.base
        mv[b + F_FETCH_S] += seconds
        mv[b + F_FETCH_N] += samples
        mv[b + F_FETCH_CPU] += cpu_seconds

    def add_collate(self, seconds: float, done: float) -> None:
        mv, b, seq = self.mv, self.base, self.collates
        mv[b + F_RING + seq % RING] = done
        self.collate_s += seconds
        mv[b + F_COLLATE_S] = self.collate_s
        self.collates = seq + 1
        mv[b + F_COLLATE_N] = seq + 1  # written last: the ring entry is there before it counts

    def add_stage(self, name: str, seconds: float, count: int) -> None:
        slot = self.slots.get(name)
        if slot is None:
            slot = self._claim(name)
            if slot is None:
                return
        mv, i = self.mv, self.base + F_STAGES + 2 * slot
        mv[i] += seconds
        mv[i + 1] += count

    def _claim(self, name: str) -> int | None:
        slot = len(self.slots)
        if slot >= MAX_STAGES:
            self.mv[self.base + F_OVERFLOW] = 1.0
            return None
        raw = name.encode("utf-8")[: NAME_BYTES - 1]
        self.names[slot, : len(raw)] = list(raw)
        self.slots[name] = slot
        return slot


_ACTIVE: _Recorder | None = None


def activate(table: CounterTable, row: int) -> _Recorder:
    """Record this process's stages, fetches and collates into ``row`` of ``table``."""
    global _ACTIVE
    if not 0 <= row < table.rows:
        raise ValueError(f"`row` must be in [0, {table.rows}), got {row!r}")
    _ACTIVE = _Recorder(table, row)
    return _ACTIVE


def deactivate() -> None:
    """Stop recording in this process (stages become no-ops again)."""
    global _ACTIVE
    _ACTIVE = None


def active() -> bool:
    """Whether a profiler records this process's data pipeline right now."""
    return _ACTIVE is not None


class Stage:
    """A named stage: a context manager and a decorator (see :func:`stage`)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> Stage:
        rec = _ACTIVE
        if rec is not None:
            rec.stack.append(_clock())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        rec = _ACTIVE
        if rec is not None and rec.stack:
            rec.add_stage(self.name, _clock() - rec.stack.pop(), 1)

    def __call__(self, fn: _F) -> _F:
        """Use the stage as a decorator: every call of ``fn`` is timed under its name."""

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return timed  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"stage({self.name!r})"


_STAGES: dict[str, Stage] = {}


def stage(name: str) -> Stage:
    """A named stage of the data pipeline, timed while a ``DataPipelineProfiler`` runs.

    Use it inside a dataset's ``__getitem__``/``__iter__``, a transform or a collate function,
    in DataLoader workers or in the main process. Its mean time per call is logged as
    ``data/stage/<name>_ms``. Without a running profiler it does nothing (< 1 µs).

    Args:
        name: the stage's name (at most 31 UTF-8 bytes are kept; up to 16 names per process).

    Raises:
        TypeError: ``name`` is not a non-empty str.

    Example:
        >>> @stage("augment")
        ... def augment(x):
        ...     return x + 1
        >>> with stage("decode"):
        ...     y = augment(1)
        >>> y
        2
    """
    found = _STAGES.get(name)
    if found is not None:
        return found
    if not isinstance(name, str) or not name:
        raise TypeError(f"`name` must be a non-empty str, got {name!r}")
    found = _STAGES[name] = Stage(name)
    return found


def record_stage(name: str, seconds: float, count: int = 1) -> None:
    """Add ``count`` calls taking ``seconds`` in total to stage ``name`` (e.g. a batched read).

    A no-op while no profiler runs in this process.

    Example:
        >>> record_stage("cache_read", 0.004, count=32)  # no profiler: nothing happens
    """
    rec = _ACTIVE
    if rec is not None:
        rec.add_stage(name, seconds, count)
