"""The pack's own collectives, bounded in time: a rank that died or is stuck fails the others.

A plain ``all_reduce`` waits for every rank for as long as the process group allows -- 30
minutes by default, and with some backends for ever. When the pack itself starts a collective
(the batch-size tuner's agreement after each trial, the throughput logger's world samples/s), a
rank that raised, was killed or is stuck (e.g. a DataLoader worker deadlocked inside ``fork``)
must not leave the others waiting silently: :func:`bounded_all_reduce` raises
:class:`CollectiveTimeoutError` on the ranks still waiting, naming what they were waiting for,
within :func:`collective_timeout` seconds.

The timeout is the pack's own (:data:`DEFAULT_TIMEOUT_S`, or the environment variable
``LIGHTNING_SPEEDPACK_COLLECTIVE_TIMEOUT`` in seconds, or a callback's argument) but never
longer than the process group's own timeout, so the pack's message comes first.

What it does not do: the timed-out operation cannot be cancelled. The raising rank's process
group is left unusable (its next collective would pair with the abandoned one), and with gloo
the process exits only once the other rank is gone or the process group's own timeout passes.
The error is meant to end the run, with a message that says where it stopped.
"""

from __future__ import annotations

import datetime
import math
import os
import time
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "ENV_TIMEOUT",
    "CollectiveTimeoutError",
    "bounded_all_reduce",
    "collective_timeout",
    "process_group_timeout",
    "validate_timeout",
]

DEFAULT_TIMEOUT_S = 300.0
ENV_TIMEOUT = "LIGHTNING_SPEEDPACK_COLLECTIVE_TIMEOUT"
_MAX_POLL_S = 0.05


class CollectiveTimeoutError(RuntimeError):
    """A collective of the pack did not complete: another rank died, raised or is stuck.

    Example:
        >>> err = CollectiveTimeoutError("ThroughputLogger: world combine at step 10 ...")
        >>> isinstance(err, RuntimeError)
        True
    """


def validate_timeout(name: str, value: Any) -> float:
    """``value`` as float seconds, checked to be a positive, finite number.

    Raises:
        TypeError: ``value`` is not an int or float.
        ValueError: ``value`` is not positive and finite.

    Example:
        >>> validate_timeout("timeout", 2)
        2.0
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"`{name}` must be a number of seconds, got {type(value).__name__} {value!r}"
        )
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"`{name}` must be a positive, finite number of seconds, got {value}")
    return float(value)


def process_group_timeout(group: Any = None) -> float | None:
    """The timeout (seconds) of ``group``'s backend (the default group's), or ``None``.

    Read from the backend's options when it exposes them (gloo and NCCL do); ``None`` when
    ``torch.distributed`` is not initialized or the backend does not say.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return None
    try:
        pg = group if group is not None else dist.distributed_c10d._get_default_group()
        device = torch.device("cpu") if dist.get_backend(pg) == "gloo" else None
        backend = pg._get_backend(device or torch.device("cuda"))
        timeout = backend.options._timeout
    except Exception:  # a backend without options: no cap known
        return None
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else None
    return seconds if seconds and seconds > 0 else None


def collective_timeout(value: float | None = None, group: Any = None) -> float:
    """Seconds the pack waits for one of its collectives.

    ``value`` when given, else ``LIGHTNING_SPEEDPACK_COLLECTIVE_TIMEOUT`` when set, else
    :data:`DEFAULT_TIMEOUT_S`; never longer than the process group's own timeout.

    Raises:
        TypeError: ``value`` is not a number.
        ValueError: ``value`` (or the environment variable) is not a positive, finite number.

    Example:
        >>> collective_timeout(12.5)  # no process group here, so no cap
        12.5
    """
    if value is not None:
        seconds = validate_timeout("collective_timeout", value)
    elif (env := os.environ.get(ENV_TIMEOUT, "").strip()) != "":
        try:
            parsed = float(env)
        except ValueError:
            raise ValueError(f"{ENV_TIMEOUT} must be a number of seconds, got {env!r}") from None
        seconds = validate_timeout(ENV_TIMEOUT, parsed)
    else:
        seconds = DEFAULT_TIMEOUT_S
    cap = process_group_timeout(group)
    return min(seconds, cap) if cap is not None else seconds


def bounded_all_reduce(
    tensor: torch.Tensor,
    *,
    timeout_s: float,
    what: str,
    group: Any = None,
    poll: bool | None = None,
) -> torch.Tensor:
    """Sum ``tensor`` over the ranks in place and return it, or raise within ``timeout_s``.

    Args:
        tensor: the values to sum (on the device the backend needs, e.g. CUDA for NCCL).
        timeout_s: how long to wait for the other ranks.
        what: the start of the error message: who waited for what (e.g. ``"BatchSizeTuner: rank
            agreement for batch size 64 (trial 3)"``).
        group: the process group (default: the world).
        poll: wait by polling ``work.is_completed()`` (any backend) instead of
            ``work.wait(timeout)`` (gloo honours it; NCCL's ``wait`` does not block the host).
            ``None``: poll unless the backend is gloo.

    Raises:
        CollectiveTimeoutError: the other ranks did not join within ``timeout_s`` or the
            operation failed (a peer closed its connection); the backend's error is the cause.
        RuntimeError: ``torch.distributed`` is not initialized.

    Example:
        >>> import torch.distributed as dist
        >>> dist.is_initialized()  # the single-process paths of the pack never call it
        False
    """
    timeout_s = validate_timeout("timeout_s", timeout_s)
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"{what}: torch.distributed is not initialized")
    if poll is None:
        poll = dist.get_backend(group) != "gloo"
    start = time.monotonic()
    try:
        work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group, async_op=True)
        assert work is not None  # async_op=True always returns a Work
        if poll:
            _poll(work, start + timeout_s)
            work.wait()  # completed: raises the backend's error if it failed
        else:
            work.wait(timeout=datetime.timedelta(seconds=timeout_s))
    except _Expired:
        raise _timeout_error(what, timeout_s) from None
    except Exception as err:
        elapsed = time.monotonic() - start
        if elapsed >= timeout_s * 0.99 or "timed out" in str(err).lower():
            raise _timeout_error(what, timeout_s) from err
        raise CollectiveTimeoutError(
            f"{what} failed after {elapsed:.1f} s: another rank died or closed its connection "
            f"({type(err).__name__}: {_first_line(err)})"
        ) from err
    return tensor


class _Expired(Exception):
    pass


def _poll(work: Any, deadline: float) -> None:
    pause = 1e-4
    while not work.is_completed():
        if time.monotonic() >= deadline:
            raise _Expired
        time.sleep(pause)
        pause = min(pause * 2, _MAX_POLL_S)


def _timeout_error(what: str, timeout_s: float) -> CollectiveTimeoutError:
    return CollectiveTimeoutError(
        f"{what} did not complete within {timeout_s:g} s: another rank died or is stuck "
        f"(set {ENV_TIMEOUT} to wait longer)"
    )


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else ""
