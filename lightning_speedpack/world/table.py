"""The world as a table: a row per rank with the figures that tell ranks apart, and the spread.

:func:`display_table` is what the text report and the HTML page show (a few columns, at most
:data:`MAX_ROWS` ranks: beyond that the slowest and fastest few plus the p50 and p90 rows);
:func:`logged_table` is what reaches the loggers as ``speedpack/world`` (every rank, every
scalar column, published figures included).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lightning_speedpack.world.engine import ROW_KEYS

__all__ = ["FEW", "LEGEND", "MAX_ROWS", "display_table", "display_title", "logged_table"]

Cell = bool | int | float | str | None

#: More ranks than this are summarised (slowest and fastest few, p50, p90).
MAX_ROWS = 16
#: How many of the slowest and of the fastest ranks a summarised table shows.
FEW = 4
#: A ledger part gets a column when it takes this share of some rank's wall time.
_PART_SHARE = 0.05
_LEDGER = "wall_time/parts/"


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _ms(value: Any) -> str:
    number = _num(value)
    return "-" if number is None else f"{number:.1f}"


def _s(value: Any) -> str:
    number = _num(value)
    return "-" if number is None else f"{number:.2f}"


def _rate(value: Any) -> str:
    number = _num(value)
    if number is None:
        return "-"
    return f"{number:,.0f}" if number >= 100 else f"{number:.3g}"


def _share(value: Any) -> str:
    number = _num(value)
    return "-" if number is None else f"{number:.0%}"


def _plain(value: Any) -> str:
    if value is None:
        return "-"
    number = _num(value)
    if number is not None and not isinstance(value, int):
        return f"{number:.3g}"
    return str(value)


_Column = tuple[str, str, Callable[[Any], str]]


def _any(rows: Sequence[Mapping[str, Any]], key: str, above: float | None = None) -> bool:
    values = [_num(r.get(key)) for r in rows]
    return any(v is not None and (above is None or v > above) for v in values)


def _columns(rows: Sequence[Mapping[str, Any]]) -> list[_Column]:
    unit = next((r.get("sample_unit") for r in rows if r.get("sample_unit")), "samples")
    where = "node" if any(r.get("node") is not None for r in rows) else "host"
    columns: list[_Column] = [
        (where, where, _plain),
        ("samples_per_sec", f"{unit}/s", _rate),
        ("batches", "batches", _plain),
        ("batch_size", "batch", _plain),
        ("data_wait_ms", "data ms", _ms),
        ("step_wall_ms", "step ms", _ms),
        ("wait_ms", "waited ms", _ms),
    ]
    if _any(rows, "comm_wait_fraction"):
        columns.append(("comm_wait_fraction", "comm wait", _share))
    if _any(rows, "comm_ms_per_step"):
        columns.append(("comm_ms_per_step", "comm ms", _ms))
    if _any(rows, "callbacks_s", 0.005):
        columns.append(("callbacks_s", "hooks s", _s))
    if _any(rows, "checkpoint_s", 0.005):
        columns.append(("checkpoint_s", "ckpt s", _s))
    if _any(rows, "cpu_wait_ms", 0.5):  # ready to run, no core free: a busy host
        columns.append(("cpu_wait_ms", "CPU wait ms", _ms))
    if _any(rows, "stall_s", 0.05):  # a few batches far above the rank's typical one
        columns.append(("stall_s", "stalls s", _s))
    for part in _ledger_parts(rows):
        columns.append((f"{_LEDGER}{part}", f"{part} s", _s))
    if any(r.get("bound") for r in rows):
        columns.append(("bound", "bound", _plain))
    return columns


#: Ledger parts the table shows already, per batch (data, step) or as their own columns.
#: (``unaccounted`` is Lightning's loop between them: nothing to change there.)
_SHOWN_PARTS = (
    "data_wait",
    "batch_transfer",
    "training_step",
    "callbacks",
    "checkpoint",
    "unaccounted",
)


def _ledger_parts(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    parts: dict[str, float] = {}
    for row in rows:
        total = _num(row.get("wall_time/total_s")) or 0.0
        for key, value in row.items():
            seconds = _num(value)
            if not key.startswith(_LEDGER) or seconds is None or total <= 0:
                continue
            part = key[len(_LEDGER) :]
            parts[part] = max(parts.get(part, 0.0), seconds / total)
    shown = [p for p, share in parts.items() if share >= _PART_SHARE and p not in _SHOWN_PARTS]
    return sorted(shown, key=lambda p: -parts[p])


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    index = q * (len(ordered) - 1)
    low, high = math.floor(index), math.ceil(index)
    return ordered[low] + (ordered[high] - ordered[low]) * (index - low)


def _summary_row(
    label: str, rows: Sequence[Mapping[str, Any]], columns: Sequence[_Column], how: str
) -> list[str]:
    cells: list[str] = [label]
    for key, _, fmt in columns:
        values = [v for v in (_num(r.get(key)) for r in rows) if v is not None]
        if not values or key in ("node", "host"):
            cells.append("")
        elif how == "spread":
            low, high = min(values), max(values)
            cells.append(f"{high / low:.2f}x" if low > 0 else "-")
        else:
            cells.append(fmt(_percentile(values, float(how))))
    return cells


def display_table(
    world: Mapping[str, Any], *, limit: int = MAX_ROWS, few: int = FEW
) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the World table: ``rank`` first, a row per rank, then ``max/min``.

    With more than ``limit`` ranks: the ``few`` slowest (most own time a step) and ``few``
    fastest ranks, then ``p50`` and ``p90`` rows over all ranks, then ``max/min``.

    Example:
        >>> world = {"ranks": [
        ...     {"rank": 0, "node": 0, "samples_per_sec": 180.0, "data_wait_ms": 2.5,
        ...      "step_wall_ms": 38.0, "wait_ms": 34.0, "batches": 64, "batch_size": 8},
        ...     {"rank": 1, "node": 0, "samples_per_sec": 180.0, "data_wait_ms": 37.0,
        ...      "step_wall_ms": 4.0, "wait_ms": 0.0, "batches": 64, "batch_size": 8}]}
        >>> headers, rows = display_table(world)
        >>> headers
        ['rank', 'node', 'samples/s', 'batches', 'batch', 'data ms', 'step ms', 'waited ms']
        >>> rows[-1]
        ['max/min', '', '1.00x', '1.00x', '1.00x', '14.80x', '9.50x', '-']
    """
    rows = list(world.get("ranks") or [])
    columns = _columns(rows)
    headers = ["rank", *(header for _, header, _ in columns)]
    shown: list[Mapping[str, Any]] = rows
    if len(rows) > limit:
        by_own = sorted(rows, key=lambda r: -(_num(r.get("own_ms")) or 0.0))
        shown = [*by_own[:few], *by_own[-few:]]
    table: list[list[str]] = [
        [str(r.get("rank")), *(fmt(r.get(key)) for key, _, fmt in columns)] for r in shown
    ]
    if len(rows) > limit:
        table.append(_summary_row("p50", rows, columns, "0.5"))
        table.append(_summary_row("p90", rows, columns, "0.9"))
    if len(rows) > 1:
        table.append(_summary_row("max/min", rows, columns, "spread"))
    return headers, table


def display_title(world: Mapping[str, Any]) -> str:
    """``World: 2 ranks`` and, for a summarised table, what it shows."""
    rows = list(world.get("ranks") or [])
    size = world.get("world_size") or len(rows)
    title = f"World: {size} ranks, each rank's own figures"
    if len(rows) > MAX_ROWS:
        title += f"; the {FEW} slowest and {FEW} fastest ranks, p50 and p90 of all {len(rows)}"
    return title


#: What the table's less obvious columns mean (printed under it).
LEGEND = (
    "ms are per training batch: data = waiting for the batch (fetch and copy), step = the rest "
    "of the batch, waited = time in backward beyond the rank that spent least there (waiting "
    "for slower ranks in the gradient all-reduce), CPU wait = ready to run with every core "
    "busy (shown past 0.5 ms); stalls = the rank's batches far above its typical one, their "
    "seconds beyond it; hooks, ckpt and the ledger's other parts are seconds of the fit; "
    "bound = what held the rank back: its data, its model, or the rank it waited for; "
    "max/min = the spread over the ranks"
)


def logged_table(world: Mapping[str, Any]) -> tuple[list[str], list[list[Cell]]]:
    """Every rank, every scalar column (the engine's first, then published figures by name)."""
    rows = list(world.get("ranks") or [])
    extra = sorted({k for r in rows for k in r if k not in ROW_KEYS})
    columns = [*ROW_KEYS, *extra]
    table: list[list[Cell]] = []
    for row in rows:
        cells: list[Cell] = []
        for key in columns:
            value = row.get(key)
            ok = value is None or isinstance(value, (bool, int, float, str))
            cells.append(value if ok else str(value))
        table.append(cells)
    return columns, table
