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

:func:`bounded_gather_bytes` is the other shape: every rank sends a few bytes to one rank
(``dst``, rank 0) by point-to-point messages, and ``dst`` waits for each with one deadline. A rank
that died or hangs costs a line in the result (``"rank 3: no answer in 30 s"``), never the
others' run: nothing raises, and the ranks that answered are all there.
"""

from __future__ import annotations

import datetime
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "ENV_TIMEOUT",
    "CollectiveTimeoutError",
    "Gathered",
    "bounded_all_reduce",
    "bounded_gather_bytes",
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


# ---------------------------------------------------------------- gather to one rank, bounded

_LENGTH_TAG = 37_001  # gloo matches point-to-point messages by tag; NCCL ignores tags
_PAYLOAD_TAG = 37_002


@dataclass
class Gathered:
    """What :func:`bounded_gather_bytes` brought to ``dst``.

    Attributes:
        payloads: the bytes of every rank that answered, by rank (``dst``'s own included).
        missing: a line per rank that did not answer: ``{3: "rank 3: no answer in 30 s"}``.
    """

    payloads: dict[int, bytes] = field(default_factory=dict)
    missing: dict[int, str] = field(default_factory=dict)


def _group_device(group: Any) -> torch.device:
    # NCCL moves CUDA tensors only; gloo (and anything else) CPU tensors.
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def bounded_gather_bytes(
    payload: bytes,
    *,
    timeout_s: float,
    dst: int = 0,
    group: Any = None,
    device: torch.device | None = None,
    poll: bool | None = None,
) -> Gathered | None:
    """Bring every rank's ``payload`` to rank ``dst`` within ``timeout_s``; never raise for a peer.

    Each other rank sends two messages to ``dst``: the length (one int64), then the bytes (a
    uint8 tensor on ``device``: CUDA for NCCL, CPU for gloo). ``dst`` posts a receive per rank
    and waits for all of them against one deadline; a rank that does not answer in time, or
    whose connection failed, gets a line in :attr:`Gathered.missing` and the others are kept.
    A sender waits for ``dst`` to take its messages (a gloo send completes only then) for up
    to twice ``timeout_s`` and then gives up silently (``dst`` has left or is stuck: it has no
    report to make). With gloo, a send or receive that gives up closes that pair's connection.

    Not a collective in the strict sense: no rank waits for any rank but ``dst``, and ``dst``
    for nobody longer than ``timeout_s``. A receive that never completes cannot be cancelled:
    with NCCL it stays queued on the communication stream (a later operation between the same
    ranks waits behind it), so call this once, at the end (untested here: no CUDA machine).

    Args:
        payload: this rank's bytes (e.g. JSON).
        timeout_s: how long ``dst`` waits for the others (and a sender for ``dst``).
        dst: the rank that gathers (global rank).
        group: the process group (default: the world); ranks are global ranks.
        device: where the message tensors live (default: by the backend, see above).
        poll: wait by polling ``work.is_completed()`` (NCCL) instead of ``work.wait(timeout)``
            (gloo, whose point-to-point work completes only inside ``wait``). ``None``: poll
            unless the backend is gloo.

    Returns:
        On ``dst``, a :class:`Gathered`; on the other ranks ``None``. Without an initialized
        process group (or a world of one), ``Gathered({dst: payload})``.

    Raises:
        TypeError: ``payload`` is not bytes.
        ValueError: ``timeout_s`` is not a positive, finite number.

    Example:
        >>> bounded_gather_bytes(b'{"rank": 0}', timeout_s=1).payloads  # no process group
        {0: b'{"rank": 0}'}
    """
    if not isinstance(payload, (bytes, bytearray)):
        raise TypeError(f"`payload` must be bytes, got {type(payload).__name__}")
    timeout_s = validate_timeout("timeout_s", timeout_s)
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) < 2:
        return Gathered(payloads={dst: bytes(payload)})
    ranks = dist.get_process_group_ranks(group) if group is not None else None
    me = dist.get_rank()
    others = [r for r in (ranks or range(dist.get_world_size())) if r != dst]
    device = device or _group_device(group)
    if poll is None:
        poll = dist.get_backend(group) != "gloo"
    deadline = time.monotonic() + timeout_s
    if me != dst:
        # Twice as long: `dst` may come late (its own end-of-fit work), and with gloo a send
        # that gives up closes the connection, so `dst` should be the first to give up.
        _send(payload, dst, group, device, deadline + timeout_s, poll)
        return None
    gathered = Gathered(payloads={dst: bytes(payload)})
    lengths = {r: torch.zeros(1, dtype=torch.int64, device=device) for r in others}
    posted = {r: dist.irecv(lengths[r], src=r, group=group, tag=_LENGTH_TAG) for r in others}
    bodies: dict[int, tuple[torch.Tensor, Any]] = {}
    for rank in others:
        problem = _finish(posted[rank], deadline, poll)
        if problem is None:
            size = int(lengths[rank].item())  # once per fit, after the message arrived
            body = torch.empty(max(size, 0), dtype=torch.uint8, device=device)
            work = dist.irecv(body, src=rank, group=group, tag=_PAYLOAD_TAG)
            bodies[rank] = (body, work)
        else:
            gathered.missing[rank] = _missing_line(rank, problem, timeout_s)
    for rank, (body, work) in bodies.items():
        problem = _finish(work, deadline, poll)
        if problem is None:
            gathered.payloads[rank] = body.cpu().numpy().tobytes()
        else:
            gathered.missing[rank] = _missing_line(rank, problem, timeout_s)
    gathered.payloads = dict(sorted(gathered.payloads.items()))
    gathered.missing = dict(sorted(gathered.missing.items()))
    return gathered


def _send(
    payload: bytes, dst: int, group: Any, device: torch.device, deadline: float, poll: bool
) -> None:
    data = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else None
    length = torch.tensor([len(payload)], dtype=torch.int64, device=device)
    body = data.to(device) if data is not None else torch.empty(0, dtype=torch.uint8, device=device)
    try:
        first = dist.isend(length, dst=dst, group=group, tag=_LENGTH_TAG)
        second = dist.isend(body, dst=dst, group=group, tag=_PAYLOAD_TAG)
    except Exception:  # dst has gone: nobody to tell
        return
    for work in (first, second):
        if _finish(work, deadline, poll) is not None:
            return


def _finish(work: Any, deadline: float, poll: bool) -> str | None:
    """Wait for ``work`` until ``deadline``: None when it completed, else why not."""
    try:
        if poll:
            _poll(work, deadline)
            work.wait()
        else:
            remaining = max(deadline - time.monotonic(), 0.001)
            work.wait(timeout=datetime.timedelta(seconds=remaining))
    except _Expired:
        return "timeout"
    except Exception as err:
        if time.monotonic() >= deadline - 0.01 or "timed out" in str(err).lower():
            return "timeout"
        return f"{type(err).__name__}: {_first_line(err)}"
    return None


def _missing_line(rank: int, problem: str, timeout_s: float) -> str:
    if problem == "timeout":
        return f"rank {rank}: no answer in {timeout_s:g} s"
    return f"rank {rank}: its message failed ({problem})"
