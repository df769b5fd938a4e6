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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

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

#: Figures shown first, in this order, with these labels; any other scalar follows by name.
LABELS: dict[str, str] = {
    "wall_s": "wall time (s)",
    "samples": "samples",
    "samples_per_sec": "samples/s",
    "data_wait_fraction": "data wait (fraction of step)",
    "syncs_per_step": "syncs per step (user code)",
    "retained_graphs": "retained graphs",
    "batch_size": "batch size",
    "tuned_batch_size": "tuned batch size",
    "peak_rss_mb": "peak RSS (MB)",
}
SERIES = "samples_per_sec_over_steps"
_RUN_KEYS = ("wall_s", "samples", "samples_per_sec")


class ReportError(ValueError):
    """A file that is not a doctor JSON report; the message is one line naming the file."""


@dataclass
class Comparison:
    """Doctor reports compared with the first: figures side by side, findings gone and new.

    ``figures`` maps a figure's name to one value per report (None where a report lacks it);
    ``ratios`` maps it to each value over the first report's (None where not a number);
    ``disappeared[i]`` / ``appeared[i]`` are the findings of the first report missing from
    report ``i`` and those of report ``i`` missing from the first (``i`` = 0 is empty).

    Example:
        >>> run = {"wall_s": 10.0, "samples": 100, "samples_per_sec": 10.0, "figures": {}}
        >>> fast = dict(run, wall_s=4.0, samples_per_sec=25.0)
        >>> item = {"component": "sync_points", "id": "sync-item", "message": "m"}
        >>> c = compare({"before": {"findings": [item], "runs": [run]},
        ...              "after": {"findings": [], "runs": [fast]}})
        >>> c.ratios["samples_per_sec"]
        [1.0, 2.5]
        >>> [f["id"] for f in c.disappeared[1]]
        ['sync-item']
    """

    names: list[str]
    figures: dict[str, list[Any]]
    ratios: dict[str, list[float | None]]
    disappeared: list[list[dict[str, Any]]]
    appeared: list[list[dict[str, Any]]]
    series: list[list[list[float]]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The comparison as JSON-ready data (what ``--json`` writes)."""
        return {
            "reports": self.names,
            "figures": {
                name: {"values": values, "ratio_to_first": self.ratios[name]}
                for name, values in self.figures.items()
            },
            "findings": [
                {"report": name, "disappeared": gone, "appeared": new}
                for name, gone, new in zip(self.names, self.disappeared, self.appeared, strict=True)
            ][1:],
            SERIES: dict(zip(self.names, self.series, strict=True)),
        }


def load_report(path: str | Path) -> dict[str, Any]:
    """Read one ``speedpack doctor --json`` report.

    Raises:
        ReportError: the file is missing, not JSON, or not a doctor report (one-line message).
    """
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ReportError(f"{path}: cannot read it ({err.strerror or err})") from None
    try:
        data = json.loads(text)
    except ValueError as err:
        raise ReportError(f"{path}: not valid JSON ({err})") from None
    problem = _not_a_report(data)
    if problem:
        raise ReportError(f"{path}: not a speedpack doctor report ({problem})")
    return dict(data)


def _not_a_report(data: Any) -> str | None:
    if not isinstance(data, dict):
        return f"the top level is a {type(data).__name__}, not an object"
    for key in ("findings", "runs"):
        if not isinstance(data.get(key), list):
            return f"no {key!r} list"
    for i, f in enumerate(data["findings"]):
        if not (isinstance(f, dict) and isinstance(f.get("component"), str) and "id" in f):
            return f"findings[{i}] has no 'component' and 'id'"
    for i, r in enumerate(data["runs"]):
        if not isinstance(r, dict) or not isinstance(r.get("figures", {}), dict):
            return f"runs[{i}] is not a run summary"
        if not all(_is_number(r.get(k)) for k in _RUN_KEYS):
            return f"runs[{i}] lacks numeric {', '.join(_RUN_KEYS)}"
    return None


def compare(reports: dict[str, dict[str, Any]]) -> Comparison:
    """Compare doctor reports (name -> report, the first is the baseline); see :class:`Comparison`.

    Raises:
        ValueError: fewer than two reports.
    """
    if len(reports) < 2:
        raise ValueError(f"compare needs at least two reports, got {len(reports)}")
    names = list(reports)
    runs = [_last_run(r) for r in reports.values()]
    flat = [_scalars(run) for run in runs]
    keys = [k for k in LABELS if any(k in f for f in flat)]
    keys += sorted({k for f in flat for k in f} - set(keys))
    figures = {k: [f.get(k) for f in flat] for k in keys}
    ratios = {k: [_ratio(v, values[0]) for v in values] for k, values in figures.items()}
    base = _by_key(next(iter(reports.values()))["findings"])
    disappeared: list[list[dict[str, Any]]] = []
    appeared: list[list[dict[str, Any]]] = []
    for report in reports.values():
        found = _by_key(report["findings"])
        disappeared.append([f for k, f in base.items() if k not in found])
        appeared.append([f for k, f in found.items() if k not in base])
    series = [_series(run) for run in runs]
    return Comparison(names, figures, ratios, disappeared, appeared, series)


def _last_run(report: dict[str, Any]) -> dict[str, Any]:
    runs = report["runs"]
    return dict(runs[-1]) if runs else {}


def _scalars(run: dict[str, Any]) -> dict[str, Any]:
    """The run's scalar figures; a dict of scalars (``phase_share``) flattened to ``a/b``."""
    out = {k: run[k] for k in _RUN_KEYS if k in run}
    for key, value in (run.get("figures") or {}).items():
        if _is_scalar(value):
            out[key] = value
        elif isinstance(value, dict):
            out.update({f"{key}/{k}": v for k, v in value.items() if _is_scalar(v)})
    return out


def _series(run: dict[str, Any]) -> list[list[float]]:
    points = (run.get("figures") or {}).get(SERIES) or []
    return [
        [float(p[0]), float(p[1])]
        for p in points
        if isinstance(p, (list, tuple)) and len(p) == 2 and all(_is_number(v) for v in p)
    ]


_SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


def _by_key(findings: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Findings keyed ``component/id`` (the first of a key kept), most severe first."""
    out: dict[str, dict[str, Any]] = {}
    for f in sorted(findings, key=lambda f: _SEVERITY_ORDER.get(str(f.get("severity")), 3)):
        out.setdefault(f"{f['component']}/{f['id']}", f)
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (int, float, str, bool))


def _ratio(value: Any, first: Any) -> float | None:
    if not (_is_number(value) and _is_number(first)) or first == 0:
        return None
    return float(value) / float(first)


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
