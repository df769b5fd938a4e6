"""Run a function as real N-process DDP ranks on the CPU (gloo) and return each rank's result.

Each rank is a fresh ``spawn`` process with the environment a cluster launcher would set
(``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``NODE_RANK``), so
``Trainer(accelerator="cpu", devices=N, strategy="ddp")`` inside it joins a real process group
through Lightning's normal path for externally launched processes (as under ``torchrun``).

Nothing outlives a run: each rank first makes itself a session leader (``os.setsid``), so it and
everything it starts (DataLoader workers, their orphans) can be found and killed together. When
the deadline passes, the Python stack of every process of every rank's session goes into the
:class:`DDPTimeout` message (``py-spy dump``; without py-spy, each rank's own ``faulthandler``
dump on ``SIGUSR1``), then all of them are killed. After a run, whatever is still alive in the
ranks' sessions is killed too.

``fn`` must be importable (defined at module level in a test module) and its result picklable.
"""

from __future__ import annotations

import faulthandler
import multiprocessing as mp
import os
import queue
import signal
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tests.helpers.procs import (
    TOKEN_VARIABLE,
    ProcessTimeout,
    describe,
    kill_sessions,
    new_token,
    py_spy,
    session_processes,
    stacks,
)

__all__ = ["DDPRunError", "DDPTimeout", "free_port", "run_ddp"]

T = TypeVar("T")


class DDPRunError(RuntimeError):
    """A rank failed, or the ranks did not finish in time (a deadlock fails, it does not hang)."""


class DDPTimeout(DDPRunError, ProcessTimeout):
    """The ranks did not finish in time; the message holds every process's Python stack."""


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
    stack_dir: str,
) -> None:
    os.setsid()  # this rank and all it starts form one session, killed together
    stack_file = open(Path(stack_dir) / f"rank{rank}.txt", "w")  # noqa: SIM115 (lives with us)
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
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


def _faulthandler_stacks(procs: list[Any], stack_dir: str) -> str:
    """Without py-spy: each rank writes its own threads' stacks on SIGUSR1."""
    for p in procs:
        if p.is_alive() and p.pid is not None:
            os.kill(p.pid, signal.SIGUSR1)
    time.sleep(1.0)
    return "\n".join(
        f"--- {f.stem} (faulthandler)\n{f.read_text()}" for f in sorted(Path(stack_dir).iterdir())
    )


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
        DDPRunError: a rank raised (its traceback is in the message) or exited without a result.
        DDPTimeout: the deadline passed (a :class:`DDPRunError` too); the message has the Python
            stack of every process the ranks had started, all killed since.
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    token = new_token()
    with tempfile.TemporaryDirectory(prefix="ddp-stacks-") as stack_dir:
        rank_env = dict(env or {})
        procs = [
            ctx.Process(
                target=_rank_main,
                args=(
                    rank,
                    world_size,
                    port,
                    fn,
                    args,
                    kwargs,
                    results,
                    rank_env,
                    stack_dir,
                ),
                daemon=False,
            )
            for rank in range(world_size)
        ]
        # The token goes into the ranks' inherited environment: it finds their descendants even
        # if one leaves the rank's session.
        previous = os.environ.get(TOKEN_VARIABLE)
        os.environ[TOKEN_VARIABLE] = token
        try:
            for p in procs:
                p.start()
        finally:
            if previous is None:
                del os.environ[TOKEN_VARIABLE]
            else:
                os.environ[TOKEN_VARIABLE] = previous
        sids = [p.pid for p in procs if p.pid is not None]
        out: dict[int, T] = {}
        errors: list[str] = []
        deadline = time.monotonic() + timeout
        try:
            while len(out) + len(errors) < world_size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    members = session_processes(sids, token)
                    if py_spy() is not None:
                        dump = stacks(members)
                    else:
                        dump = _faulthandler_stacks(procs, stack_dir)
                    listing = "\n".join(describe(m) for m in members)
                    raise DDPTimeout(
                        f"DDP ranks did not finish within {timeout:.0f} s (deadlock?); "
                        f"finished ranks: {sorted(out)}; killed {len(members)} processes:\n"
                        f"{listing}\n\n=== Python stacks ===\n{dump}",
                        dump=dump,
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
            for p in procs:  # ranks that returned normally exit on their own
                p.join(timeout=10)
        finally:
            kill_sessions(sids, token)
            for p in procs:
                p.join(timeout=10)
            results.close()
            results.join_thread()
    return [out[r] for r in range(world_size)]
