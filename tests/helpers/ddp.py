"""Run a function as real N-process DDP ranks on the CPU (gloo) and return each rank's result.

Each rank is a fresh ``spawn`` process with the environment a cluster launcher would set
(``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``NODE_RANK``), so
``Trainer(accelerator="cpu", devices=N, strategy="ddp")`` inside it joins a real process group
through Lightning's normal path for externally launched processes (as under ``torchrun``).

``fn`` must be importable (defined at module level in a test module) and its result picklable.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class DDPRunError(RuntimeError):
    """A rank failed, or the ranks did not finish in time (a deadlock fails, it does not hang)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(
    rank: int,
    world_size: int,
    port: int,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    results: Any,
    extra_env: dict[str, str],
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(world_size),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        NODE_RANK="0",
        LOCAL_WORLD_SIZE=str(world_size),
        **extra_env,
    )
    import torch

    torch.set_num_threads(1)  # two ranks on two cores: no oversubscription
    try:
        results.put((rank, True, fn(*args, **kwargs)))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))


def run_ddp(
    fn: Callable[..., T],
    *args: Any,
    world_size: int = 2,
    timeout: float = 180.0,
    env: dict[str, str] | None = None,
    **kwargs: Any,
) -> list[T]:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks; return results ordered by rank.

    Raises:
        DDPRunError: a rank raised (its traceback is in the message) or the deadline passed.
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=_rank_main,
            args=(rank, world_size, port, fn, args, kwargs, results, dict(env or {})),
            daemon=False,
        )
        for rank in range(world_size)
    ]
    for p in procs:
        p.start()
    out: dict[int, T] = {}
    errors: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) + len(errors) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DDPRunError(
                    f"DDP ranks did not finish within {timeout:.0f} s (deadlock?); "
                    f"finished ranks: {sorted(out)}"
                )
            try:
                rank, ok, value = results.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead and results.empty():
                    raise DDPRunError(
                        f"rank process exited with code {dead[0].exitcode} without a result"
                    ) from None
                continue
            if ok:
                out[rank] = value
            else:
                errors.append(f"rank {rank} failed:\n{value}")
        if errors:
            raise DDPRunError("\n".join(errors))
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    return [out[r] for r in range(world_size)]
