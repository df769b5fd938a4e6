"""The trials table :class:`~lightning_speedpack.BatchSizeTuner` prints on rank 0.

A rich table on stderr, one row per trial, the chosen size marked. The plain-text form of the
same table, for logs and the doctor's report, is
:func:`~lightning_speedpack.batch_size.search.format_trials`.
"""

from __future__ import annotations

from collections.abc import Sequence

from lightning_speedpack.batch_size.search import Trial

__all__ = ["print_trials_table"]


def print_trials_table(trials: Sequence[Trial], chosen: int | None, mode: str) -> None:
    """Print ``trials`` as a rich table to stderr, ``chosen`` marked, ``mode`` in the title."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"BatchSizeTuner (mode={mode!r})")
    for column in ("batch size", "fits", "samples/s"):
        table.add_column(column, justify="right")
    for t in trials:
        mark = " <- chosen" if t.batch_size == chosen and t.fits else ""
        speed = "-" if t.samples_per_sec is None else f"{t.samples_per_sec:.1f}"
        table.add_row(f"{t.batch_size}{mark}", "yes" if t.fits else "no", speed)
    Console(stderr=True).print(table)
