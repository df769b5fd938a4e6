"""Thin timing proxies put on a DataLoader's own seams, never on the user's dataset.

The X-ray reads a loader through the seams torch gives every DataLoader -- its ``collate_fn``,
its ``worker_init_fn`` and the *fetcher* each loading process draws batches with -- and never
rewrites the class of a dataset (a library stream's own ``__iter__``, a LitData or MosaicML
dataset with state of its own, an extension type: none is touched).

- :class:`TimedFetcher` wraps the fetcher torch builds in each loading process (the object whose
  ``fetch`` calls ``__getitems__``/``__getitem__``, or ``next`` on a stream, then the collate
  function): the fetch time is its time less the collate's. In a worker it is put in place by
  :func:`time_fetchers_in_this_worker` (called from the wrapped ``worker_init_fn``: the worker
  process serves this one loader only); with ``num_workers=0`` on the main process's iterator,
  for that iterator alone.
- :class:`TimedCollate` times the loader's ``collate_fn`` and records each batch's
  completion time (for the queue wait).
- :class:`WorkerInit` wraps the loader's ``worker_init_fn``: it first calls the user's own (or
  Lightning's seeding one when ``seed_everything(workers=True)`` asked for it), then starts
  recording in the worker's own row of the shared table. It pickles, for ``spawn``.
- :class:`LoaderProbe` instruments one DataLoader and, in the main process, pairs each
  received batch with the time its worker finished it (the worker->main queue wait).

No proxy wraps another of its kind: a collate function, ``worker_init_fn`` or fetcher that is
already timed is used as it is (across epochs, worker pools, copies of the loader).
"""

from __future__ import annotations

import copy
import functools
import importlib
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data._utils.fetch import _IterableDatasetFetcher

from lightning_speedpack.core import stages as _stages
from lightning_speedpack.core.stages import CounterTable, _clock

__all__ = [
    "CPU_READ_EVERY",
    "CPU_READ_FLOOR_S",
    "GENERATIONS",
    "LoaderProbe",
    "TimedCollate",
    "TimedFetcher",
    "WorkerInit",
    "time_fetchers_in_this_worker",
]

#: Worker pools whose rows are kept apart (a pool being shut down never shares rows with the
#: next one).
GENERATIONS = 4

#: A fetch at least this long has the next fetch's compute time read (see :class:`TimedFetcher`).
CPU_READ_FLOOR_S = 1e-3
#: Of the fetches after a shorter one, one in this many has its compute time read.
CPU_READ_EVERY = 8


_SCHEDSTAT: dict[tuple[int, int], int] = {}  # (pid, thread) -> its open schedstat file


def compute_clock() -> Callable[[], float]:
    """A clock of the seconds this thread computed or was ready to compute.

    CPU time tells a fetch that computes from one that waits (I/O, a sleep, a remote store).
    On a loaded machine a computing thread also waits for a core; Linux counts that time
    apart (``/proc/thread-self/schedstat``: time on a CPU, time on a run queue), so both are
    summed here and a CPU-bound decode reads as computing however busy the machine is.
    Elsewhere: ``time.thread_time`` (CPU time only).
    """
    key = (os.getpid(), threading.get_ident())  # a forked child must not read its parent's
    fd = _SCHEDSTAT.get(key)
    if fd is None:
        try:
            fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            return time.thread_time
        _SCHEDSTAT[key] = fd

    def ready_seconds() -> float:
        on_cpu, queued, _ = os.pread(fd, 96, 0).split(maxsplit=2)
        return (int(on_cpu) + int(queued)) * 1e-9

    return ready_seconds


class TimedFetcher:
    """A torch fetcher whose ``fetch`` is timed: the dataset's part (less the collate) per sample.

    Each fetch's wall time is measured. Its compute time (:func:`compute_clock`: two system
    calls, a read of the kernel's schedstat before and after) is read for the first fetch, for
    every fetch after one of :data:`CPU_READ_FLOOR_S` or more, and otherwise for one fetch in
    :data:`CPU_READ_EVERY`; a fetch not read is charged its wall time at the compute share of
    the last one read. So where the data is slow enough to matter every fetch is read, and a
    fast loader on a millisecond step does not pay two system calls a batch (a fetch of 8 rows
    in a loop: +3.95 us over torch's own read every time, +0.94 us so; BENCHMARKS.md, "The data
    X-ray").

    Example:
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> from lightning_speedpack.core import stages
        >>> loader = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4)
        >>> it = iter(loader)
        >>> it._dataset_fetcher = TimedFetcher(it._dataset_fetcher)
        >>> table = CounterTable(1)
        >>> _ = stages.activate(table, 0)
        >>> [b[0].tolist() for b in it]
        [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]
        >>> stages.deactivate()
        >>> table.read()[0].samples
        8.0
    """

    __slots__ = ("_batched", "_cpu", "_share", "_skip", "_stream", "inner")

    def __init__(self, inner: Any) -> None:
        self.inner: Any = inner.inner if isinstance(inner, TimedFetcher) else inner
        self._stream = isinstance(self.inner, _IterableDatasetFetcher)
        # torch sets it once, when it builds the fetcher: read here, not at every batch
        self._batched = bool(getattr(self.inner, "auto_collation", True))
        self._cpu = compute_clock()
        self._share = 0.0  # the compute share of the last fetch whose CPU time was read
        self._skip = 0  # short fetches left before the next read

    def fetch(self, possibly_batched_index: Any) -> Any:
        """Fetch and collate one batch as torch would, timing the dataset's part."""
        rec = _stages._ACTIVE
        if rec is None:
            return self.inner.fetch(possibly_batched_index)
        collate_s, collated = rec.collate_s, rec.collates  # the collate runs inside the fetch
        skip = self._skip
        if skip:  # charged at the last share read: no system call
            start = _clock()
            batch = self.inner.fetch(possibly_batched_index)  # StopIteration passes uncounted
            seconds = _clock() - start
            cpu = seconds * self._share
            self._skip = skip - 1 if seconds < CPU_READ_FLOOR_S else 0  # slow: read the next
        else:
            cpu = self._cpu()
            start = _clock()
            batch = self.inner.fetch(possibly_batched_index)
            seconds = _clock() - start
            cpu = self._cpu() - cpu
            self._share = cpu / seconds if seconds > 0.0 else 0.0
            self._skip = CPU_READ_EVERY - 1 if seconds < CPU_READ_FLOOR_S else 0
        if not self._batched:
            samples = 1
        elif self._stream and rec.collates > collated:  # a stream's last batch may be short
            samples = rec.items
        else:
            samples = len(possibly_batched_index)
        rec.add_fetch(max(0.0, seconds - (rec.collate_s - collate_s)), samples, cpu)
        return batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def time_fetchers_in_this_worker() -> None:
    """Make the fetchers torch builds in this DataLoader worker from now on timed ones.

    torch's worker loop builds its fetcher right after ``worker_init_fn`` (and again at each
    epoch of a persistent worker) through ``_DatasetKind.create_fetcher``; a worker process
    serves one loader, so the change stays in the process it was made for. Applied once per
    process, whatever the number of epochs.
    """
    kind = torch.utils.data.dataloader._DatasetKind
    create = kind.__dict__.get("create_fetcher")
    if not isinstance(create, staticmethod) or getattr(create.__func__, "_speedpack", False):
        return
    original = create.__func__

    @functools.wraps(original)
    def create_fetcher(*args: Any, **kwargs: Any) -> Any:
        return TimedFetcher(original(*args, **kwargs))

    create_fetcher._speedpack = True  # type: ignore[attr-defined]
    kind.create_fetcher = staticmethod(create_fetcher)  # type: ignore[method-assign]


class TimedCollate:
    """Times ``fn`` (a collate function) and records when each batch is done."""

    #: Tells the cache, which imports nothing of the X-ray, that ``fn`` is the real collate.
    speedpack_timer = True

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn: Callable[[Any], Any] = fn.fn if isinstance(fn, TimedCollate) else fn

    def __call__(self, batch: Any) -> Any:
        """Collate ``batch`` with the user's function."""
        rec = _stages._ACTIVE
        if rec is None:
            return self.fn(batch)
        rec.items = len(batch) if isinstance(batch, (list, tuple)) else 1
        start = _clock()
        out = self.fn(batch)
        done = _clock()
        rec.add_collate(done - start, done)
        return out


class WorkerInit:
    """The loader's ``worker_init_fn``, then recording into this worker's row.

    Args:
        fn: the user's ``worker_init_fn`` (or ``None``; a :class:`WorkerInit` is unwrapped).
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
        self.fn: Callable[[int], Any] | None = fn.fn if isinstance(fn, WorkerInit) else fn
        self.table, self.workers = table, workers
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
        if torch.utils.data.get_worker_info() is not None:
            time_fetchers_in_this_worker()
        _stages.activate(self.table, self.row(worker_id))


class _ReceivingIterator:
    """The DataLoader's iterator, plus the time each batch is received (main process).

    On the fit's own iterator it also sums the time the training process spends inside
    ``next``: waiting for the loader, and nothing else (what callbacks do between two batches
    is not in it).
    """

    def __init__(self, inner: Any, probe: LoaderProbe, generation: int, train: bool) -> None:
        self._inner, self._probe, self._generation = inner, probe, generation
        self._train = train
        self._heads: dict[int, int] = {}  # a new pool: its workers start their rows from zero

    def __iter__(self) -> _ReceivingIterator:
        return self

    def __next__(self) -> Any:
        info = getattr(self._inner, "_task_info", None)  # torch's own: which worker is next
        worker = None
        if info is not None and getattr(self._inner, "_in_order", True):
            task = info.get(getattr(self._inner, "_rcvd_idx", -1))
            worker = task[0] if task else None
        start = _clock()
        batch = next(self._inner)  # StopIteration passes through: the end is not a wait
        now = _clock()
        if self._train:
            self._probe.next_seconds += now - start
            self._probe.nexts += 1
        if worker is not None:
            self._received(worker, now)
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


class _ReceivedHere(_ReceivingIterator):
    """The fit's iterator of a loader without workers: the batches are made in this process.

    No worker hands a batch over, so there is no queue wait to pair: only the time inside
    ``next`` is summed (the fetch, the collate, the sampler and a pinning copy), with three
    attribute reads fewer a batch than a pool's iterator needs.
    """

    def __next__(self) -> Any:
        start = _clock()
        batch = next(self._inner)  # StopIteration passes through: the end is not a wait
        probe = self._probe
        probe.next_seconds += _clock() - start
        probe.nexts += 1
        return batch


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
        collate, init = loader.collate_fn, loader.worker_init_fn
        self.saved = {  # the user's own, even if an earlier fit left a timer on (it never does)
            "collate_fn": collate.fn if isinstance(collate, TimedCollate) else collate,
            "worker_init_fn": init.fn if isinstance(init, WorkerInit) else init,
        }
        self.init = WorkerInit(init, self.table, self.workers, seed_module, rank)
        self.train_generation = 0  # the pool the fit's own iterator uses
        self.wait_seconds = 0.0
        self.waits = 0
        self.next_seconds = 0.0  # the fit's iterator: time inside `next` (the data wait)
        self.nexts = 0
        self.count_from = 0.0  # batches collated before this time are not paired
        loader.collate_fn = TimedCollate(collate)
        if self.workers > 0:
            loader.worker_init_fn = self.init
        loader._get_iterator = functools.partial(self._new_iterator, loader, True)

    def _new_iterator(self, loader: Any, train: bool) -> Any:
        if self.workers == 0:  # this process loads: time this iterator's fetcher alone
            inner = type(loader)._get_iterator(loader)
            fetcher = getattr(inner, "_dataset_fetcher", None)
            if fetcher is not None:
                inner._dataset_fetcher = TimedFetcher(fetcher)
            return _ReceivedHere(inner, self, 0, train) if train else inner
        self.init.generation += 1  # before the pool starts: its workers write this generation
        generation = self.init.generation
        if train:
            self.train_generation = generation
        return _ReceivingIterator(type(loader)._get_iterator(loader), self, generation, train)

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
        """Put the user's collate function and worker_init_fn back; unwrap a live iterator."""
        loader = self.loader
        loader.collate_fn = self.saved["collate_fn"]
        loader.worker_init_fn = self.saved["worker_init_fn"]
        loader.__dict__.pop("_get_iterator", None)
        iterator = loader.__dict__.get("_iterator")
        if isinstance(iterator, _ReceivingIterator):  # a persistent pool lives on unwrapped
            loader.__dict__["_iterator"] = iterator._inner
