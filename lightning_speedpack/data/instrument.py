"""Thin timing proxies put around a DataLoader without editing the user's code.

- :func:`timed_dataset_class` builds, for a dataset class, a subclass (same name, no new
  attributes) whose ``__getitem__``/``__getitems__``/``__iter__`` time the original. It is
  given to the dataset object **inside each worker** (``obj.__class__ = ...`` on the worker's own
  copy, from the wrapped ``worker_init_fn``), or in the main process with ``num_workers=0``
  (and put back after the fit). What a sample or a batch contains is never changed.
- :class:`TimedCollate` times the loader's ``collate_fn`` and records each batch's
  completion time (for the queue wait).
- :class:`WorkerInit` wraps the loader's ``worker_init_fn``: it first calls the user's own (or
  Lightning's seeding one when ``seed_everything(workers=True)`` asked for it), then starts
  recording in the worker's own row of the shared table. It pickles, for ``spawn``.
- :class:`LoaderProbe` instruments one DataLoader and, in the main process, pairs each
  received batch with the time its worker finished it (the worker->main queue wait).
"""

from __future__ import annotations

import copy
import functools
import importlib
import os
from collections.abc import Callable, Iterator
from types import CodeType
from typing import Any

import torch

from lightning_speedpack.data import stages as _stages
from lightning_speedpack.data.stages import CounterTable, _clock

__all__ = [
    "GENERATIONS",
    "LoaderProbe",
    "TimedCollate",
    "WorkerInit",
    "timed_dataset_class",
    "untimed_class",
]

#: Worker pools whose rows are kept apart (a pool being shut down never shares rows with the
#: next one).
GENERATIONS = 4

_TIMED: dict[type, type] = {}


def _reduce_ex(self: Any, protocol: Any) -> Any:
    # Pickle as the user's own class: a copy never carries the timing subclass.
    reduced = object.__reduce_ex__(self, protocol)
    base = type(self)._speedpack_base
    if isinstance(reduced, tuple) and len(reduced) > 1 and reduced[1]:
        args = reduced[1]
        if args and args[0] is type(self):
            reduced = (reduced[0], (base, *args[1:]), *reduced[2:])
    return reduced


class _TimedIterator:
    """Times each ``__next__`` of a stream as one sample's fetch."""

    __slots__ = ("inner",)

    def __init__(self, inner: Iterator[Any]) -> None:
        self.inner = inner

    def __iter__(self) -> _TimedIterator:
        return self

    def __next__(self) -> Any:
        rec = _stages._ACTIVE
        if rec is None:
            return next(self.inner)
        start = _clock()
        item = next(self.inner)  # StopIteration passes through uncounted
        rec.add_fetch(_clock() - start, 1)
        return item


def _timed_getitems(getitems: Callable[[Any, list[Any]], Any]) -> Callable[..., Any]:
    @functools.wraps(getitems)
    def __getitems__(self: Any, indices: list[Any]) -> Any:
        rec = _stages._ACTIVE
        if rec is None:
            return getitems(self, indices)
        start = _clock()
        items = getitems(self, indices)
        rec.add_fetch(_clock() - start, len(indices))
        return items

    return __getitems__


#: The code of every timed ``__getitems__``: a dataset that looks at who called it (the
#: CachedDataset) looks past this frame.
TIMED_GETITEMS_CODE: CodeType = _timed_getitems(lambda self, indices: None).__code__


def timed_dataset_class(base: type) -> type:
    """A subclass of ``base`` that times its fetches (cached per class).

    Example:
        >>> from torch.utils.data import TensorDataset
        >>> timed = timed_dataset_class(TensorDataset)
        >>> timed.__name__, issubclass(timed, TensorDataset), untimed_class(timed) is TensorDataset
        ('TensorDataset', True, True)
    """
    found = _TIMED.get(base)
    if found is not None:
        return found
    ns: dict[str, Any] = {
        "__slots__": (),
        "__module__": base.__module__,
        "__qualname__": base.__qualname__,
        "_speedpack_base": base,
        "__reduce_ex__": _reduce_ex,
    }
    getitem = getattr(base, "__getitem__", None)
    getitems = getattr(base, "__getitems__", None)
    is_stream = issubclass(base, torch.utils.data.IterableDataset) or getitem is None
    if is_stream and getattr(base, "__iter__", None) is not None:
        base_iter = base.__iter__  # type: ignore[attr-defined]

        @functools.wraps(base_iter)
        def __iter__(self: Any) -> Iterator[Any]:
            return _TimedIterator(iter(base_iter(self)))

        ns["__iter__"] = __iter__
    if getitem is not None and not is_stream:
        # `wraps` sets `__wrapped__`: whatever locates the user's `__getitem__` (the doctor's
        # data-wait finding) unwraps to the user's own code, not to this file.
        @functools.wraps(getitem)
        def __getitem__(self: Any, index: Any) -> Any:
            rec = _stages._ACTIVE
            if rec is None:
                return getitem(self, index)
            start = _clock()
            item = getitem(self, index)
            rec.add_fetch(_clock() - start, 1)
            return item

        ns["__getitem__"] = __getitem__
    if getitems is not None and not is_stream:
        ns["__getitems__"] = _timed_getitems(getitems)
    timed = type(base.__name__, (base,), ns)
    _TIMED[base] = timed
    return timed


def untimed_class(cls: type) -> type:
    """The user's class behind a timing subclass (``cls`` itself otherwise)."""
    return getattr(cls, "_speedpack_base", cls) if "_speedpack_base" in cls.__dict__ else cls


def time_dataset(dataset: Any) -> bool:
    """Give ``dataset`` the timing subclass of its class in place; whether it worked."""
    cls = type(dataset)
    if "_speedpack_base" in cls.__dict__:
        return True
    try:
        dataset.__class__ = timed_dataset_class(cls)
    except TypeError:  # an extension type or an incompatible layout: fetches go untimed
        return False
    return True


def untime_dataset(dataset: Any) -> None:
    """Put the user's own class back on ``dataset``."""
    cls = type(dataset)
    if "_speedpack_base" in cls.__dict__:
        dataset.__class__ = cls._speedpack_base


class TimedCollate:
    """Times ``fn`` (a collate function) and records when each batch is done."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __call__(self, batch: Any) -> Any:
        """Collate ``batch`` with the user's function."""
        rec = _stages._ACTIVE
        if rec is None:
            return self.fn(batch)
        start = _clock()
        out = self.fn(batch)
        done = _clock()
        rec.add_collate(done - start, done)
        return out


class WorkerInit:
    """The loader's ``worker_init_fn``, then recording into this worker's row.

    Args:
        fn: the user's ``worker_init_fn`` (or ``None``).
        table: the shared counter table.
        workers: the loader's ``num_workers`` (rows per generation).
        seed_module: when set, the module whose ``pl_worker_init_function`` seeds the worker
            (Lightning adds it only when ``worker_init_fn`` is None, which ours is not).
        rank: the global rank, for that seeding function.
    """

    def __init__(
        self,
        fn: Callable[[int], Any] | None,
        table: CounterTable,
        workers: int,
        seed_module: str | None = None,
        rank: int = 0,
    ) -> None:
        self.fn, self.table, self.workers = fn, table, workers
        self.seed_module, self.rank = seed_module, rank
        self.generation = 0

    def row(self, worker_id: int, generation: int | None = None) -> int:
        """The table row of ``worker_id`` in ``generation`` (row 0 is the main process)."""
        gen = self.generation if generation is None else generation
        return 1 + (gen % GENERATIONS) * self.workers + worker_id

    def __call__(self, worker_id: int) -> None:
        """Run in the worker before its first fetch."""
        if self.fn is not None:
            self.fn(worker_id)
        elif self.seed_module is not None and int(os.environ.get("PL_SEED_WORKERS", 0)):
            importlib.import_module(self.seed_module).pl_worker_init_function(worker_id, self.rank)
        info = torch.utils.data.get_worker_info()
        if info is not None:
            time_dataset(info.dataset)  # the worker's own copy; the user's object is untouched
        _stages.activate(self.table, self.row(worker_id))


class _ReceivingIterator:
    """The DataLoader's iterator, plus the time each batch is received (main process)."""

    def __init__(self, inner: Any, probe: LoaderProbe, generation: int) -> None:
        self._inner, self._probe, self._generation = inner, probe, generation
        self._heads: dict[int, int] = {}  # a new pool: its workers start their rows from zero

    def __iter__(self) -> _ReceivingIterator:
        return self

    def __next__(self) -> Any:
        info = getattr(self._inner, "_task_info", None)  # torch's own: which worker is next
        worker = None
        if info is not None and getattr(self._inner, "_in_order", True):
            task = info.get(getattr(self._inner, "_rcvd_idx", -1))
            worker = task[0] if task else None
        batch = next(self._inner)
        if worker is not None:
            self._received(worker, _clock())
        return batch

    def __len__(self) -> int:
        return len(self._inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        # A persistent pool starts another epoch: what it finished before is not paired.
        self._inner._reset(loader, first_iter)
        values = self._probe.table.cells
        rows = [self._probe.init.row(w, self._generation) for w in range(self._probe.workers)]
        self._heads = {w: int(values[r, _stages.F_COLLATE_N]) for w, r in enumerate(rows)}

    def _received(self, worker: int, when: float) -> None:
        head = self._heads.get(worker, 0)
        self._heads[worker] = head + 1
        row = self._probe.init.row(worker, self._generation)
        values = self._probe.table.cells  # numpy: no torch call per batch
        done_count = int(values[row, _stages.F_COLLATE_N])
        if head < done_count and done_count - head <= _stages.RING:
            done = float(values[row, _stages.F_RING + head % _stages.RING])
            if done < self._probe.count_from:  # finished while the probes ran: not counted
                return
            self._probe.wait_seconds += max(0.0, when - done)
            self._probe.waits += 1


class LoaderProbe:
    """Instruments one DataLoader for a :class:`CounterTable`; undoes it with :meth:`restore`.

    Args:
        loader: the training DataLoader.
        seed_module: see :class:`WorkerInit`.
        rank: the global rank.
    """

    def __init__(self, loader: Any, seed_module: str | None = None, rank: int = 0) -> None:
        self.loader = loader
        self.workers = int(loader.num_workers)
        self.table = CounterTable(1 + GENERATIONS * max(self.workers, 1))  # 0 workers: row 1 probes
        self.saved = {"collate_fn": loader.collate_fn, "worker_init_fn": loader.worker_init_fn}
        self.timed_in_main = False
        self.init = WorkerInit(loader.worker_init_fn, self.table, self.workers, seed_module, rank)
        self.train_generation = 0  # the pool the fit's own iterator uses
        self.wait_seconds = 0.0
        self.waits = 0
        self.count_from = 0.0  # batches collated before this time are not paired
        loader.collate_fn = TimedCollate(loader.collate_fn)
        if self.workers > 0:
            loader.worker_init_fn = self.init
            loader._get_iterator = functools.partial(self._new_iterator, loader, True)
        else:
            self.timed_in_main = time_dataset(loader.dataset)

    def _new_iterator(self, loader: Any, train: bool) -> Any:
        self.init.generation += 1
        generation = self.init.generation
        if train:
            self.train_generation = generation
        inner = type(loader)._get_iterator(loader)
        return _ReceivingIterator(inner, self, generation)

    def live_rows(self) -> list[int]:
        """The rows of the processes loading for the fit now (row 0: the main process)."""
        if self.workers == 0:
            return [0]
        return [self.init.row(w, self.train_generation) for w in range(self.workers)]

    def side_copy(self) -> Any:
        """A shallow copy of the loader with its own iterator (for the loader ceiling).

        It shares the dataset, sampler and collate function, never the fit's iterator (a
        persistent pool would otherwise be reset and consumed by the probe).
        """
        side = copy.copy(self.loader)
        side.__dict__["_iterator"] = None
        if self.workers > 0:
            side.__dict__["_get_iterator"] = functools.partial(self._new_iterator, side, False)
        return side

    @staticmethod
    def close_copy(side: Any) -> None:
        """Shut down the workers a :meth:`side_copy` may keep (persistent workers)."""
        iterator = side.__dict__.pop("_iterator", None)
        side.__dict__.pop("_get_iterator", None)
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()

    def restore(self) -> None:
        """Put the user's collate function, worker_init_fn and dataset class back."""
        loader = self.loader
        loader.collate_fn = self.saved["collate_fn"]
        loader.worker_init_fn = self.saved["worker_init_fn"]
        loader.__dict__.pop("_get_iterator", None)
        iterator = loader.__dict__.get("_iterator")
        if isinstance(iterator, _ReceivingIterator):  # a persistent pool lives on unwrapped
            loader.__dict__["_iterator"] = iterator._inner
        if self.timed_in_main:
            untime_dataset(loader.dataset)
