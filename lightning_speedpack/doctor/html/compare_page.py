"""The page of ``speedpack compare --html``: doctor reports side by side, ratios to the first.

Made from :func:`lightning_speedpack.doctor.comparison.compare`: a summary strip (samples/s and
wall time of each report with its ratio to the first), samples/s over steps of every report on
one chart, the phase shares and the wall-time ledgers side by side, every figure with its
ratio, the findings gone and new against the first, and each report's findings in full.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning_speedpack.core.findings import findings_from_dicts
from lightning_speedpack.doctor.comparison import LABELS, Comparison, compare
from lightning_speedpack.doctor.html import charts
from lightning_speedpack.doctor.html.findings import finding_list
from lightning_speedpack.doctor.html.markup import (
    chart,
    details,
    document,
    esc,
    fmt,
    is_number,
    slug,
    table,
)
from lightning_speedpack.doctor.html.page import header

__all__ = ["render_compare_page", "write_compare_page"]


def _last_figures(report: dict[str, Any]) -> dict[str, Any]:
    runs = [r for r in report.get("runs") or [] if isinstance(r, dict)]
    figures = runs[-1].get("figures") if runs else None
    return figures if isinstance(figures, dict) else {}


def _ratio_text(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def _summary(comparison: Comparison) -> str:
    tiles = []
    rates = comparison.figures.get("samples_per_sec", [])
    walls = comparison.figures.get("wall_s", [])
    for i, name in enumerate(comparison.names):
        rate = rates[i] if i < len(rates) else None
        wall = walls[i] if i < len(walls) else None
        ratio = comparison.ratios.get("samples_per_sec", [None] * (i + 1))[i]
        extra = "" if i == 0 else f" ({_ratio_text(ratio)} the first)"
        tiles.append(
            f'<div class="tile" data-report="{esc(name)}"><div class="label">{esc(name)}</div>'
            f'<div class="value">{esc(fmt(rate))} samples/s{esc(extra)}</div>'
            f'<div class="muted">wall {esc(fmt(wall))} s</div></div>'
        )
    return f'<section class="summary" aria-label="summary">{"".join(tiles)}</section>'


def _figures_table(comparison: Comparison) -> str:
    names = comparison.names
    head = ["figure", names[0]]
    for name in names[1:]:
        head += [name, f"/ {names[0]}"]
    rows = []
    for key, values in comparison.figures.items():
        row: list[Any] = [LABELS.get(key, key), values[0]]
        for value, ratio in zip(values[1:], comparison.ratios[key][1:], strict=True):
            row += [value, _ratio_text(ratio)]
        rows.append(row)
    return table(head, rows, numeric=range(1, len(head)), cls="figures")


def _side_by_side(
    name: str, reports: dict[str, dict[str, Any]], read: Any, unit: str, caption: str
) -> str:
    stacks: dict[str, list[float]] = {}
    per_report = [read(_last_figures(r)) for r in reports.values()]
    for values in per_report:
        stacks.update({k: [] for k in values if k not in stacks})
    if not stacks:
        return ""
    for key in stacks:
        stacks[key] = [float(v.get(key) or 0.0) for v in per_report]
    stacks = {k: v for k, v in stacks.items() if any(v)}
    if not stacks:
        return ""
    svg = charts.stacked_bars(name, list(reports), stacks, unit, horizontal=True)
    return chart(name, svg, caption)


def _shares(figures: dict[str, Any]) -> dict[str, float]:
    shares = figures.get("phase_share")
    if not isinstance(shares, dict):
        return {}
    return {k: float(v) for k, v in shares.items() if is_number(v)}


def _wall(figures: dict[str, Any]) -> dict[str, float]:
    ledger = figures.get("wall_time")
    if not isinstance(ledger, dict):
        return {}
    return {k: float(v) for k, v in (ledger.get("parts") or {}).items() if is_number(v)}


def _changes(comparison: Comparison) -> str:
    first = comparison.names[0]
    out = []
    for i, name in enumerate(comparison.names[1:], 1):
        gone, new = comparison.disappeared[i], comparison.appeared[i]
        out.append(f"<h3>{esc(first)} &rarr; {esc(name)}</h3>")
        if not gone and not new:
            out.append(f"<p>{esc(name)} has the same findings as {esc(first)}.</p>")
            continue
        for label, cls, items in (("gone", "gone", gone), ("new", "new", new)):
            if items:
                out.append(
                    f'<div class="changes" data-change="{cls}" data-report="{esc(name)}">'
                    f'<p><span class="badge {cls}">{label}</span>{len(items)} finding(s)</p>'
                    f"{finding_list(findings_from_dicts(items), prefix=f'{cls}-{i}')}</div>"
                )
    return "".join(out)


def _block(key: str, title: str, body: str) -> str:
    if not body:
        return ""
    return f'<section class="block" id="{esc(key)}"><h2>{esc(title)}</h2>{body}</section>'


def render_compare_page(reports: dict[str, dict[str, Any]]) -> str:
    """Doctor reports (name -> report; the first is the baseline) as one HTML page.

    Raises:
        ValueError: fewer than two reports.

    Example:
        >>> run = {"wall_s": 10.0, "samples": 100, "samples_per_sec": 10.0, "figures": {}}
        >>> page = render_compare_page({"before": {"findings": [], "runs": [run]},
        ...                             "after": {"findings": [], "runs": [dict(run, wall_s=4.0)]}})
        >>> "before" in page and "0.40x" in page
        True
    """
    comparison = compare(reports)
    first = next(iter(reports.values()))
    runs = [r for r in first.get("runs") or [] if isinstance(r, dict)]
    body = [
        header(
            f"speedpack compare: {', '.join(comparison.names)}",
            first,
            runs,
            ("reports", len(comparison.names)),
        ),
        _summary(comparison),
    ]
    if any(comparison.series):
        series = dict(zip(comparison.names, comparison.series, strict=True))
        svg = charts.line_chart("compare-samples_per_sec", series, "training step", "samples / s")
        body.append(
            _block(
                "throughput",
                "Throughput",
                chart("samples_per_sec", svg, "Samples/s per logging window, one line per report."),
            )
        )
    shares = _side_by_side(
        "phase_shares",
        reports,
        _shares,
        "share of a training batch's host time",
        "Each report's step-phase shares (its last fit).",
    )
    wall = _side_by_side(
        "wall_time",
        reports,
        _wall,
        "seconds",
        "Where each report's wall time went (its last fit's ledger).",
    )
    body.append(_block("step-phases", "Step phases", shares))
    body.append(_block("wall-time", "Wall time", wall))
    body.append(
        _block("figures", "Figures, with the ratio to the first", _figures_table(comparison))
    )
    body.append(_block("findings-changed", "Findings gone and new", _changes(comparison)))
    full = "".join(
        details(
            f"{name}: {len(report.get('findings') or [])} finding(s)",
            finding_list(findings_from_dicts(report.get("findings") or []), prefix=f"r{slug(i)}"),
        )
        for i, (name, report) in enumerate(reports.items())
    )
    body.append(_block("findings", "Each report's findings", full))
    return document("speedpack compare", "\n".join(b for b in body if b))


def write_compare_page(reports: dict[str, dict[str, Any]], path: str | Path) -> Path:
    """Write :func:`render_compare_page` of ``reports`` to ``path`` (parents made); return it.

    Raises:
        ValueError: fewer than two reports.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render_compare_page(reports), encoding="utf-8")
    return target
