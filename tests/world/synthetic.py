"""Synthetic rank payloads that follow the DDP model: lock step, the wait inside backward.

Each rank is given its own time a batch (data wait and compute); the world's cycle is the
slowest rank's own time plus a little communication, and every faster rank spends the
difference waiting inside backward, as the gradient all-reduce makes it do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

BACKWARD_MS = 1.0  # backward's own compute on every rank
COMM_MS = 0.2


def _epoch_rows(
    epochs: Sequence[Mapping[int, tuple[float, float]]], rank: int, batches: int
) -> list[list[float]]:
    rows = []
    for e, own in enumerate(epochs):
        cycle = max(d + c for d, c in own.values()) + COMM_MS
        data, compute = own[rank]
        wait = cycle - (data + compute)
        span_ms = cycle - data
        backward_ms = BACKWARD_MS + wait
        rows.append(
            [
                e,
                batches,
                span_ms * batches / 1000,
                data * (batches - 1) / 1000,
                batches - 1,
                backward_ms * batches / 1000,
            ]
        )
    return rows


def payloads(
    own: Mapping[int, tuple[float, float]] | None = None,
    *,
    epochs: Sequence[Mapping[int, tuple[float, float]]] | None = None,
    batches: int = 100,
    batch_size: int = 8,
    samples: Mapping[int, int] | None = None,
    batch_counts: Mapping[int, int] | None = None,
    figures: Mapping[int, Mapping[str, Any]] | None = None,
    findings: Mapping[int, list[dict[str, Any]]] | None = None,
    nodes: Mapping[int, int] | None = None,
) -> dict[int, dict[str, Any]]:
    """Payloads as ranks send them: ``own[rank] = (data ms, compute ms)`` a batch.

    ``epochs`` gives ``own`` per epoch instead (each epoch ``batches`` batches); the run's clock
    is then their sum.
    """
    if epochs is None:
        assert own is not None
        epochs = [own]
    ranks = sorted(epochs[0])
    out: dict[int, dict[str, Any]] = {}
    for rank in ranks:
        count = (batch_counts or {}).get(rank, batches)
        rows = _epoch_rows(epochs, rank, count)
        n = sum(int(r[1]) for r in rows)
        span = sum(r[2] for r in rows)
        gap = sum(r[3] for r in rows)
        gaps = sum(int(r[4]) for r in rows)
        backward = sum(r[5] for r in rows)
        span_ms, gap_ms = 1000 * span / n, 1000 * gap / gaps
        wall = span + gap + 1.0
        out[rank] = {
            "rank": rank,
            "host": f"host{(nodes or {}).get(rank, 0)}",
            "node": (nodes or {}).get(rank, 0),
            "local_rank": rank,
            "wall_s": wall,
            "samples": (samples or {}).get(rank, n * batch_size),
            "sample_unit": "samples",
            "clock": {
                "batches": n,
                "cycle_ms": span_ms + gap_ms,
                "gap_ms": gap_ms,
                "span_ms": span_ms,
                "backward_ms": 1000 * backward / n,
                "batch_size_min": batch_size,
                "batch_size_max": batch_size,
                "epochs": rows,
            },
            "figures": dict((figures or {}).get(rank, {})),
            "findings": list((findings or {}).get(rank, [])),
        }
    return out
