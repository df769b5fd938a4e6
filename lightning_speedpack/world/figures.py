"""``RunSummary.figures["world"]``: every rank's row, the spread, the straggler, the imbalance."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lightning_speedpack.world.engine import (
    ROW_KEYS,
    find_imbalance,
    find_straggler,
    mark_waiting,
    spread,
    world_rows,
)
from lightning_speedpack.world.epochs import epoch_waits, moving_straggler, slowest_by_epoch

__all__ = ["world_figures"]


def world_figures(
    payloads: Mapping[int, Mapping[str, Any]],
    missing: Sequence[str] = (),
    world_size: int | None = None,
) -> dict[str, Any]:
    """``RunSummary.figures["world"]``: the rows, the spread, the straggler, the imbalance.

    Keys: ``ranks`` (a row per rank, :func:`world_rows`), ``missing`` (a line per rank that did
    not answer), ``world_size``, ``spread`` (max/min per numeric column), ``straggler`` and
    ``imbalance`` (None when there is none), ``slowest_by_epoch``, ``findings_by_rank`` (each
    rank's findings in short, for the per-rank verdicts).
    """
    rows = world_rows(payloads)
    epochs = {r: list((p.get("clock") or {}).get("epochs") or []) for r, p in payloads.items()}
    straggler = find_straggler(rows)
    by_epoch = slowest_by_epoch(epochs)
    if len({rank for _, rank in by_epoch}) > 1:  # the slowest rank moves: the data
        straggler = moving_straggler(rows, by_epoch, epoch_waits(epochs), straggler)
    mark_waiting(rows, straggler)
    imbalance = find_imbalance(rows, epochs=epochs)
    numeric = [k for k in ROW_KEYS if k not in ("rank", "node", "local_rank") and spread(rows, k)]
    return {
        "world_size": world_size if world_size is not None else len(rows) + len(missing),
        "ranks": rows,
        "missing": list(missing),
        "spread": {k: spread(rows, k) for k in numeric},
        "straggler": straggler.to_dict() if straggler is not None else None,
        "imbalance": imbalance.to_dict() if imbalance is not None else None,
        "slowest_by_epoch": by_epoch,
        "findings_by_rank": [
            [rank, list(payloads[rank].get("findings") or [])] for rank in sorted(payloads)
        ],
    }
