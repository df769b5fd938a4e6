"""The page's charts: matplotlib figures rendered to SVG markup to inline in the page.

Each function returns one ``<svg>`` element as a string: text stays text
(``svg.fonttype = "none"``), the output is deterministic (``svg.hashsalt`` and no date), and
every id inside it carries the chart's name as a prefix, so several charts can sit in one HTML
document without their ids (clip paths, markers) clashing. Only the object-oriented
:class:`matplotlib.figure.Figure` API is used: no pyplot, no global backend, no global state
beyond a scoped ``rc_context``. matplotlib is imported when a chart is drawn, never before.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["PALETTE", "bar_chart", "line_chart", "stacked_bars", "to_svg"]

#: Colours in the order series and phases take them (colour-blind-safe "tab10" subset).
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
_WIDTH = 8.0  # inches; the page scales the SVG down to its column
_ID = re.compile(r'\bid="([^"]+)"')
_REF = re.compile(r'(url\(#|xlink:href="#|href="#)([^")]+)')
_METADATA = re.compile(r"\s*<metadata>.*?</metadata>", re.DOTALL)
_RC: dict[Any, Any] = {
    "svg.fonttype": "none",
    "text.parse_math": False,  # labels come from reports: a "$" never starts mathtext
    "font.size": 9.0,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "figure.dpi": 72.0,
}


def _figure(height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(_WIDTH, height), layout="constrained")


def to_svg(fig: Figure, name: str) -> str:
    """The figure as one ``<svg>`` element, its ids prefixed with ``name`` (deterministic).

    Example:
        >>> from matplotlib.figure import Figure
        >>> fig = Figure(figsize=(2, 1))
        >>> _ = fig.subplots().plot([0, 1], [0, 1])
        >>> svg = to_svg(fig, "demo")
        >>> svg.startswith("<svg") and 'id="demo-' in svg and svg == to_svg(fig, "demo")
        True
    """
    import matplotlib

    buffer = io.StringIO()
    prefix = re.sub(r"[^A-Za-z0-9_-]+", "-", name)
    with matplotlib.rc_context({**_RC, "svg.hashsalt": f"speedpack-{prefix}"}):
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    text = _METADATA.sub("", text[text.index("<svg") :])
    text = _ID.sub(lambda m: f'id="{prefix}-{m.group(1)}"', text)
    text = _REF.sub(lambda m: f"{m.group(1)}{prefix}-{m.group(2)}", text)
    return text.strip()


def _draw(name: str, height: float, paint: Any) -> str:
    import matplotlib

    with matplotlib.rc_context(_RC):
        fig = _figure(height)
        paint(fig.subplots())
        return to_svg(fig, name)


def line_chart(
    name: str,
    series: Mapping[str, Sequence[Sequence[float]]],
    xlabel: str,
    ylabel: str,
) -> str:
    """Lines of ``[x, y]`` points, one per entry of ``series`` (a legend when several).

    Example:
        >>> svg = line_chart("rate", {"run": [[10, 90.0], [20, 95.0]]}, "step", "samples/s")
        >>> svg.count("<path") > 2
        True
    """

    def paint(ax: Any) -> None:
        for i, (label, points) in enumerate(series.items()):
            if not points:
                continue
            xs = [float(p[0]) for p in points]
            ys = [float(p[1]) for p in points]
            ax.plot(
                xs,
                ys,
                marker="." if len(xs) <= 60 else None,
                color=PALETTE[i % len(PALETTE)],
                label=label,
                linewidth=1.5,
            )
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if _spans_decades(series):  # a loader at 16,000/s beside a model at 30/s: both visible
            from matplotlib.ticker import NullFormatter, StrMethodFormatter

            ax.set_yscale("log")
            # Plain numbers: the default 10^k labels are mathtext, raw "$10^{4}$" as SVG text.
            ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
        else:
            ax.set_ylim(bottom=0)
        if len(series) > 1:
            ax.legend(loc="best", fontsize=8)

    return _draw(name, 3.2, paint)


def _spans_decades(series: Mapping[str, Sequence[Sequence[float]]]) -> bool:
    """Whether the lines' typical values are more than 30x apart (then a log axis shows both)."""
    typical = []
    for points in series.values():
        ys = sorted(float(p[1]) for p in points if float(p[1]) > 0)
        if ys:
            typical.append(ys[len(ys) // 2])
    return len(typical) > 1 and max(typical) > 30 * min(typical)


def stacked_bars(
    name: str,
    labels: Sequence[str],
    stacks: Mapping[str, Sequence[float]],
    value_label: str,
    horizontal: bool = False,
) -> str:
    """One bar per label, stacked from ``stacks`` (segment name -> one value per label).

    Example:
        >>> svg = stacked_bars("phases", ["10", "20"],
        ...                    {"data_wait": [1.0, 2.0], "backward": [3.0, 3.0]}, "ms per batch")
        >>> "data_wait" in svg and "backward" in svg
        True
    """
    positions = list(range(len(labels)))

    def paint(ax: Any) -> None:
        base = [0.0] * len(labels)
        for i, (segment, values) in enumerate(stacks.items()):
            heights = [float(v or 0.0) for v in values]
            color = PALETTE[i % len(PALETTE)]
            if horizontal:
                ax.barh(positions, heights, left=base, color=color, label=segment)
            else:
                ax.bar(positions, heights, bottom=base, color=color, label=segment)
            base = [b + h for b, h in zip(base, heights, strict=True)]
        ticks = [str(label) for label in labels]
        if horizontal:
            ax.set_yticks(positions, ticks)
            ax.invert_yaxis()
            ax.set_xlabel(value_label)
            ax.grid(axis="y", visible=False)
        else:
            step = max(1, len(labels) // 16)  # at most ~16 tick labels
            ax.set_xticks(positions[::step], ticks[::step])
            ax.set_ylabel(value_label)
            ax.grid(axis="x", visible=False)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)

    height = max(1.8, 0.45 * len(labels) + 1.0) if horizontal else 3.4
    return _draw(name, height, paint)


def bar_chart(
    name: str,
    labels: Sequence[str],
    values: Sequence[float],
    value_label: str,
    annotations: Sequence[str] | None = None,
) -> str:
    """Horizontal bars, one per label, largest wherever it is given; optional text at each end.

    Example:
        >>> svg = bar_chart("wall", ["training_step", "data_wait"], [4.0, 6.0], "seconds",
        ...                 annotations=["40%", "60%"])
        >>> "60%" in svg
        True
    """
    positions = list(range(len(labels)))

    def paint(ax: Any) -> None:
        colors = [PALETTE[i % len(PALETTE)] for i in positions]
        ax.barh(positions, [float(v) for v in values], color=colors)
        ax.set_yticks(positions, [str(label) for label in labels])
        ax.invert_yaxis()
        ax.set_xlabel(value_label)
        ax.grid(axis="y", visible=False)
        if annotations:
            for pos, value, text in zip(positions, values, annotations, strict=True):
                ax.annotate(
                    text,
                    (float(value), pos),
                    xytext=(4, 0),
                    textcoords="offset points",
                    va="center",
                    fontsize=8,
                )
            ax.margins(x=0.12)

    return _draw(name, max(1.6, 0.32 * len(labels) + 0.9), paint)
