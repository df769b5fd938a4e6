"""The page's building blocks: escaping, numbers, tables, chart frames and the document shell.

Every string taken from a report goes through :func:`esc` (``html.escape``) before it reaches
the page; the helpers here take raw values and escape them themselves, and return markup.
The style sheet is inline (no font, no script, nothing fetched), so the page renders from a
``file://`` URL, a CI artifact or a viewer whose Content-Security-Policy blocks scripts.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "CSS",
    "chart",
    "details",
    "document",
    "esc",
    "fmt",
    "human_bytes",
    "is_number",
    "slug",
    "table",
]

CSS = """
:root { --fg:#1d2433; --muted:#5b6578; --line:#d9dee8; --bg:#ffffff; --soft:#f5f7fb;
  --error:#b42318; --warning:#b54708; --info:#175cd3; --good:#067647; --gpu:#6941c6; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
  color: var(--fg); background: var(--bg); }
main { max-width: 1100px; margin: 0 auto; padding: 16px 20px 48px; }
header.page { border-bottom: 1px solid var(--line); padding-bottom: 10px; }
header.page h1 { font-size: 22px; margin: 4px 0 6px; }
.meta { color: var(--muted); display: flex; flex-wrap: wrap; gap: 4px 18px; margin: 0; }
.meta dt { display: inline; font-weight: 600; } .meta dd { display: inline; margin: 0 0 0 4px; }
code, pre, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
  font-size: 12.5px; }
pre { background: var(--soft); padding: 8px 10px; overflow-x: auto; border-radius: 4px;
  margin: 6px 0; white-space: pre-wrap; }
.summary { display: flex; flex-wrap: wrap; gap: 10px; margin: 14px 0; }
.tile { background: var(--soft); border: 1px solid var(--line); border-radius: 6px;
  padding: 8px 12px; min-width: 150px; flex: 1 1 150px; }
.tile .label { color: var(--muted); font-size: 12px; text-transform: uppercase; }
.tile .value { font-size: 20px; font-weight: 600; }
.tile.wide { flex: 3 1 320px; } .tile.wide .value { font-size: 14px; font-weight: 500; }
section.block { margin-top: 26px; }
section.block > h2 { font-size: 17px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 15px; margin: 16px 0 6px; }
figure.chart { margin: 10px 0; }
figure.chart svg { width: 100%; max-width: 880px; height: auto; display: block; }
figcaption { color: var(--muted); font-size: 12.5px; }
table { border-collapse: collapse; margin: 8px 0; font-size: 13px; }
th, td { border: 1px solid var(--line); padding: 4px 8px; text-align: left; vertical-align: top;
  overflow-wrap: break-word; }
td code { overflow-wrap: anywhere; }
table.figures td:first-child { white-space: nowrap; } table.figures td { max-width: 360px; }
.table-wrap { max-width: 100%; overflow-x: auto; }
th { background: var(--soft); font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.muted { color: var(--muted); }
.badge { display: inline-block; border-radius: 10px; padding: 0 8px; font-size: 12px;
  font-weight: 600; color: #fff; margin-right: 6px; }
.badge.error { background: var(--error); } .badge.warning { background: var(--warning); }
.badge.info { background: var(--info); } .badge.gpu { background: var(--gpu); }
.badge.gone { background: var(--good); } .badge.new { background: var(--error); }
section.finding { border: 1px solid var(--line); border-left: 4px solid var(--info);
  border-radius: 4px; padding: 8px 12px; margin: 10px 0; }
section.finding.error { border-left-color: var(--error); }
section.finding.warning { border-left-color: var(--warning); }
section.finding h3 { margin: 0 0 4px; font-size: 14px; }
section.finding .fix { margin: 6px 0 0; }
section.finding .fix::before { content: "Fix: "; font-weight: 600; }
.message { white-space: pre-wrap; margin: 4px 0; }
details { margin: 6px 0; } summary { cursor: pointer; color: var(--muted); }
.better { color: var(--good); font-weight: 600; } .worse { color: var(--error); font-weight: 600; }
"""

_SLUG = re.compile(r"[^A-Za-z0-9_-]+")


def esc(value: Any) -> str:
    """``str(value)`` escaped for HTML text and attributes (quotes included).

    Example:
        >>> esc('<script>alert("x")</script>')
        '&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;'
    """
    return html.escape("" if value is None else str(value), quote=True)


def slug(value: Any) -> str:
    """A DOM-id-safe form of ``value``: runs of other characters become ``-``.

    Example:
        >>> slug("sync_points/sync-item <x>")
        'sync_points-sync-item-x-'
    """
    return _SLUG.sub("-", str(value))


def is_number(value: Any) -> bool:
    """A real number (an int or float that is not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def fmt(value: Any, digits: int = 3) -> str:
    """A figure as text: ``-`` for None, ints as they are, floats to ``digits`` significant.

    Example:
        >>> fmt(1234.5678), fmt(0.012345), fmt(None), fmt(7)
        ('1,235', '0.0123', '-', '7')
    """
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def human_bytes(value: Any) -> str:
    """Bytes as B, KB, MB or GB (``-`` when not a number).

    Example:
        >>> human_bytes(3 * 1024 * 1024)
        '3.0 MB'
    """
    if not is_number(value):
        return "-"
    size = float(value)
    for unit in ("B", "KB", "MB"):
        if abs(size) < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"


def table(
    header: Sequence[str],
    rows: Iterable[Sequence[Any]],
    numeric: Iterable[int] = (),
    cls: str = "",
) -> str:
    """A ``<table>``: header and cells escaped; columns in ``numeric`` right-aligned.

    A cell given as ``("raw", markup)`` is inserted as markup (already escaped by the caller).

    Example:
        >>> table(["a", "b"], [["<x>", 1]], numeric=[1])
        '<div class="table-wrap"><table><thead><tr><th>a</th><th>b</th></tr></thead><tbody><tr><td>&lt;x&gt;</td><td class="num">1</td></tr></tbody></table></div>'
    """  # noqa: E501
    right = set(numeric)
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            short = is_number(cell) or (isinstance(cell, str) and len(cell) <= 24)
            attr = ' class="num"' if i in right and short else ""
            if isinstance(cell, tuple) and len(cell) == 2 and cell[0] == "raw":
                cells.append(f"<td{attr}>{cell[1]}</td>")
            else:
                cells.append(f"<td{attr}>{esc(fmt(cell))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    cls_attr = f' class="{esc(cls)}"' if cls else ""
    return (
        f'<div class="table-wrap"><table{cls_attr}><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def chart(name: str, svg: str, caption: str, run: int | None = None) -> str:
    """A chart's frame: ``<figure class="chart" data-chart=name>`` around inline SVG markup.

    ``svg`` is markup made by :mod:`~lightning_speedpack.doctor.html.charts`; ``caption`` is
    plain text (escaped here).
    """
    run_attr = "" if run is None else f' data-run="{run}"'
    return (
        f'<figure class="chart" data-chart="{esc(name)}"{run_attr}>{svg}'
        f"<figcaption>{esc(caption)}</figcaption></figure>"
    )


def details(summary: str, body: str, open_: bool = False) -> str:
    """A ``<details>`` block: ``summary`` is plain text, ``body`` markup."""
    flag = " open" if open_ else ""
    return f"<details{flag}><summary>{esc(summary)}</summary>{body}</details>"


def document(title: str, body: str) -> str:
    """The whole page: doctype, inline style sheet and ``body`` markup; ``title`` is plain."""
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{esc(title)}</title>\n<style>{CSS}</style>\n</head>\n"
        f"<body>\n<main>\n{body}\n</main>\n</body>\n</html>\n"
    )
