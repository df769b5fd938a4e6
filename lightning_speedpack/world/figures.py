"""``RunSummary.figures["world"]``: every rank's row, the spread, the straggler, the imbalance."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lightning_speedpack.world.engine import (
    CONFIRM_FRACTION,
    ROW_KEYS,
    find_imbalance,
    find_straggler,
    mark_waiting,
    mark_waiting_for,
    spread,
    world_rows,
)
from lightning_speedpack.world.epochs import (
    epoch_waits,
    host_by_epoch,
    host_moved,
    moving_straggler,
    slowest_by_epoch,
)
from lightning_speedpack.world.same_batches import find_same_batches
from lightning_speedpack.world.stalls import find_stalls, rank_stalls

__all__ = ["world_figures"]


def world_figures(
    payloads: Mapping[int, Mapping[str, Any]],
    missing: Sequence[str] = (),
    world_size: int | None = None,
) -> dict[str, Any]:
    """``RunSummary.figures["world"]``: the rows, the spread, the straggler, the imbalance.

    Keys: ``ranks`` (a row per rank, :func:`world_rows`), ``missing`` (a line per rank that did
    not answer), ``world_size``, ``spread`` (max/min per numeric column), ``straggler``,
    ``imbalance``, ``stalls`` and ``same_batches`` (None when there is none), ``slowest_by_epoch``,
    ``findings_by_rank`` (each rank's findings in short, for the per-rank verdicts).
    """
    rows = world_rows(payloads)
    epochs = {r: list((p.get("clock") or {}).get("epochs") or []) for r, p in payloads.items()}
    straggler = find_straggler(rows)
    by_epoch = slowest_by_epoch(epochs)
    if len({rank for _, rank in by_epoch}) > 1:  # the slowest rank moves: the data
        straggler = moving_straggler(rows, by_epoch, epoch_waits(epochs), straggler)
    elif straggler is not None:  # the host kept one rank, then another, off the CPU
        straggler = host_moved(straggler, rows, host_by_epoch(epochs))
    mark_waiting(rows, straggler)
    tallies = {r: (p.get("clock") or {}).get("tally") or {} for r, p in payloads.items()}
    stalls = find_stalls(tallies, rows, straggler)
    for row in rows:  # each rank's own stalls, named or not
        row.update(rank_stalls(tallies.get(int(row["rank"])) or {}))
    if stalls is not None and straggler is None and stalls.batches:
        least = CONFIRM_FRACTION * 1000.0 * stalls.excess_s / stalls.batches
        mark_waiting_for(rows, stalls.rank, least, " (its stalls)")
    imbalance = find_imbalance(rows, epochs=epochs)
    prints = {r: p["batch_prints"] for r, p in payloads.items() if p.get("batch_prints")}
    numeric = [k for k in ROW_KEYS if k not in ("rank", "node", "local_rank") and spread(rows, k)]
    return {
        "world_size": world_size if world_size is not None else len(rows) + len(missing),
        "ranks": rows,
        "missing": list(missing),
        "spread": {k: spread(rows, k) for k in numeric},
        "straggler": straggler.to_dict() if straggler is not None else None,
        "imbalance": imbalance.to_dict() if imbalance is not None else None,
        "stalls": stalls.to_dict() if stalls is not None else None,
        # ranks that trained on the same batches (None: each its own, or not compared)
        "same_batches": find_same_batches(prints) if len(prints) == len(payloads) else None,
        "slowest_by_epoch": by_epoch,
        "findings_by_rank": [
            [rank, list(payloads[rank].get("findings") or [])] for rank in sorted(payloads)
        ],
    }
