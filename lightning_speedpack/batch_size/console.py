"""The trials table :class:`~lightning_speedpack.BatchSizeTuner` prints on rank 0.

A rich table on stderr, one row per trial, the chosen size marked; in a log file, the same
table when it fits the width, else ``column: value`` records
(:mod:`lightning_speedpack.core.console`). The plain-text form of the same table, for the
doctor's report, is :func:`~lightning_speedpack.batch_size.search.format_trials`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_speedpack.batch_size.search import Trial

__all__ = ["print_trials_table"]


def print_trials_table(
    trials: Sequence[Trial], chosen: int | None, mode: str, console: Any = None
) -> None:
    """Print ``trials``, ``chosen`` marked, ``mode`` in the title, to ``console`` (or stderr)."""
    from rich.table import Column

    from lightning_speedpack.core.console import Cell, make_console, print_table

    rows: list[list[Cell]] = []
    for t in trials:
        mark = " <- chosen" if t.batch_size == chosen and t.fits else ""
        speed = "-" if t.samples_per_sec is None else f"{t.samples_per_sec:.1f}"
        rows.append([f"{t.batch_size}{mark}", "yes" if t.fits else "no", speed])
    columns = [Column(c, justify="right") for c in ("batch size", "fits", "samples/s")]
    print_table(console or make_console(), f"BatchSizeTuner (mode={mode!r})", columns, rows)
