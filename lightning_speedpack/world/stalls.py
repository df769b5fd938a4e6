"""A rank that stalls now and then: the few batches every other rank waits for, counted.

A straggler is slow in most of its steps (:func:`~lightning_speedpack.world.engine.find_straggler`).
A rank can instead keep pace in most batches and stall in a few: a plot or a file written every
N batches on one rank, a cold read, Python's garbage collector. Its mean own time grows while
the others' typical wait does not (no straggler is named), and rank 0's own report counts its
wait as its ``backward``. So each rank tallies, on its own clock, each batch's *waits* (its
``backward``, where DDP waits for the slowest rank in the gradient all-reduce, and the part of
the gap before its fetch, where Lightning's per-batch broadcast waits for a late rank 0) and
its *own* time (the gap and the span less those waits), in power-of-two buckets
(:class:`BatchTally`, a few lines a batch), with its few longest batches; at the end of fit
rank 0 reads every rank's tally (:func:`find_stalls`):

- a rank's *typical* batch is the mean of the bucket that holds its median;
- a *stall* is a batch whose own time is at least :data:`STALL_FACTOR` times the typical and
  :data:`STALL_MIN_MS` above it (counted where its whole bucket is: a stall just above the line
  may be left out, never a typical batch counted in);
- the others *waited* for it: their waits beyond their typical ones, in the batches whose
  waits exceeded it by as much (their buckets wholly above, again);
- named when the rank's stall time is at least :data:`STALL_DOMINANCE` times any other rank's
  (ranks that all hiccup alike are the host's noise, not one rank's work), the others waited at
  least :data:`~lightning_speedpack.world.engine.CONFIRM_FRACTION` of it, and that wait is
  :data:`STALL_SHARE` of their training loop and :data:`STALL_MIN_S` or more.

The first :data:`WARMUP_BATCHES` batches of a fit are left out (DDP builds its buckets there).
"""

from __future__ import annotations

import heapq
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from math import frexp
from typing import Any

from lightning_speedpack.world.buckets import beyond, bucket_rows, typical_s
from lightning_speedpack.world.engine import (
    CONFIRM_FRACTION,
    CPU_WAIT,
    IN_ALL_REDUCE,
    Straggler,
    kept_off_cpu,
    median,
    top_callback,
    waited_where,
)

__all__ = [
    "LONGEST_KEPT",
    "STALL_DOMINANCE",
    "STALL_FACTOR",
    "STALL_MIN_MS",
    "STALL_MIN_S",
    "STALL_SHARE",
    "WARMUP_BATCHES",
    "BatchTally",
    "Stalls",
    "find_stalls",
    "rank_stalls",
]

#: A stall's own time is at least this many times the rank's typical batch ...
STALL_FACTOR = 4.0
#: ... and at least this many ms above it.
STALL_MIN_MS = 20.0
#: The stalling rank's stall time is at least this many times any other rank's.
STALL_DOMINANCE = 2.0
#: The others' wait for the stalls is at least this share of their training loop ...
STALL_SHARE = 0.05
#: ... and this many seconds (a rank's mean) or more.
STALL_MIN_S = 0.25
#: Batches at the start of a fit that are not tallied.
WARMUP_BATCHES = 3
#: The longest batches a rank keeps (their epoch and index name them in the finding).
LONGEST_KEPT = 8


@dataclass
class BatchTally:
    """One rank's batches in power-of-two buckets of own time and of waits, and its longest.

    Fed once a batch by :class:`~lightning_speedpack.world.payload.StepClock`, in seconds
    (:mod:`~lightning_speedpack.world.buckets`).

    Example:
        >>> tally = BatchTally(warmup=0)
        >>> for i in range(10):
        ...     tally.add(0.15 if i == 5 else 0.005, 0.002, 0.001, epoch=0, batch=i)
        >>> figures = tally.figures()
        >>> figures["longest"][0]
        [150.0, 0, 5, 1.0]
        >>> sum(n for _, n, _ in figures["own"])
        10
    """

    warmup: int = WARMUP_BATCHES
    keep: int = LONGEST_KEPT
    seen: int = 0
    own_n: defaultdict[int, int] = field(default_factory=lambda: defaultdict(int))
    own_s: defaultdict[int, float] = field(default_factory=lambda: defaultdict(float))
    wait_n: defaultdict[int, int] = field(default_factory=lambda: defaultdict(int))
    wait_s: defaultdict[int, float] = field(default_factory=lambda: defaultdict(float))
    longest: list[tuple[float, int, int, float]] = field(default_factory=list)  # a min-heap
    _floor: float = -1.0  # the shortest of the longest kept, once `keep` are kept

    def add(self, own: float, waited: float, gap: float, epoch: int, batch: int) -> None:
        """One batch: its own seconds, its waits' (backward, the broadcast), its data wait's."""
        self.seen += 1
        if self.seen <= self.warmup:
            return
        e = frexp(own)[1]
        self.own_n[e] += 1
        self.own_s[e] += own
        e = frexp(waited)[1]
        self.wait_n[e] += 1
        self.wait_s[e] += waited
        if own > self._floor:
            self._keep((own, epoch, batch, gap))

    def _keep(self, item: tuple[float, int, int, float]) -> None:
        if len(self.longest) < self.keep:
            heapq.heappush(self.longest, item)
            if len(self.longest) == self.keep:
                self._floor = self.longest[0][0]
        else:
            heapq.heappushpop(self.longest, item)
            self._floor = self.longest[0][0]

    def figures(self) -> dict[str, Any]:
        """``own`` and ``waits`` (``[exponent, batches, seconds]`` per bucket) and ``longest``.

        ``longest``: ``[own ms, epoch, batch index, data wait ms]``, longest first (the data
        wait: the gap before the batch, less the broadcast's wait).
        """
        return {
            "own": bucket_rows(self.own_n, self.own_s),
            "waits": bucket_rows(self.wait_n, self.wait_s),
            "longest": [
                [round(1000.0 * own, 3), epoch, batch, round(1000.0 * gap, 3)]
                for own, epoch, batch, gap in sorted(self.longest, reverse=True)
            ],
        }


@dataclass
class Stalls:
    """The rank whose few long batches the others waited for, and what they cost."""

    rank: int
    node: Any
    host: Any
    stalls: int  # its batches counted as stalls
    batches: int  # its batches tallied
    typical_ms: float  # its typical batch's own time
    longest: list[list[float]]  # [own ms, epoch, batch, data wait ms] of its longest stalls
    excess_s: float  # its stalls' time beyond its typical batch
    part: str  # "data wait", "training step", "callbacks" or CPU_WAIT
    waited_s: float  # the others' wait for them (mean per rank)
    loop_fraction: float  # of their training loop
    others: int
    callback: str | None = None  # the callback whose hooks are the part, when it is "callbacks"
    waited_in: str = IN_ALL_REDUCE  # where the others waited (waited_where)

    def to_dict(self) -> dict[str, Any]:
        """The stalls as plain values (for the JSON report)."""
        return asdict(self)


def rank_stalls(tally: Mapping[str, Any]) -> dict[str, Any]:
    """One rank's typical own time a batch (ms), its stalls and their time beyond it (s).

    What its row in the world table carries (``own_typical_ms``, ``stall_batches``,
    ``stall_s``), whether or not it is the rank named.

    Example:
        >>> rank_stalls({"own": [[-7, 60, 0.3], [-2, 4, 0.6]]})
        {'own_typical_ms': 5.0, 'stall_batches': 4, 'stall_s': 0.58}
        >>> rank_stalls({})
        {}
    """
    if not tally.get("own"):
        return {}
    typical, _, count, excess = _excess(tally)
    return {
        "own_typical_ms": round(1000.0 * typical, 3),
        "stall_batches": count,
        "stall_s": round(excess, 3),
    }


def _excess(tally: Mapping[str, Any]) -> tuple[float, float, int, float]:
    # (typical s, least stall excess s, stalls, their excess s) of one rank's own time
    typical = typical_s(tally.get("own") or [])
    least = max((STALL_FACTOR - 1.0) * typical, STALL_MIN_MS / 1000.0)
    count, excess = beyond(tally.get("own") or [], typical, least)
    return typical, least, count, excess


def _waited(tally: Mapping[str, Any], least: float) -> float:
    hist = tally.get("waits") or []
    return beyond(hist, typical_s(hist), least)[1]


def find_stalls(
    tallies: Mapping[int, Mapping[str, Any]],
    rows: Sequence[Mapping[str, Any]],
    straggler: Straggler | None = None,
) -> Stalls | None:
    """The rank that stalls now and then and that the others waited for, or None.

    ``tallies``: each rank's :meth:`BatchTally.figures`; ``rows``: the world rows (node, host,
    batches, cycle, CPU wait). None with a straggler that moves between epochs (the data's
    cost), or when the stalling rank is the straggler (its finding says it).

    Example:
        >>> calm = {"own": [[-7, 60, 0.3]], "waits": [[-8, 56, 0.17], [-2, 4, 0.59]]}
        >>> stalling = {"own": [[-7, 60, 0.3], [-2, 4, 0.6]], "waits": [[-8, 64, 0.19]],
        ...             "longest": [[150.0, 0, 8, 0.4], [150.0, 0, 24, 0.4], [5.0, 0, 3, 0.4]]}
        >>> rows = [{"rank": 0, "batches": 64, "cycle_ms": 14.0},
        ...         {"rank": 1, "batches": 64, "cycle_ms": 14.0}]
        >>> s = find_stalls({0: calm, 1: stalling}, rows)
        >>> s.rank, s.stalls, s.part, s.waited_s, [x[2] for x in s.longest]
        (1, 4, 'training step', 0.578, [8, 24])
    """
    if straggler is not None and straggler.moving:
        return None
    by_rank = {int(r["rank"]): r for r in rows if "rank" in r}
    judged = {r: _excess(t) for r, t in tallies.items() if r in by_rank and t.get("own")}
    if len(judged) < 2:
        return None
    rank = max(judged, key=lambda r: judged[r][3])
    typical, least, count, excess = judged[rank]
    if count == 0 or (straggler is not None and straggler.rank == rank):
        return None
    if any(judged[r][3] * STALL_DOMINANCE > excess for r in judged if r != rank):
        return None
    others = [r for r in judged if r != rank]
    waited = statistics.fmean(_waited(tallies[r], least) for r in others)
    loops = [_loop_s(by_rank[r]) for r in others]
    loop = statistics.fmean(loops)
    if waited < CONFIRM_FRACTION * excess or waited < STALL_MIN_S or loop <= 0:
        return None
    if waited < STALL_SHARE * loop:
        return None
    row = by_rank[rank]
    longest = [x for x in tallies[rank].get("longest") or [] if x[0] >= 1000.0 * (typical + least)]
    them = [by_rank[r] for r in others]
    part = _part(longest, row, them, excess)
    return Stalls(
        rank=rank,
        node=row.get("node"),
        host=row.get("host"),
        stalls=count,
        batches=sum(int(n) for _, n, _ in tallies[rank]["own"]),
        typical_ms=round(1000.0 * typical, 3),
        longest=[list(x) for x in longest],
        excess_s=round(excess, 3),
        part=part,
        waited_s=round(waited, 3),
        loop_fraction=round(min(waited / loop, 1.0), 4),
        others=len(others),
        callback=top_callback(row, them) if part == "callbacks" else None,
        waited_in=waited_where(them),
    )


def _loop_s(row: Mapping[str, Any]) -> float:
    return float(row.get("cycle_ms") or 0.0) * int(row.get("batches") or 0) / 1000.0


def _part(
    longest: Sequence[Sequence[float]],
    row: Mapping[str, Any],
    others: Sequence[Mapping[str, Any]],
    excess_s: float,
) -> str:
    # Where the stalls' time went: the host (its CPU wait explains them), its callbacks' hooks
    # (the ledger's seconds beyond the others' explain them), else its data wait (the gap
    # before those batches) or its training step, from the longest it kept.
    batches = int(row.get("batches") or 0)
    mine = row.get("cpu_wait_ms")
    theirs = [o.get("cpu_wait_ms") for o in others]
    per_batch = 1000.0 * excess_s / batches if batches else 0.0
    if per_batch > 0 and kept_off_cpu(mine, theirs, per_batch) is not None:
        return CPU_WAIT
    hooks = row.get("callbacks_s")
    if isinstance(hooks, (int, float)) and excess_s > 0:
        base = median([float(o.get("callbacks_s") or 0.0) for o in others])
        if float(hooks) - base >= CONFIRM_FRACTION * excess_s:
            return "callbacks"
    gap = sum(float(x[3]) for x in longest)
    own = sum(float(x[0]) for x in longest)
    return "data wait" if own > 0 and gap >= own / 2 else "training step"
