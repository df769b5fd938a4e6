"""Tables and summary fields in the run: the one way every component reaches the user's loggers.

Each component logs its tables once, at the end of fit (and the doctor on demand), through
every logger of the Trainer, on rank 0 only. What lands where:

==================  ================================================  =========================
Logger              a table (:func:`log_table`)                       summary fields
                                                                      (:func:`log_summary`)
==================  ================================================  =========================
``WandbLogger``     a ``wandb.Table`` logged under its name, e.g.     ``run.summary[key]``
                    ``speedpack/sync_points``
``CSVLogger``       ``speedpack_sync_points.csv`` beside              merged into
                    ``metrics.csv`` (header row = columns)            ``speedpack_summary.json``
``TensorBoard``     a markdown table (``add_text``) under its name    numbers as scalars, text
                                                                      as text
no logger / other   nothing                                           nothing
==================  ================================================  =========================

:func:`log_line_chart` adds a line chart (``wandb.plot.line``) to a W&B run, and to TensorBoard
a scalar series with the x values as its step axis (e.g. samples/s against batch size).

Cells and summary values must be plain Python values (``None``, ``bool``, ``int``, ``float``,
``str``): a tensor is refused with :class:`TypeError`, because turning it into a number is a
host-device sync that belongs to the caller, once, outside the training step. Nothing here
touches a device or runs per step.

:data:`TABLES` holds the stable names and columns of the pack's own tables; :func:`finding_rows`
and :func:`finding_counts` turn findings into the ``speedpack/findings`` table and its counts.
The writers (:func:`log_table`, :func:`log_summary`, :func:`log_line_chart`) and :data:`TABLES`
live in :mod:`~lightning_speedpack.core.table_writers` and are importable from here.

Who logs what, and when: every pack callback that logs tables is a :class:`TableSource` (it has
``log_tables(trainer)``) and calls :func:`log_fit_end` from its ``on_fit_end``. That logs the
callback's own tables and summary fields; the *last* table source in ``trainer.callbacks``
(Lightning calls ``on_fit_end`` in that order, so every other callback has finished by then)
also gathers the findings and figures of every diagnosable callback on the Trainer and logs
``speedpack/findings``, the finding counts and the figures (:func:`log_findings`). No global
state: the Trainer's own callback list decides, so two Trainers never mix. Under ``speedpack
doctor`` the doctor's recorder is appended last and is the one that logs them.
"""

from __future__ import annotations

import copy
import numbers
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from lightning_speedpack.core.findings import Finding
from lightning_speedpack.core.hook_hub import callbacks_of
from lightning_speedpack.core.lightning import rank_zero_warn
from lightning_speedpack.core.registry import Diagnosable

# Writing one table or summary through the loggers, re-exported here (their old home).
from lightning_speedpack.core.table_writers import (
    SUMMARY_FILE,
    TABLES,
    Cell,
    csv_file_name,
    log_line_chart,
    log_summary,
    log_table,
    markdown_table,
)

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = [
    "SUMMARY_FILE",
    "TABLES",
    "Cell",
    "Reviser",
    "TableSource",
    "csv_file_name",
    "figure_fields",
    "finding_counts",
    "finding_rows",
    "log_findings",
    "log_fit_end",
    "log_line_chart",
    "log_summary",
    "log_table",
    "markdown_table",
    "merge_findings",
]


def finding_rows(findings: Iterable[Finding]) -> list[list[Cell]]:
    """Rows of ``speedpack/findings`` (columns in :data:`TABLES`), most severe first.

    Example:
        >>> finding_rows([Finding("sync_points", "sync-item", "loss.item() syncs",
        ...                       location="train.py:12", fix="log the tensor")])
        [['warning', 'sync_points', 'sync-item', 'loss.item() syncs', 'train.py:12',
          'log the tensor']]
    """
    order = {"error": 0, "warning": 1, "info": 2}
    ranked = sorted(findings, key=lambda f: order.get(f.severity, 3))
    return [[f.severity, f.component, f.id, f.message, f.location, f.fix] for f in ranked]


def finding_counts(findings: Iterable[Finding]) -> dict[str, Cell]:
    """Summary fields ``speedpack/findings/{error,warning,info}``: findings per severity.

    Example:
        >>> finding_counts([Finding("a", "b", "c"), Finding("a", "d", "e", severity="info")])
        {'speedpack/findings/error': 0, 'speedpack/findings/warning': 1,
         'speedpack/findings/info': 1}
    """
    counts: dict[str, Cell] = {f"speedpack/findings/{s}": 0 for s in ("error", "warning", "info")}
    for finding in findings:
        key = f"speedpack/findings/{finding.severity}"
        counts[key] = int(counts.get(key) or 0) + 1
    return counts


_SEVERITY_RANK = {"info": 0, "warning": 1, "error": 2}


def merge_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Keep one finding per id across components (what the doctor prints); inputs are not changed.

    ``data-wait`` comes from both the throughput logger and the advisor: the one that says
    where (a ``location``) is kept, else the first, at the most severe of their severities,
    naming the others in ``figures["also_reported_by"]``. One component's findings with a
    shared id (a sync kind at several call sites) are all kept.

    Example:
        >>> merged = merge_findings([
        ...     Finding("throughput", "data-wait", "40% waits"),
        ...     Finding("advisor", "data-wait", "38% waits", location="x.py:3"),
        ... ])
        >>> [(f.component, f.figures["also_reported_by"]) for f in merged]
        [('advisor', ['throughput'])]
    """
    first: dict[str, Finding] = {}
    merged: list[Finding] = []
    for finding in (copy.deepcopy(f) for f in findings):
        kept = first.get(finding.id)
        if kept is None or kept.component == finding.component:
            first.setdefault(finding.id, finding)
            merged.append(finding)
            continue
        keep, drop = (finding, kept) if finding.location and not kept.location else (kept, finding)
        if _SEVERITY_RANK.get(drop.severity, 0) > _SEVERITY_RANK.get(keep.severity, 0):
            keep.severity = drop.severity
        also = keep.figures.setdefault("also_reported_by", [])
        also.extend([*drop.figures.pop("also_reported_by", []), drop.component])
        if keep is finding:
            merged[merged.index(kept)] = first[finding.id] = finding
    return merged


def figure_fields(figures: Mapping[str, Any], prefix: str = "speedpack/") -> dict[str, Cell]:
    """A component's doctor figures as summary fields: plain scalars, one level of dicts flattened.

    Lists (series such as samples/s over steps) and anything that is not a plain number or
    string (a tensor: reading it would be a host-device sync) are left out. A figure named like
    a table gets ``/count`` appended (``speedpack/retained_graphs/count``): in W&B a table's
    name is also its summary key, which a number must not overwrite.

    Example:
        >>> figure_fields({"syncs_per_step": 1.0, "phase_share": {"forward": 0.6},
        ...                "samples_per_sec_over_steps": [[1, 2.0]], "verdict": "data-bound",
        ...                "retained_graphs": 3})
        {'speedpack/syncs_per_step': 1.0, 'speedpack/phase_share/forward': 0.6,
         'speedpack/verdict': 'data-bound', 'speedpack/retained_graphs/count': 3}
    """
    fields: dict[str, Cell] = {}
    for name, value in figures.items():
        key = f"{name}/count" if f"{prefix}{name}" in TABLES else name
        if isinstance(value, Mapping):
            for sub, inner in value.items():
                plain = _plain(inner)
                if plain is not _SKIP:
                    fields[f"{prefix}{key}/{sub}"] = plain  # type: ignore[assignment]
            continue
        plain = _plain(value)
        if plain is not _SKIP:
            fields[f"{prefix}{key}"] = plain  # type: ignore[assignment]
    return fields


_SKIP = object()


def _plain(value: Any) -> object:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):  # numpy ints too; a tensor is not Integral
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return _SKIP


@runtime_checkable
class TableSource(Protocol):
    """A callback that logs its own tables and summary fields at the end of fit.

    The pack's callbacks implement it and call :func:`log_fit_end` from ``on_fit_end``; the
    last table source in ``trainer.callbacks`` also logs the run's findings.
    """

    def log_tables(self, trainer: pl.Trainer) -> None:
        """Log this callback's tables and summary fields through ``trainer``'s loggers."""
        ...


@runtime_checkable
class Reviser(Protocol):
    """A callback that reads the other callbacks' findings and figures anew before they are logged.

    The doctor's recorder is one: under DDP it names the straggler and turns rank 0's "backward"
    into "waiting for rank k" (:mod:`lightning_speedpack.world.revise`).
    """

    def revise_findings(self, findings: list[Finding]) -> list[Finding]:
        """Return the findings to log instead of ``findings``."""
        ...

    def revise_figures(self, figures: dict[str, Any]) -> None:
        """Change the figures to log in place."""
        ...


def log_fit_end(trainer: pl.Trainer, callback: TableSource) -> None:
    """What a pack callback does in ``on_fit_end``: its tables, and the run's if it is the last.

    On rank 0 only, calls ``callback.log_tables(trainer)``; then, if ``callback`` is the last
    :class:`TableSource` in ``trainer.callbacks``, :func:`log_findings`. Nothing runs on other
    ranks and nothing touches a device. A logger that fails is reported with a warning instead
    of failing the fit that already ended.

    Example:
        >>> from types import SimpleNamespace
        >>> class Source:
        ...     def log_tables(self, trainer):
        ...         print("own tables")
        >>> first, last = Source(), Source()
        >>> trainer = SimpleNamespace(is_global_zero=True, loggers=[], callbacks=[first, last])
        >>> log_fit_end(trainer, first)  # its own tables only
        own tables
        >>> log_fit_end(trainer, last)  # and the findings of every callback (none here)
        own tables
    """
    if not trainer.is_global_zero:
        return
    try:
        callback.log_tables(trainer)
        sources = [c for c in callbacks_of(trainer) if isinstance(c, TableSource)]
        if sources and sources[-1] is callback:
            log_findings(trainer)
    except Exception as err:  # the fit has ended: a logger's failure must not undo it
        rank_zero_warn(
            f"lightning-speedpack: {type(callback).__name__} could not log its tables "
            f"({type(err).__name__}: {err})"
        )


def log_findings(trainer: pl.Trainer, callbacks: Iterable[Any] | None = None) -> list[Finding]:
    """Log ``speedpack/findings``, the finding counts and every figure of the diagnosable callbacks.

    Gathers ``doctor_findings()`` (merged as the doctor merges them, see
    :func:`merge_findings`) and ``doctor_figures()`` (as :func:`figure_fields`) from every
    callback with both methods (``trainer.callbacks`` unless ``callbacks`` is given), lets each
    :class:`Reviser` among them revise both, then logs the table and the summary fields on
    rank 0. Call it on demand, e.g. after ``trainer.fit``.

    Returns:
        The findings logged (empty on ranks other than 0).

    Example:
        >>> from types import SimpleNamespace
        >>> class Diag:
        ...     def doctor_findings(self):
        ...         return [Finding("demo", "slow", "it is slow")]
        ...     def doctor_figures(self):
        ...         return {"samples_per_sec": 10.0}
        >>> trainer = SimpleNamespace(is_global_zero=True, loggers=[], callbacks=[Diag()])
        >>> [f.id for f in log_findings(trainer)]
        ['slow']
    """
    if not trainer.is_global_zero:
        return []
    found: list[Finding] = []
    figures: dict[str, Any] = {}
    chosen = list(callbacks_of(trainer) if callbacks is None else callbacks)
    for callback in chosen:
        if not isinstance(callback, Diagnosable):
            continue
        try:
            found.extend(callback.doctor_findings())
            figures.update(callback.doctor_figures())
        except Exception as err:  # one failing diagnostic must not hide the others
            found.append(
                Finding(
                    type(callback).__name__,
                    "diagnostic-failed",
                    f"{type(err).__name__}: {err}",
                    severity="info",
                )
            )
    for callback in chosen:  # the doctor's recorder: rank 0's findings read with every rank
        if isinstance(callback, Reviser):
            found = callback.revise_findings(found)
            callback.revise_figures(figures)
    fields = figure_fields(figures)
    findings = merge_findings(found)
    log_table(trainer, "speedpack/findings", TABLES["speedpack/findings"], finding_rows(findings))
    log_summary(trainer, {**fields, **finding_counts(findings)})
    return findings
