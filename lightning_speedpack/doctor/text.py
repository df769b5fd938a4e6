"""The doctor's report as text: rich tables in a terminal, paragraphs and records in a log.

Both layouts (:mod:`lightning_speedpack.core.console`) carry the same content:

- the runs: in a terminal one table turned on its side (a row per figure, a column per run,
  so 20 figures fit 80 columns); in a log ``figure: value`` lines per run;
- per DDP run, the World table: a row per rank (its own samples/s, data wait, step, wait for
  the others, hooks, ledger parts) and the spread, max over min, per column (beyond 16 ranks
  the slowest and fastest few, p50 and p90);
- per run, where the wall time went and what WhatIf measured (tables when they fit);
- what the run left out, as one paragraph;
- the findings, as :func:`~lightning_speedpack.doctor.grouping.presented` (alike ones grouped,
  what pays here first): in a terminal a table; in a log one paragraph each, severity and
  ``component/id`` leading the first line, then the message, where and the fix, never cut.

Example:
    >>> import io
    >>> from lightning_speedpack.core.console import make_console
    >>> from lightning_speedpack.doctor.report import Report
    >>> console = make_console(file=io.StringIO(), layout="log", width=60)
    >>> report = Report(findings=[Finding("sync_points", "sync-item", ".item() in the step",
    ...                                   "train.py:12", fix="use self.log")])
    >>> print_report(report, console)
    >>> for line in console.file.getvalue().splitlines()[1:]:  # after the title rule
    ...     print(line)
    No Trainer.fit ran to completion, so there are no run figures.
    Findings (1)
    [warning] sync_points/sync-item: .item() in the step
        where: train.py:12
        fix: use self.log
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from rich.console import Console
from rich.table import Column
from rich.text import Text

from lightning_speedpack.core.console import (
    Cell,
    layout_of,
    make_console,
    prepare,
    print_lines,
    print_paragraph,
    print_table,
    wrap_paragraph,
)
from lightning_speedpack.core.findings import Finding
from lightning_speedpack.doctor.grouping import presented

__all__ = [
    "PrintedReport",
    "PrintedRun",
    "finding_lines",
    "print_report",
    "run_rows",
    "severity_label",
]

#: The measured goal of the log layout: lines per finding, per 100 characters of its message.
LINES_PER_100_CHARS = 3
_WHAT_IF = ("knob", "today", "candidate", "before", "after", "gain", "verdict", "note")


class PrintedRun(Protocol):
    """What the text reads of one run: a :class:`~lightning_speedpack.doctor.report.RunSummary`.

    Described here, not imported: ``Report.print`` imports this module.
    """

    @property
    def wall_s(self) -> float:
        """Seconds of the fit."""
        ...

    @property
    def samples(self) -> int:
        """Samples (or the run's own unit) the fit trained on."""
        ...

    @property
    def samples_per_sec(self) -> float:
        """:attr:`samples` over :attr:`wall_s`."""
        ...

    @property
    def figures(self) -> dict[str, Any]:
        """What the diagnostics measured about the run, by name."""
        ...


class PrintedReport(Protocol):
    """What the text reads of a report: a :class:`~lightning_speedpack.doctor.report.Report`."""

    @property
    def findings(self) -> list[Finding]:
        """The findings, as the doctor collected them."""
        ...

    @property
    def runs(self) -> Sequence[PrintedRun]:
        """One per ``Trainer.fit``."""
        ...

    @property
    def skipped(self) -> list[str]:
        """What the run left out that ``--deep`` adds."""
        ...


def print_report(
    report: PrintedReport,
    console: Console | None = None,
    *,
    layout: str | None = None,
    width: int | None = None,
) -> None:
    """Print ``report`` (see the module docstring) to ``console`` (default: stderr).

    Args:
        report: what the doctor collected.
        console: where to print; default a :func:`~lightning_speedpack.core.console.make_console`.
        layout: ``"table"``, ``"log"`` or ``"auto"``/None (by whether the output is a terminal).
        width: columns to print at (default: the console's, the terminal's, or 120 in a log).
    """
    if console is None:
        console = make_console(width=width, layout=layout)
    else:
        prepare(console, layout=layout, width=width)
    console.rule("[bold]speedpack doctor")
    _print_runs(console, report.runs)
    if report.skipped:
        print_paragraph(
            console,
            f"Left out (costlier; `speedpack doctor --deep` adds): {'; '.join(report.skipped)}.",
        )
    _print_findings(console, report.findings)


def _print_runs(console: Console, runs: Sequence[PrintedRun]) -> None:
    if not runs:
        print_paragraph(console, "No Trainer.fit ran to completion, so there are no run figures.")
        return
    columns, rows = run_rows(runs)
    print_table(console, "Runs", columns, rows, transpose=True, records_in_log=True)
    for i, run in enumerate(runs):
        _print_world(console, i, run.figures.get("world"))
        _print_wall_time(console, i, run.figures.get("wall_time"))
        _print_what_if(console, i, run.figures.get("what_if"))


def run_rows(runs: Sequence[PrintedRun]) -> tuple[list[str], list[list[Cell]]]:
    """The runs as columns (``run``, ``wall s``, ..., then each scalar figure) and rows of text.

    Figures that are lists or tables (series, the wall-time ledger) stay in the JSON.
    """
    extra = sorted({k for r in runs for k, v in r.figures.items() if _is_scalar(v)})
    # What `samples` counts when every run counts the same thing: graphs (PyG), batches, ...
    units = {r.figures.get("sample_unit") or "samples" for r in runs}
    unit = units.pop() if len(units) == 1 else "samples"
    columns = ["run", "wall s", unit, f"{unit}/s", *extra]
    rows: list[list[Cell]] = [
        [
            str(i),
            f"{run.wall_s:.2f}",
            str(run.samples),
            f"{run.samples_per_sec:.1f}",
            *(_fmt(run.figures.get(k)) for k in extra),
        ]
        for i, run in enumerate(runs)
    ]
    return columns, rows


def _print_findings(console: Console, findings: list[Finding]) -> None:
    if not findings:
        print_paragraph(console, "No findings.")
        return
    shown = presented(findings)
    if layout_of(console) == "table":
        columns = [
            Column("severity"),
            Column("finding", ratio=3),
            Column("fix", ratio=2),
        ]
        rows: list[list[Cell]] = [[severity_label(f), _finding_cell(f), f.fix or ""] for f in shown]
        print_table(console, "Findings", columns, rows, show_lines=True, expand=True)
        return
    print_lines(console, _finding_paragraphs(shown, console.width))


def _finding_paragraphs(findings: list[Finding], width: int) -> Iterator[str]:
    yield f"Findings ({len(findings)})"
    for i, finding in enumerate(findings):
        if i:
            yield ""  # a blank line between findings: each reads as a paragraph
        yield from finding_lines(finding, width)


def _finding_cell(finding: Finding) -> Text:
    cell = Text(f"{finding.component}/{finding.id}", style="bold")
    cell.append(f"\n{finding.message}", style="")
    if finding.location:
        cell.append(f"\nwhere: {finding.location}", style="dim")
    return cell


def severity_label(finding: Finding) -> str:
    """``warning``, or ``info, on GPU`` for advice that pays only on a GPU (``pays_on``)."""
    return f"{finding.severity}, on {finding.pays_on}" if finding.pays_on else finding.severity


def finding_lines(finding: Finding, width: int) -> list[str]:
    """One finding as a paragraph at most ``width`` wide (but for an unbreakable word).

    The first line starts with ``[severity] component/id:`` and the message; then where and
    the fix, each on its own line. When that takes more than :data:`LINES_PER_100_CHARS` lines
    per 100 characters of message, where and the fix share a line, then flow into the message.

    Example:
        >>> f = Finding("advisor", "dataloader-workers", "num_workers=0: the step waits",
        ...             "train.py:30", fix="DataLoader(num_workers=4)", severity="info")
        >>> for line in finding_lines(f, 100):
        ...     print(line)
        [info] advisor/dataloader-workers: num_workers=0: the step waits
            where: train.py:30
            fix: DataLoader(num_workers=4)
    """
    head = f"[{severity_label(finding)}] {finding.component}/{finding.id}: "
    where = f"where: {finding.location}" if finding.location else ""
    fix = f"fix: {finding.fix}" if finding.fix else ""
    notes = [n for n in (where, fix) if n]
    message = finding.message
    candidates = [
        wrap_paragraph(message, width, head=head, notes=notes),
        wrap_paragraph(message, width, head=head, notes=[" | ".join(notes)] if notes else []),
        wrap_paragraph(
            f"{message} ({where})" if where else message,
            width,
            head=head,
            notes=[fix] if fix else [],
        ),
        wrap_paragraph(" ".join([message, *(f"({n})" for n in notes)]), width, head=head),
    ]
    budget = LINES_PER_100_CHARS * max(1, math.ceil(len(message) / 100))
    return next((c for c in candidates if len(c) <= budget), min(candidates, key=len))


def _print_what_if(console: Console, run: int, what_if: Any) -> None:
    # WhatIf's table: each remedy tried on this run's model and data, the measured gain.
    if not isinstance(what_if, dict) or not what_if.get("rows"):
        return
    seconds = what_if.get("trial_seconds")
    title = f"Run {run}: what if (remedies tried on this model and data"
    title += f", {seconds:.1f} s of trials)" if seconds is not None else ")"
    columns = list(what_if.get("columns", []))
    rows: list[list[Cell]] = []
    for row in what_if["rows"]:
        cells = dict(zip(columns, row, strict=False))
        gain = cells.get("gain")
        if gain is not None and cells.get("gain_low") is not None:
            gain = f"{gain:.2f}x ({cells['gain_low']:.2f}-{cells['gain_high']:.2f})"
        cells["gain"] = gain
        rows.append([_fmt(cells.get(c)) for c in _WHAT_IF])
    print_table(console, title, _WHAT_IF, rows)
    applied = what_if.get("applied") or {}
    if applied:
        applied_text = ", ".join(f"{k}={v}" for k, v in applied.items())
        print_paragraph(console, f"Applied for the fit: {applied_text}")


def _print_world(console: Console, run: int, world: Any) -> None:
    # Every DDP rank side by side (rank 0 gathered them), and the ranks that did not answer.
    if not isinstance(world, dict) or not world.get("ranks"):
        return
    from lightning_speedpack.world.table import LEGEND, display_table, display_title

    headers, rows = display_table(world)
    columns = [Column(h, justify="left" if h == "rank" else "right") for h in headers]
    print_table(console, f"Run {run}: {display_title(world)}", columns, rows)
    print_paragraph(console, LEGEND)
    for line in world.get("missing") or []:
        print_paragraph(console, line)


def _print_wall_time(console: Console, run: int, ledger: Any) -> None:
    # The wall-time ledger's breakdown: where the run's seconds went, largest first.
    if not isinstance(ledger, dict) or not ledger.get("total_s"):
        return
    parts = dict(ledger.get("parts", {}))
    callbacks = ledger.get("callbacks", {})
    parts.pop("callbacks", None)
    parts.update({f"callback {name}": seconds for name, seconds in callbacks.items()})
    total = ledger["total_s"]
    rows: list[list[Cell]] = [
        [part, f"{seconds:.2f}", f"{seconds / total:.1%}"]
        for part, seconds in sorted(parts.items(), key=lambda kv: -kv[1])
        if seconds / total >= 0.001
    ]
    columns = [Column("part"), Column("seconds", justify="right"), Column("share", justify="right")]
    title = f"Run {run}: where the wall time went ({total:.2f} s)"
    print_table(console, title, columns, rows)


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (int, float, str, bool)) or value is None


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)
