"""One table, or summary fields, written through every logger of a Trainer (rank 0, no sync).

What W&B, CSV and TensorBoard get is the table in :mod:`lightning_speedpack.core.tables`, which
also says who logs what and when, and re-exports every name here. :data:`TABLES` fixes the
columns of the pack's own tables, and :func:`log_table` holds each table to them. Cells are plain
values only: a tensor is refused, since reading it is a host-device sync.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_speedpack.core.lightning import classes

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = [
    "SUMMARY_FILE",
    "TABLES",
    "Cell",
    "csv_file_name",
    "log_line_chart",
    "log_summary",
    "log_table",
    "markdown_table",
]

Cell = bool | int | float | str | None

#: Stable names and columns of the pack's tables (issue 15); every component logs its own.
#: (``speedpack/world``, the doctor's row per DDP rank, is not here: its first columns are fixed,
#: then come whatever scalar figures the ranks' diagnostics published.)
TABLES: dict[str, tuple[str, ...]] = {
    "speedpack/sync_points": (
        "origin",
        "kind",
        "location",
        "code",
        "function",
        "per_step",
        "steps_seen",
        "first_step",
    ),
    "speedpack/retained_graphs": (
        "path",
        "step_first_seen",
        "count",
        "backpropagated",
        "est_bytes",
        "example_grad_fn",
    ),
    "speedpack/advisor": ("id", "severity", "evidence", "fix", "location"),
    "speedpack/batch_size_trials": ("batch_size", "fits", "samples_per_sec", "chosen"),
    "speedpack/findings": ("severity", "component", "id", "message", "location", "fix"),
    "speedpack/wall_time": ("part", "detail", "seconds", "fraction", "count"),
    "speedpack/what_if": (
        "knob",
        "side",
        "today",
        "candidate",
        "before",
        "after",
        "gain",
        "gain_low",
        "gain_high",
        "numerics",
        "verdict",
        "note",
    ),
}

#: File the CSV logger's summary fields are merged into, beside ``metrics.csv``.
SUMMARY_FILE = "speedpack_summary.json"

_PLAIN = (bool, int, float, str, type(None))


def log_table(
    trainer: pl.Trainer,
    name: str,
    columns: Sequence[str],
    rows: Iterable[Sequence[Cell]],
) -> None:
    """Write one table through every logger of ``trainer``, on rank 0 only.

    Args:
        trainer: the Trainer whose ``loggers`` receive the table (either Lightning namespace).
        name: the table's key, e.g. ``"speedpack/sync_points"``; a name in :data:`TABLES`
            must come with exactly its columns.
        columns: the column names.
        rows: one sequence of plain values per row, as long as ``columns``.

    Raises:
        TypeError: a cell is not ``None``, ``bool``, ``int``, ``float`` or ``str`` (a tensor).
        ValueError: an empty name or column list, a row of the wrong length, or other columns
            than :data:`TABLES` fixes for ``name``.

    Example:
        >>> from types import SimpleNamespace
        >>> no_logger = SimpleNamespace(is_global_zero=True, loggers=[])
        >>> log_table(no_logger, "speedpack/advisor", TABLES["speedpack/advisor"],
        ...           [["dataloader-workers", "warning", "num_workers=0", "num_workers=4", None]])
        >>> log_table(no_logger, "t", ["x"], [[1], [2, 3]])
        Traceback (most recent call last):
        ...
        ValueError: log_table('t'): row 1 has 2 cells, the columns are ['x']
    """
    cols, table = _checked_table(name, columns, rows)
    if not trainer.is_global_zero:
        return
    for logger in trainer.loggers:
        if isinstance(logger, classes("loggers.WandbLogger")):
            _wandb_table(logger, name, cols, table)
        elif isinstance(logger, classes("loggers.CSVLogger")):
            directory = Path(logger.log_dir)
            directory.mkdir(parents=True, exist_ok=True)
            with (directory / csv_file_name(name)).open("w", newline="") as fh:
                writer = csv.writer(fh)
                writer.writerow(cols)
                writer.writerows(["" if c is None else c for c in row] for row in table)
        elif isinstance(logger, classes("loggers.TensorBoardLogger")):
            writer = logger.experiment
            writer.add_text(name, markdown_table(cols, table), global_step=trainer.global_step)
            writer.flush()


def log_summary(trainer: pl.Trainer, fields: Mapping[str, Cell]) -> None:
    """Write run summary fields (e.g. ``{"speedpack/syncs_per_step": 1.0}``), rank 0 only.

    Fields accumulate: each call adds to or replaces what earlier calls wrote.

    Args:
        trainer: the Trainer whose ``loggers`` receive the fields (either Lightning namespace).
        fields: summary keys (by convention ``speedpack/...``) and plain values.

    Raises:
        TypeError: a key is not a non-empty str, or a value is not ``None``, ``bool``, ``int``,
            ``float`` or ``str`` (a tensor).

    Example:
        >>> from types import SimpleNamespace
        >>> log_summary(SimpleNamespace(is_global_zero=True, loggers=[]), {"speedpack/x": 1})
    """
    values = _checked_fields(fields)
    if not trainer.is_global_zero or not values:
        return
    for logger in trainer.loggers:
        if isinstance(logger, classes("loggers.WandbLogger")):
            logger.experiment.summary.update(values)
        elif isinstance(logger, classes("loggers.CSVLogger")):
            directory = Path(logger.log_dir)
            directory.mkdir(parents=True, exist_ok=True)
            path = directory / SUMMARY_FILE
            merged = _read_json(path)
            merged.update(values)
            path.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")
        elif isinstance(logger, classes("loggers.TensorBoardLogger")):
            writer = logger.experiment
            for key, value in values.items():
                if isinstance(value, (bool, int, float)) and value is not None:
                    writer.add_scalar(key, float(value), global_step=trainer.global_step)
                elif value is not None:
                    writer.add_text(key, value, global_step=trainer.global_step)
            writer.flush()


def log_line_chart(
    trainer: pl.Trainer,
    name: str,
    points: Iterable[tuple[float, float]],
    x: str,
    y: str,
    title: str | None = None,
) -> None:
    """Draw ``points`` (x, y) as a line chart in the run, rank 0 only.

    W&B gets a ``wandb.plot.line`` chart under ``name`` (its data as the table ``name`` +
    ``_table``); TensorBoard gets the y values as the scalar ``name`` with x as the step (so x
    must be whole numbers, such as batch sizes); other loggers get nothing (log the points as a
    table with :func:`log_table` for them).

    Args:
        trainer: the Trainer whose ``loggers`` receive the chart.
        name: the chart's key, e.g. ``"speedpack/batch_size_trials_chart"``.
        points: ``(x, y)`` pairs of plain numbers, drawn in the order given.
        x: the x axis label, e.g. ``"batch_size"``.
        y: the y axis label, e.g. ``"samples_per_sec"``.
        title: the chart's title (default: ``"<y> vs <x>"``).

    Raises:
        TypeError: a coordinate is not a plain ``int`` or ``float``.
        ValueError: an empty name or axis label, or a point that is not a pair.

    Example:
        >>> from types import SimpleNamespace
        >>> trainer = SimpleNamespace(is_global_zero=True, loggers=[])
        >>> log_line_chart(trainer, "speedpack/batch_size_trials_chart", [(32, 410.0),
        ...                (64, 730.5)], "batch_size", "samples_per_sec")
    """
    _check_name("log_line_chart", name)
    for what, label in (("x", x), ("y", y)):
        if not isinstance(label, str) or not label:
            raise ValueError(f"log_line_chart({name!r}): `{what}` must be a non-empty str")
    _, data = _checked_table(name, (x, y), points)
    for i, row in enumerate(data):
        for value in row:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(
                    f"log_line_chart({name!r}): point {i} holds {type(value).__name__} "
                    f"{value!r}; coordinates must be plain int or float"
                )
    if not trainer.is_global_zero:
        return
    title = title or f"{y} vs {x}"
    for logger in trainer.loggers:
        if isinstance(logger, classes("loggers.WandbLogger")):
            import wandb

            table = wandb.Table(columns=list[Any]([x, y]), data=[list(r) for r in data])
            logger.experiment.log({name: wandb.plot.line(table, x, y, title=title)})
        elif isinstance(logger, classes("loggers.TensorBoardLogger")):
            writer = logger.experiment
            for px, py in data:
                writer.add_scalar(name, float(py), global_step=int(px))  # type: ignore[arg-type]
            writer.flush()


def csv_file_name(name: str) -> str:
    """The CSV file a table is written to beside ``metrics.csv``.

    Example:
        >>> csv_file_name("speedpack/sync_points")
        'speedpack_sync_points.csv'
    """
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) + ".csv"


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Cell]]) -> str:
    r"""A GitHub-flavoured markdown table (what TensorBoard's text tab renders).

    Example:
        >>> print(markdown_table(["id", "n"], [["a|b", 2], [None, 1.5]]))
        | id | n |
        | --- | --- |
        | a\|b | 2 |
        |  | 1.5 |
    """

    def cell(value: Cell) -> str:
        text = "" if value is None else str(value)
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(c) for c in columns) + " |"]
    lines.append("| " + " | ".join("---" for _ in columns) + " |")
    lines.extend("| " + " | ".join(cell(c) for c in row) + " |" for row in rows)
    return "\n".join(lines)


def _check_name(func: str, name: Any) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"{func}: the name must be a non-empty str, got {name!r}")


def _check_cell(where: str, value: Any) -> None:
    if not isinstance(value, _PLAIN):
        hint = (
            " (convert it once, outside the training step: a tensor's value is a host-device sync)"
            if type(value).__module__.startswith(("torch", "numpy"))
            else ""
        )
        raise TypeError(
            f"{where} holds a {type(value).__module__}.{type(value).__qualname__}; "
            f"only None, bool, int, float and str are allowed{hint}"
        )


def _checked_table(
    name: str, columns: Sequence[str], rows: Iterable[Sequence[Cell]]
) -> tuple[list[str], list[list[Cell]]]:
    _check_name("log_table", name)
    if isinstance(columns, str) or not all(isinstance(c, str) and c for c in columns):
        raise ValueError(f"log_table({name!r}): columns must be non-empty strs, got {columns!r}")
    cols = list(columns)
    if not cols:
        raise ValueError(f"log_table({name!r}): a table needs at least one column")
    expected = TABLES.get(name)
    if expected is not None and tuple(cols) != expected:
        raise ValueError(
            f"log_table({name!r}): the columns of this table are {list(expected)}, got {cols}"
        )
    table: list[list[Cell]] = []
    for i, row in enumerate(rows):
        if isinstance(row, str) or not isinstance(row, Sequence):
            raise TypeError(f"log_table({name!r}): row {i} must be a list or tuple, got {row!r}")
        if len(row) != len(cols):
            raise ValueError(
                f"log_table({name!r}): row {i} has {len(row)} cells, the columns are {cols}"
            )
        for col, value in zip(cols, row, strict=True):
            _check_cell(f"log_table({name!r}): row {i}, column {col!r}", value)
        table.append(list(row))
    return cols, table


def _checked_fields(fields: Mapping[str, Cell]) -> dict[str, Cell]:
    if not isinstance(fields, Mapping):
        raise TypeError(f"log_summary: fields must be a mapping, got {type(fields).__name__}")
    values: dict[str, Cell] = {}
    for key, value in fields.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"log_summary: keys must be non-empty strs, got {key!r}")
        _check_cell(f"log_summary: field {key!r}", value)
        values[key] = value
    return values


def _wandb_table(logger: Any, name: str, columns: list[str], rows: list[list[Cell]]) -> None:
    import wandb

    # NaN/inf are not JSON: W&B would refuse the whole table for one such cell.
    clean = [
        [None if isinstance(c, float) and not math.isfinite(c) else c for c in row] for row in rows
    ]
    table = wandb.Table(columns=list[Any](columns), data=clean, allow_mixed_types=True)
    logger.experiment.log({name: table})


def _read_json(path: Path) -> dict[str, Any]:
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}
