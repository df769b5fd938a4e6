"""``speedpack compare A B [C ...]``: doctor reports side by side, before and after a change.

Debugging speed means changing one thing and comparing runs. This command takes the JSON
reports of ``speedpack doctor --json`` (one per run, the first being the baseline) and prints:

- one table with every run figure (wall time, samples/s, data wait, syncs per step, retained
  graphs, batch size, peak RSS, and any other scalar a diagnostic measured) side by side, with
  each run's ratio to the first;
- the findings that disappeared and the ones that appeared, against the first report, matched
  by ``component/id``.

``--plot out.png`` draws samples/s over training steps for each report (the series
ThroughputLogger records per logging window; needs matplotlib), ``--json out.json`` writes
the comparison and ``--html out.html`` one self-contained page with the charts. ``--width`` and
``--layout`` shape the text (a log file gets no table wider than the width: see
:mod:`lightning_speedpack.core.console`). A file that is not JSON, or JSON that is not a doctor
report, gets a one-line error and exit code 2. Of a report with several fits, the last fit's
figures are compared.

This module imports neither torch nor Lightning.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

# The comparison itself, re-exported here (its old home); this module prints, draws and parses.
from lightning_speedpack.doctor.comparison import (
    LABELS,
    SERIES,
    Comparison,
    ReportError,
    compare,
    load_report,
)

if TYPE_CHECKING:
    from lightning_speedpack.core.console import Cell

__all__ = [
    "LABELS",
    "SERIES",
    "Comparison",
    "ReportError",
    "add_parser",
    "compare",
    "draw_plot",
    "load_report",
    "main",
    "print_comparison",
    "run",
]


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return str(value)
    return f"{value:.4g}" if abs(value) < 1000 else f"{value:.0f}"


def print_comparison(
    comparison: Comparison,
    console: Any = None,
    *,
    layout: str | None = None,
    width: int | None = None,
) -> None:
    """Print the figures side by side and, per report, the findings gone and new.

    A terminal gets rich tables. A log file gets a layout that needs no width (see
    :mod:`lightning_speedpack.core.console`): a line per figure, ``label: A=1, B=0 (0.00x)``,
    and a paragraph per finding.

    Args:
        comparison: what :func:`compare` returned.
        console: a rich ``Console`` (default: one on stdout).
        layout: ``"table"``, ``"log"``, or ``"auto"``/None (table on a terminal).
        width: columns to print at (default: the terminal's; 120 in a log).
    """
    from lightning_speedpack.core.console import layout_of, make_console, prepare

    if console is None:
        console = make_console(stderr=False, width=width, layout=layout)
    else:
        prepare(console, layout=layout, width=width)
    log = layout_of(console) == "log"
    _print_figures(console, comparison, log)
    for i in range(1, len(comparison.names)):
        _print_changes(console, comparison, i, log)


def _print_figures(console: Any, comparison: Comparison, log: bool) -> None:
    from rich.table import Column

    from lightning_speedpack.core.console import print_lines, print_table, wrap_paragraph

    names = comparison.names
    title = f"speedpack compare (ratio to {names[0]})"
    rows: list[list[Cell]] = []
    for key, values in comparison.figures.items():
        cells = [_fmt(values[0])]
        for value, ratio in zip(values[1:], comparison.ratios[key][1:], strict=True):
            cells += [_fmt(value), "-" if ratio is None else f"{ratio:.2f}x"]
        rows.append([LABELS.get(key, key), *cells])
    if log:  # a line per figure: a table of 40 figures by 3 columns a report reads badly
        lines = [title]
        for label, first, *rest in rows:
            pairs = [f"{names[0]}={first}"]
            for other, value, times in zip(names[1:], rest[::2], rest[1::2], strict=True):
                pairs.append(f"{other}={value}" + ("" if times == "-" else f" ({times})"))
            lines += wrap_paragraph(", ".join(map(str, pairs)), console.width, head=f"{label}: ")
        print_lines(console, [*lines, ""])
        return
    columns = [Column("figure"), Column(names[0], justify="right")]
    for name in names[1:]:
        columns += [Column(name, justify="right"), Column(f"/ {names[0]}", justify="right")]
    print_table(console, title, columns, rows)


def _print_changes(console: Any, comparison: Comparison, i: int, log: bool) -> None:
    """The findings of report ``i`` gone and new against the first report."""
    from rich.table import Column
    from rich.text import Text

    from lightning_speedpack.core.console import (
        print_lines,
        print_paragraph,
        print_table,
        wrap_paragraph,
    )

    base, name = comparison.names[0], comparison.names[i]
    gone, new = comparison.disappeared[i], comparison.appeared[i]
    if not gone and not new:
        print_paragraph(console, f"Findings: {name} has the same findings as {base}.")
        return
    title = f"Findings: {base} -> {name}"
    changes = [("disappeared", "green", f) for f in gone] + [("appeared", "red", f) for f in new]
    if log:
        lines = [title]
        for mark, _, f in changes:
            head = f"{mark}: [{f.get('severity', '')}] {f['component']}/{f['id']}: "
            lines += wrap_paragraph(_message(f), console.width, head=head)
        print_lines(console, lines)
        return
    rows: list[list[Cell]] = [
        [
            Text(mark, style=style),
            str(f.get("severity", "")),
            f"{f['component']}/{f['id']}",
            _message(f),
        ]
        for mark, style, f in changes
    ]
    headers = [Column(""), Column("severity"), Column("component / id"), Column("finding")]
    print_table(console, title, headers, rows, show_lines=True)


def _message(finding: dict[str, Any]) -> str:
    where = finding.get("location")
    message = str(finding.get("message", ""))
    return f"{message} ({where})" if where else message


def draw_plot(comparison: Comparison, path: str | Path) -> Path | None:
    """PNG of samples/s over training steps, one line per report; None when none has the series.

    Raises:
        ModuleNotFoundError: matplotlib is not installed (the message says how to install it).
    """
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise ModuleNotFoundError("--plot needs matplotlib: `pip install matplotlib`") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not any(comparison.series):
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    try:
        for name, points in zip(comparison.names, comparison.series, strict=True):
            if points:
                steps, rates = zip(*points, strict=True)
                ax.plot(steps, rates, marker=".", label=name)
        ax.set_xlabel("training step")
        ax.set_ylabel("samples / s")
        ax.set_title("Throughput over the run (ThroughputLogger, per logging window)")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(target, dpi=120)
    finally:
        plt.close(fig)
    return target


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``compare`` to ``speedpack``'s subcommands (``argparse`` subparsers); return it."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "compare",
        help="compare doctor JSON reports side by side (before/after a change)",
        description="Print every run figure of the doctor JSON reports (speedpack doctor --json) "
        "side by side with its ratio to the first report, and the findings that disappeared "
        "and appeared against the first.",
    )
    _arguments(parser)
    return parser


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("reports", nargs="+", metavar="REPORT", help="doctor JSON reports")
    parser.add_argument("--plot", metavar="PNG", help="draw samples/s over steps to PNG")
    parser.add_argument("--json", metavar="PATH", help="write the comparison as JSON to PATH")
    parser.add_argument(
        "--html",
        metavar="PATH",
        help="write the comparison as one self-contained HTML page with charts to PATH "
        "(needs matplotlib: pip install 'lightning-speedpack[html]')",
    )
    from lightning_speedpack.core.console import add_console_arguments

    add_console_arguments(parser)


def _names(paths: Sequence[str]) -> list[str]:
    stems = [Path(p).stem for p in paths]
    return stems if len(set(stems)) == len(stems) else [str(p) for p in paths]


def run(ns: argparse.Namespace) -> int:
    """Run ``compare`` for parsed arguments; return the exit code.

    ``ns`` has ``reports``, ``plot``, ``json``, ``html``, ``width`` and ``layout``. 0 on
    success; 2 for fewer than two reports, a report that cannot be read, or ``--html`` without
    matplotlib; 1 when the chart or the page was asked for and cannot be made.
    """
    if len(ns.reports) < 2:
        print("speedpack compare: give at least two reports (A B [C ...])", file=sys.stderr)
        return 2
    names = _names(ns.reports)
    if len(set(names)) < len(names):
        print("speedpack compare: a report is given twice", file=sys.stderr)
        return 2
    if ns.html:
        from lightning_speedpack.doctor.html import missing_requirement

        problem = missing_requirement()
        if problem:
            print(f"speedpack compare: {problem}", file=sys.stderr)
            return 2
    try:
        reports = {n: load_report(p) for n, p in zip(names, ns.reports, strict=True)}
    except ReportError as err:
        print(f"speedpack compare: {err}", file=sys.stderr)
        return 2
    comparison = compare(reports)
    print_comparison(comparison, layout=ns.layout, width=ns.width)
    if ns.json:
        target = Path(ns.json)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(comparison.to_dict(), indent=2) + "\n")
    page_failed = bool(ns.html) and not _write_page(reports, ns.html)
    if ns.plot:
        try:
            chart = draw_plot(comparison, ns.plot)
        except ModuleNotFoundError as err:
            print(f"speedpack compare: {err}", file=sys.stderr)
            return 1
        if chart is None:
            print(
                f"speedpack compare: no report has {SERIES} (ThroughputLogger records it); "
                "no chart drawn",
                file=sys.stderr,
            )
            return 1
        print(f"Chart of samples/s over steps: {chart}")
    return 1 if page_failed else 0


def _write_page(reports: dict[str, dict[str, Any]], path: str) -> bool:
    """``--html``: write the comparison's page; say why not (one line) and return False."""
    from lightning_speedpack.doctor.html import write_compare_page

    try:
        page = write_compare_page(reports, path)
    except OSError as err:
        print(f"speedpack compare: --html: cannot write {path}: {err}", file=sys.stderr)
        return False
    except Exception as err:  # a page that cannot be drawn must not cost the chart after it
        why = f"{type(err).__name__}: {err}"
        print(f"speedpack compare: --html: the page could not be made ({why})", file=sys.stderr)
        return False
    print(f"HTML page: {page}")
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """``speedpack compare`` on its own: parse ``argv`` and :func:`run`."""
    parser = argparse.ArgumentParser(
        prog="speedpack compare", description=__doc__.splitlines()[0] if __doc__ else None
    )
    _arguments(parser)
    return run(parser.parse_args(argv))
