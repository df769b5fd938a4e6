"""What each rank sends to rank 0 at the end of fit, and how it gets there.

A rank's *payload* is a small JSON object: who it is (rank, host, node, local rank), what it
trained on (wall time, samples, batches, batch sizes), its own step clock (:class:`StepClock`:
the time between batches, inside a batch and inside backward, per epoch too), every scalar
figure its diagnostics publish (:func:`scalar_figures`, whichever diagnostics are attached), the
digests of its first batches (:mod:`~lightning_speedpack.world.same_batches`) and its findings in
short. :func:`gather_world` brings every rank's payload to rank 0 in one bounded
exchange (:func:`~lightning_speedpack.core.collectives.bounded_gather_bytes`), once per fit: no
rank waits in it for any other but rank 0, and rank 0 for no rank longer than
:func:`gather_timeout`. Nothing here runs inside the training step.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lightning_speedpack.core.collectives import (
    ENV_TIMEOUT,
    bounded_gather_bytes,
    collective_timeout,
)
from lightning_speedpack.core.cpu_wait import thread_cpu_wait_s
from lightning_speedpack.core.findings import Finding
from lightning_speedpack.world.stalls import BatchTally

__all__ = [
    "GATHER_TIMEOUT_S",
    "GatheredWorld",
    "StepClock",
    "finding_items",
    "gather_timeout",
    "gather_world",
    "node_identity",
    "scalar_figures",
]

#: How long rank 0 waits for the other ranks' figures at the end of fit, unless
#: ``LIGHTNING_SPEEDPACK_COLLECTIVE_TIMEOUT`` says otherwise.
GATHER_TIMEOUT_S = 30.0
#: Longest string figure a rank sends (a verdict is ~120 characters; a table is not a figure).
_MAX_TEXT = 400
#: Longest finding message a rank sends (enough for the rank-0 report to quote it).
_MAX_MESSAGE = 600

_NODE_VARIABLES = ("GROUP_RANK", "SLURM_NODEID", "NODE_RANK")
_LOCAL_VARIABLES = ("LOCAL_RANK", "SLURM_LOCALID")


def _first_int(names: Iterable[str]) -> int | None:
    for name in names:
        value = os.environ.get(name, "").strip()
        if value.lstrip("-").isdigit():
            return int(value)
    return None


def node_identity() -> dict[str, Any]:
    """``host`` (``socket.gethostname()``), ``node`` and ``local_rank`` from the launcher's env.

    The node is the first of ``GROUP_RANK`` (torchrun), ``SLURM_NODEID`` (srun) and
    ``NODE_RANK`` (Lightning) that is set, else ``None``; the local rank ``LOCAL_RANK``, else
    ``SLURM_LOCALID``.

    Example:
        >>> sorted(node_identity())
        ['host', 'local_rank', 'node']
    """
    return {
        "host": socket.gethostname(),
        "node": _first_int(_NODE_VARIABLES),
        "local_rank": _first_int(_LOCAL_VARIABLES),
    }


def scalar_figures(figures: Mapping[str, Any], depth: int = 3) -> dict[str, Any]:
    """Plain scalars of a diagnostic's figures, nested dicts flattened with ``/``, lists left out.

    Strings longer than a figure (a table in a message) are left out too; numpy numbers become
    Python numbers; anything else (a tensor) is left out: reading it would be a device sync.

    Example:
        >>> scalar_figures({"verdict": "data-bound", "phase_ms": {"backward": 3.5},
        ...                 "wall_time": {"parts": {"setup": 1.0}}, "series": [[1, 2.0]]})
        {'verdict': 'data-bound', 'phase_ms/backward': 3.5, 'wall_time/parts/setup': 1.0}
    """
    out: dict[str, Any] = {}

    def visit(prefix: str, value: Any, level: int) -> None:
        if isinstance(value, Mapping):
            if level < depth:
                for key, inner in value.items():
                    visit(f"{prefix}/{key}" if prefix else str(key), inner, level + 1)
            return
        plain = _plain(value)
        if plain is not _SKIP:
            out[prefix] = plain

    visit("", figures, 0)
    return out


_SKIP = object()


def _plain(value: Any) -> Any:
    import numbers

    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return value if len(value) <= _MAX_TEXT else _SKIP
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if number == number and abs(number) != float("inf") else None
    return _SKIP


def finding_items(findings: Iterable[Finding]) -> list[dict[str, Any]]:
    """A rank's findings in short (no figures; messages cut at 600 characters), for its payload.

    Example:
        >>> finding_items([Finding("wall_time", "cpu-threads", "8 threads on 2 cores")])
        [{'component': 'wall_time', 'id': 'cpu-threads', 'severity': 'warning', \
'message': '8 threads on 2 cores', 'fix': None, 'location': None}]
    """
    return [
        {
            "component": f.component,
            "id": f.id,
            "severity": f.severity,
            "message": f.message[:_MAX_MESSAGE],
            "fix": f.fix,
            "location": f.location,
        }
        for f in findings
    ]


@dataclass
class _Epoch:
    epoch: int
    batches: int = 0
    span_s: float = 0.0
    gap_s: float = 0.0
    gaps: int = 0
    backward_s: float = 0.0
    cpu_wait_s: float | None = None  # the training thread's wait for a CPU in the epoch
    start_s: float = 0.0  # the gaps' time in Lightning's broadcast before each fetch

    def row(self) -> list[float | None]:
        return [
            self.epoch,
            self.batches,
            round(self.span_s, 6),
            round(self.gap_s, 6),
            self.gaps,
            round(self.backward_s, 6),
            None if self.cpu_wait_s is None else round(self.cpu_wait_s, 6),
            round(self.start_s, 6),
        ]


@dataclass
class StepClock:
    """A rank's own clock of its training batches, fed ``time.perf_counter()`` values by hooks.

    Three spans a batch: the *gap* from the end of one batch to the start of the next in the
    same epoch (the fetch, the copy, hooks between batches; validation in between is left
    out), the *span* from its start to its end (forward, backward, optimizer, the batch-end
    hooks) and *backward* (Lightning's ``on_before_backward`` to ``on_after_backward``: under
    DDP this is where a rank waits for the slowest one in the gradient all-reduce). Summed for
    the run and per epoch; nothing here touches a device or another rank. Each epoch also keeps
    the training thread's wait for a CPU (``cpu_wait``, read at the epoch's start and end:
    :func:`~lightning_speedpack.core.cpu_wait.thread_cpu_wait_s`; validation run inside the
    epoch counts too), which tells a rank kept off the CPU in that epoch from one whose data or
    code was slower. Under DDP a gap also holds Lightning's per-batch broadcast from rank 0
    (``_broadcast_sigterm_tensor``, before the fetch), where the ranks wait for one still busy
    after the previous all-reduce (its optimizer step, its batch-end hooks): told how long each
    took (:meth:`broadcast_wait`), the clock keeps that *start* part of the gap apart, a wait
    like backward's. Each batch's own time (gap + span - backward - start) and its waits
    (backward + start) go to a :class:`~lightning_speedpack.world.stalls.BatchTally`, from
    which rank 0 tells a rank that stalls now and then.

    Example:
        >>> clock = StepClock()
        >>> clock.epoch_start(0)
        >>> for t in (0.0, 0.1):
        ...     clock.batch_start(t)
        ...     clock.backward_start(t + 0.01)
        ...     clock.backward_end(t + 0.03)
        ...     clock.batch_end(t + 0.04, 8)
        >>> clock.epoch_end()
        >>> figures = clock.figures()
        >>> figures["batches"], round(figures["cycle_ms"], 1), round(figures["gap_ms"], 1)
        (2, 100.0, 60.0)
    """

    epochs: list[_Epoch] = field(default_factory=list)
    #: Seconds the training thread has waited for a CPU so far (None where the kernel does
    #: not say): read twice an epoch, never in a batch.
    cpu_wait: Callable[[], float | None] = thread_cpu_wait_s
    batch_size_min: int | None = None
    batch_size_max: int | None = None
    _last_end: float | None = None
    _start: float | None = None
    _backward: float | None = None
    _paused_at: float | None = None
    _paused_s: float = 0.0
    _epoch_cpu_wait: float | None = None
    tally: BatchTally = field(default_factory=BatchTally)
    _gap: float = 0.0  # this batch's gap (0 for an epoch's first)
    _start_wait: float = 0.0  # the broadcast's part of it
    _backward_s: float = 0.0  # this batch's backward so far
    _broadcast: float = 0.0  # the broadcast's seconds before this batch, if told
    _size: int = -1  # the last batch's size

    def _current(self) -> _Epoch:
        if not self.epochs:
            self.epochs.append(_Epoch(0))
        return self.epochs[-1]

    def epoch_start(self, epoch: int) -> None:
        """A training epoch begins: its first batch has no gap before it."""
        self.epochs.append(_Epoch(int(epoch)))
        self._last_end = None
        self._epoch_cpu_wait = self.cpu_wait()

    def epoch_end(self) -> None:
        """A training epoch ended."""
        self._last_end = None
        start, self._epoch_cpu_wait = self._epoch_cpu_wait, None
        end = self.cpu_wait() if start is not None else None
        if self.epochs and start is not None and end is not None:
            self.epochs[-1].cpu_wait_s = max(end - start, 0.0)

    def pause(self, now: float) -> None:
        """Validation starts: the time until :meth:`resume` is not the batches'."""
        self._paused_at = now

    def resume(self, now: float) -> None:
        """Validation ended."""
        if self._paused_at is not None:
            self._paused_s += now - self._paused_at
            self._paused_at = None

    def broadcast_wait(self, seconds: float) -> None:
        """Lightning's broadcast before the next batch took ``seconds`` (its wait, mostly)."""
        self._broadcast += seconds

    def batch_start(self, now: float) -> None:
        """A training batch starts (after its fetch and copy)."""
        epoch = self.epochs[-1] if self.epochs else self._current()  # no call a batch
        gap = start = 0.0
        if self._last_end is not None:
            gap = max(now - self._last_end - self._paused_s, 0.0)
            epoch.gap_s += gap
            epoch.gaps += 1
            if self._broadcast:
                start = min(self._broadcast, gap)
                epoch.start_s += start
        self._gap, self._start_wait, self._backward_s = gap, start, 0.0
        self._paused_s = self._broadcast = 0.0
        self._start = now

    def backward_start(self, now: float) -> None:
        """``on_before_backward``."""
        self._backward = now

    def backward_end(self, now: float) -> None:
        """``on_after_backward``."""
        if self._backward is not None:  # the epoch's share is added at the batch's end
            self._backward_s += now - self._backward
            self._backward = None

    def batch_end(self, now: float, size: int) -> None:
        """A training batch ended; ``size`` is its batch size as the recorder counted it."""
        epoch = self.epochs[-1] if self.epochs else self._current()
        if self._start is not None:
            span = now - self._start
            epoch.span_s += span
            epoch.batches += 1
            epoch.backward_s += self._backward_s
            waited = self._backward_s + self._start_wait
            own = max(span + self._gap - waited, 0.0)
            gap = self._gap - self._start_wait
            self.tally.add(own, waited, gap, epoch.epoch, epoch.batches - 1)
        self._start = None
        self._last_end = now
        self._paused_s = 0.0
        if size != self._size:  # the smallest and largest change rarely: one compare a batch
            self._sized(size)

    def _sized(self, size: int) -> None:
        self._size = size
        low, high = self.batch_size_min, self.batch_size_max
        self.batch_size_min = size if low is None else min(low, size)
        self.batch_size_max = size if high is None else max(high, size)

    def figures(self) -> dict[str, Any]:
        """The clock's figures: means per batch, batch sizes, and a row per epoch.

        ``batches``, ``cycle_ms``, ``gap_ms``, ``span_ms``, ``backward_ms`` (per batch),
        ``start_ms`` (per gap: the broadcast's part; 0 unless told), the
        batch sizes seen and ``epochs`` (a row per epoch: epoch, batches, span s, gap s, gaps,
        backward s, CPU wait s or None, start s) and ``tally`` (:meth:`BatchTally.figures
        <lightning_speedpack.world.stalls.BatchTally.figures>`).
        """
        batches = sum(e.batches for e in self.epochs)
        gaps = sum(e.gaps for e in self.epochs)
        span = sum(e.span_s for e in self.epochs)
        gap = sum(e.gap_s for e in self.epochs)
        backward = sum(e.backward_s for e in self.epochs)
        start = sum(e.start_s for e in self.epochs)
        span_ms = 1000.0 * span / batches if batches else 0.0
        gap_ms = 1000.0 * gap / gaps if gaps else 0.0
        return {
            "batches": batches,
            "cycle_ms": span_ms + gap_ms,
            "gap_ms": gap_ms,
            "span_ms": span_ms,
            "backward_ms": 1000.0 * backward / batches if batches else 0.0,
            "start_ms": 1000.0 * start / gaps if gaps else 0.0,
            "batch_size_min": self.batch_size_min,
            "batch_size_max": self.batch_size_max,
            "epochs": [e.row() for e in self.epochs if e.batches],
            "tally": self.tally.figures(),
        }


@dataclass
class GatheredWorld:
    """Every rank's payload (decoded), by rank, and a line per rank that did not answer."""

    payloads: dict[int, dict[str, Any]]
    missing: list[str]


def gather_timeout() -> float:
    """Seconds rank 0 waits for the other ranks' figures.

    ``LIGHTNING_SPEEDPACK_COLLECTIVE_TIMEOUT`` when set, else :data:`GATHER_TIMEOUT_S`; never
    longer than the process group's own timeout.
    """
    if os.environ.get(ENV_TIMEOUT, "").strip():
        return collective_timeout()
    return min(GATHER_TIMEOUT_S, collective_timeout())


def gather_world(payload: dict[str, Any], timeout_s: float | None = None) -> GatheredWorld | None:
    """Bring every rank's ``payload`` to rank 0 (JSON); ``None`` on the other ranks.

    Without a process group (one rank) it is this rank's payload alone. A payload that does not
    decode counts as missing, with the reason.

    Example:
        >>> gather_world({"rank": 0, "samples": 8}).payloads
        {0: {'rank': 0, 'samples': 8}}
    """
    data = json.dumps(payload, default=str, separators=(",", ":")).encode()
    gathered = bounded_gather_bytes(
        data, timeout_s=gather_timeout() if timeout_s is None else timeout_s
    )
    if gathered is None:
        return None
    decoded: dict[int, dict[str, Any]] = {}
    missing = list(gathered.missing.values())
    for rank, raw in gathered.payloads.items():
        try:
            item = json.loads(raw.decode())
        except (UnicodeDecodeError, ValueError) as err:
            missing.append(f"rank {rank}: its figures did not decode ({err})")
            continue
        if isinstance(item, dict):
            decoded[rank] = item
    return GatheredWorld(decoded, missing)
