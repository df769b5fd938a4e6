"""Filling a map-style cache before training, in processes that exit when done.

Why processes that exit: decoding leaves its working set behind (the decoder's tables and
buffers, a fragmented heap: about 6 MiB per process for JPEGs, measured in
``benchmarks/cache_peers.py``). A DataLoader worker that fills the cache during epoch 1 keeps
that for the rest of a run with persistent workers; a fill process takes it with it when it
exits, so neither the training process nor its workers ever hold it. The samples themselves go
to the node's arena, which every process maps, so nothing of them stays behind either.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import TYPE_CHECKING, Any, cast

from lightning_speedpack.cache.codec import encode

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from multiprocessing.connection import Connection

    from lightning_speedpack.cache.arena import Arena

__all__ = ["FillResult", "fill_arena", "fill_processes", "missing_indices"]


class RemoteTraceback(Exception):
    """Where a fill process failed: its traceback, shown as the cause of the error raised."""

    def __str__(self) -> str:
        return f'\n"""\n{self.args[0]}"""'


@dataclass(frozen=True)
class FillResult:
    """What a :meth:`~.CachedDataset.fill` did: samples decoded here, and whether space ran out."""

    decoded: int
    budget_exhausted: bool


def fill_processes(processes: Any, local_size: int) -> int:
    """``processes`` checked, or by default this rank's share of the cores it may use."""
    if processes is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        processes = max(1, (cores or 1) // local_size)
    elif isinstance(processes, bool) or not isinstance(processes, int):
        raise TypeError(f"`processes` must be an int or None, got {type(processes).__qualname__}")
    elif processes < 0:
        raise ValueError(f"`processes` must be >= 0 (0: decode in this process), got {processes}")
    return processes if "fork" in mp.get_all_start_methods() else 0


def missing_indices(arena: Arena, n: int, *, local_rank: int = 0, local_size: int = 1) -> list[int]:
    """Indices not yet published, rotated so that ranks filling at once start apart."""
    todo = [i for i in range(n) if not arena.is_ready(i)]
    if local_size > 1 and todo:
        start = len(todo) * local_rank // local_size
        todo = todo[start:] + todo[:start]
    return todo


def _fill_share(arena: Arena, get: Callable[[int], Any], indices: Sequence[int]) -> FillResult:
    """Decode and publish ``indices`` not published meanwhile (another rank may have)."""
    decoded = 0
    for i in indices:
        if arena.is_ready(i):
            continue
        sample = get(i)
        decoded += 1
        arena.count(hit=False)
        if arena.put(i, encode(sample, i)).startswith("budget_exhausted"):
            return FillResult(decoded, True)
    return FillResult(decoded, False)


def _child(arena: Arena, get: Callable[[int], Any], indices: Sequence[int], send: Any) -> None:
    try:
        send.send((_fill_share(arena, get, indices), None, ""))
    except BaseException as err:  # sent back whole: the parent raises it, this traceback as cause
        text = "".join(traceback.format_exception(err))
        try:
            send.send((None, err, text))
        except Exception:  # not picklable: the text says it all
            send.send((None, RuntimeError(text), text))


def fill_arena(
    arena: Arena, get: Callable[[int], Any], indices: list[int], processes: int
) -> FillResult:
    """Decode ``indices`` with ``get`` into ``arena``: here (0) or in forked processes.

    Raises what ``get`` raised in a fill process (the first one to fail), or ``RuntimeError``
    when a fill process died without a word (e.g. killed by the OOM killer); the other fill
    processes are then killed, and what they published stays cached.
    """
    if processes == 0 or not indices:
        return _fill_share(arena, get, indices)
    ctx = mp.get_context("fork")
    running: dict[Connection, Any] = {}
    try:
        for k in range(processes):
            if share := indices[k::processes]:
                recv, send = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_child, args=(arena, get, share, send), daemon=True)
                proc.start()
                send.close()  # the child holds the only writer: its exit means EOF here
                running[recv] = proc
        return _collect(running)
    finally:
        for recv, proc in running.items():
            proc.kill()
            proc.join()
            recv.close()


def _collect(running: dict[Connection, Any]) -> FillResult:
    """Every fill process's result, summed; the first error raised at once."""
    decoded, exhausted = 0, False
    waiting = dict(running)
    while waiting:
        for ready in wait(list(waiting)):
            recv = cast("Connection", ready)
            proc = waiting.pop(recv)
            try:
                message: tuple[FillResult | None, BaseException | None, str] = recv.recv()
            except EOFError:
                proc.join()
                died = RuntimeError(
                    f"a cache fill process died with exit code {proc.exitcode} (e.g. killed by "
                    "the OOM killer); what it published stays cached, the rest fills on access"
                )
                message = (None, died, "")
            result, err, text = message
            if err is not None:  # the caller's `finally` stops the other fill processes
                raise err from (RemoteTraceback(text) if text else None)
            assert result is not None
            decoded += result.decoded
            exhausted = exhausted or result.budget_exhausted
    return FillResult(decoded, exhausted)
