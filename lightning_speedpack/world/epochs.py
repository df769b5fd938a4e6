"""Epoch by epoch: which rank was slowest in each, and what the others waited.

A rank that is slow because of its host stays the slowest epoch after epoch; when the data is
the cause (some batches cost more than others, dealt out anew each epoch) the slowest rank
moves, and over the whole run the ranks' waits average out. A host whose other work moves
from one rank's core to another's moves the slowest rank too: an epoch whose slowest rank spent
its extra time ready to run with no CPU free (its wait for a CPU, read by the kernel) is the
host's, not evidence about the data. These functions read each rank's per-epoch clock rows
(epoch, batches, span s, gap s, gaps, backward s, CPU wait s or None, start s: the time in
Lightning's broadcast before the fetches, a wait like backward's;
:meth:`~lightning_speedpack.world.payload.StepClock.figures`).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from lightning_speedpack.world.engine import (
    CPU_WAIT,
    STRAGGLER_MIN_MS,
    STRAGGLER_RATIO,
    Straggler,
    kept_off_cpu,
    median,
)

__all__ = ["epoch_waits", "host_by_epoch", "host_moved", "moving_straggler", "slowest_by_epoch"]


_Row = tuple[float, float, int, float | None]  # cycle ms, waits ms, batches, CPU wait ms


def _epoch_table(
    epochs: Mapping[int, Sequence[Sequence[float | None]]],
) -> dict[int, dict[int, _Row]]:
    # {epoch: {rank: (cycle ms, waits ms, batches, CPU wait ms a batch or None)}}, the waits
    # being backward and the time in Lightning's broadcast before each fetch
    by_epoch: dict[int, dict[int, _Row]] = {}
    for rank, rows in epochs.items():
        for row in rows:
            epoch, batches, span, gap, gaps, backward = (float(x or 0.0) for x in row[:6])
            if batches <= 0:
                continue
            cycle = 1000.0 * (span / batches + (gap / gaps if gaps else 0.0))
            cpu = row[6] if len(row) > 6 else None  # rows sent before the CPU wait was kept
            start = float(row[7] or 0.0) if len(row) > 7 else 0.0
            by_epoch.setdefault(int(epoch), {})[int(rank)] = (
                cycle,
                1000.0 * (backward + start) / batches,
                int(batches),
                None if cpu is None else 1000.0 * float(cpu) / batches,
            )
    return by_epoch


def slowest_by_epoch(
    epochs: Mapping[int, Sequence[Sequence[float | None]]],
    *,
    ratio: float = STRAGGLER_RATIO,
    min_ms: float = STRAGGLER_MIN_MS,
) -> list[list[int]]:
    """``[[epoch, rank], ...]``: each epoch whose slowest rank is plain, and that rank.

    ``epochs`` holds each rank's per-epoch clock rows (epoch, batches, span s, gap s, gaps,
    backward s, CPU wait s, start s; :meth:`~lightning_speedpack.world.payload.StepClock.figures`).
    An epoch whose slowest rank was kept off the CPU (its extra wait for one is
    :data:`~lightning_speedpack.world.engine.CPU_WAIT_SHARE` of its excess or more) is left
    out: that is its host's doing, not the data's.

    Example:
        >>> slow_1 = {0: [[0, 10, 0.4, 0.02, 9, 0.35]], 1: [[0, 10, 0.05, 0.36, 9, 0.01]]}
        >>> slowest_by_epoch(slow_1)
        [[0, 1]]
    """
    return [[e, r] for e, r, starved in _plain_slowest(epochs, ratio, min_ms) if not starved]


def host_by_epoch(
    epochs: Mapping[int, Sequence[Sequence[float | None]]],
    *,
    ratio: float = STRAGGLER_RATIO,
    min_ms: float = STRAGGLER_MIN_MS,
) -> list[list[int]]:
    """``[[epoch, rank], ...]``: each epoch whose plain slowest rank was kept off the CPU.

    The epochs :func:`slowest_by_epoch` leaves out as the host's doing.

    Example:
        >>> starved_1 = {0: [[0, 10, 0.4, 0.02, 9, 0.35, 0.0]],
        ...              1: [[0, 10, 0.05, 0.36, 9, 0.01, 0.3]]}
        >>> host_by_epoch(starved_1), slowest_by_epoch(starved_1)
        ([[0, 1]], [])
    """
    return [[e, r] for e, r, starved in _plain_slowest(epochs, ratio, min_ms) if starved]


def _plain_slowest(
    epochs: Mapping[int, Sequence[Sequence[float | None]]], ratio: float, min_ms: float
) -> list[tuple[int, int, bool]]:
    # (epoch, its plainly slowest rank, whether that rank's wait for a CPU explains it)
    out = []
    for epoch, ranks in sorted(_epoch_table(epochs).items()):
        if len(ranks) < 2:
            continue
        low = min(row[1] for row in ranks.values())
        own = {r: row[0] - (row[1] - low) for r, row in ranks.items()}
        slow = max(own, key=lambda r: own[r])
        base = median([v for r, v in own.items() if r != slow])
        excess = own[slow] - base
        if own[slow] >= ratio * base and excess >= min_ms:
            theirs = [row[3] for r, row in ranks.items() if r != slow]
            out.append((epoch, slow, kept_off_cpu(ranks[slow][3], theirs, excess) is not None))
    return out


def host_moved(
    straggler: Straggler, rows: Sequence[Mapping[str, Any]], by_host: list[list[int]]
) -> Straggler:
    """``straggler`` as its host's when the host kept different ranks off the CPU by epoch.

    Its run's excess is then the host's load moving between the ranks' cores, not its code:
    the part becomes :data:`~lightning_speedpack.world.engine.CPU_WAIT` (an info), with each
    rank's wait for a CPU a batch. Unchanged when the epochs name one rank, or none.
    """
    if len({rank for _, rank in by_host}) < 2 or straggler.moving or straggler.part == CPU_WAIT:
        return straggler
    row = next((r for r in rows if int(r["rank"]) == straggler.rank), None)
    others = [float(r.get("cpu_wait_ms") or 0.0) for r in rows if r is not row]
    mine = float((row or {}).get("cpu_wait_ms") or 0.0)
    return replace(
        straggler, part=CPU_WAIT, part_ms=round(mine, 3), part_others_ms=round(median(others), 3)
    )


def epoch_waits(epochs: Mapping[int, Sequence[Sequence[float | None]]]) -> dict[int, float]:
    """Seconds each rank waited for the others, epoch by epoch (waits above the epoch's least).

    Unlike the run's wait, a slowest rank that changes between epochs does not cancel out.

    Example:
        >>> epoch_waits({0: [[0, 10, 0.4, 0.0, 9, 0.35], [1, 10, 0.05, 0.4, 9, 0.01]],
        ...              1: [[0, 10, 0.05, 0.4, 9, 0.01], [1, 10, 0.4, 0.0, 9, 0.35]]})
        {0: 0.34, 1: 0.34}
    """
    waits: dict[int, float] = {}
    for ranks in _epoch_table(epochs).values():
        low = min(row[1] for row in ranks.values())
        for rank, (_, waited, batches, _) in ranks.items():
            waits[rank] = round(waits.get(rank, 0.0) + (waited - low) * batches / 1000.0, 6)
    return dict(sorted(waits.items()))


def moving_straggler(
    rows: Sequence[Mapping[str, Any]],
    by_epoch: list[list[int]],
    waits: Mapping[int, float],
    found: Straggler | None,
) -> Straggler:
    """The straggler of a run whose slowest rank moves (``by_epoch``), its cost from ``waits``.

    Over the run a moving straggler averages out (every rank waits in some epochs), so the
    cost is the epochs' waits (:func:`epoch_waits`, the mean over the ranks); the rank named
    is ``found`` (the run's straggler) or else the one slowest in most epochs.
    """
    counts = Counter(rank for _, rank in by_epoch)
    rank = counts.most_common(1)[0][0]
    row = next((r for r in rows if int(r["rank"]) == rank), rows[0])
    waited = statistics.fmean(waits.values()) if waits else 0.0
    wall = statistics.fmean(float(r.get("wall_s") or 0.0) for r in rows)
    step_s = statistics.fmean(
        float(r.get("step_wall_ms") or 0.0) * int(r.get("batches") or 0) / 1000 for r in rows
    )
    straggler = found or Straggler(
        rank=rank,
        node=row.get("node"),
        host=row.get("host"),
        own_ms=float(row.get("own_ms") or 0.0),
        others_ms=median([float(r.get("own_ms") or 0.0) for r in rows if r is not row]),
        excess_ms=0.0,
        part="data wait",
        part_ms=float(row.get("data_wait_ms") or 0.0),
        part_others_ms=median([float(r.get("data_wait_ms") or 0.0) for r in rows if r is not row]),
        callback=None,
        waited_ms=0.0,
        waited_s=0.0,
        waited_step_fraction=0.0,
        wall_fraction=0.0,
        others=len(rows) - 1,
    )
    straggler.moving = by_epoch
    straggler.waited_s = round(max(waited, straggler.waited_s), 3)
    if step_s > 0:
        straggler.waited_step_fraction = round(min(straggler.waited_s / step_s, 1.0), 4)
    if wall > 0:
        straggler.wall_fraction = round(min(straggler.waited_s / wall, 1.0), 4)
    return straggler
