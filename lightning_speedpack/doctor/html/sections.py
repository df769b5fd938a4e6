"""One run's sections: throughput, step phases, data pipeline, wall time and the what-if table.

Each function takes a run of the JSON report (``{"wall_s", "samples", "samples_per_sec",
"figures"}``) and its index, and returns markup: a chart inside ``<figure class="chart"
data-chart=...>`` and the figures behind it as a table, or ``""`` when the run lacks the
figures (an older report, a diagnostic left out with ``--only``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_speedpack.doctor.html import charts
from lightning_speedpack.doctor.html.markup import chart, details, esc, fmt, is_number, table

__all__ = [
    "MAX_BARS",
    "SERIES",
    "data_pipeline",
    "phase_windows",
    "step_phases",
    "throughput",
    "wall_time",
    "what_if",
    "world",
]

SERIES = "samples_per_sec_over_steps"
PHASE_SERIES = "phase_ms_over_steps"
#: The most bars the step-phase chart draws; more logging windows are merged, in order.
MAX_BARS = 60
_WHAT_IF_SHOWN = ("knob", "today", "candidate", "before", "after", "gain", "verdict", "note")


def _figures(run: dict[str, Any]) -> dict[str, Any]:
    figures = run.get("figures")
    return figures if isinstance(figures, dict) else {}


def _points(series: Any) -> list[list[float]]:
    if not isinstance(series, list):
        return []
    return [
        [float(p[0]), float(p[1])]
        for p in series
        if isinstance(p, (list, tuple)) and len(p) == 2 and is_number(p[0]) and is_number(p[1])
    ]


def throughput(run: dict[str, Any], index: int) -> str:
    """Samples/s over the training steps (ThroughputLogger's series, per logging window)."""
    points = _points(_figures(run).get(SERIES))
    if not points:
        return '<p class="muted">No samples/s series in this run (ThroughputLogger off).</p>'
    svg = charts.line_chart(
        f"samples_per_sec-{index}", {"samples/s": points}, "training step", "samples / s"
    )
    return chart(
        "samples_per_sec",
        svg,
        f"Samples/s per logging window over {len(points)} windows "
        f"(whole run: {fmt(run.get('samples_per_sec'))} samples/s).",
        index,
    )


def phase_windows(series: Any) -> tuple[list[str], dict[str, list[float]]]:
    """The step-phase series as bar labels and one list of ms per phase, at most MAX_BARS.

    Windows beyond :data:`MAX_BARS` are merged in order (the mean of each group), labelled
    with the group's last step.

    Example:
        >>> phase_windows([[5, {"data_wait": 1.0}], [10, {"data_wait": 3.0, "other": 1.0}]])
        (['5', '10'], {'data_wait': [1.0, 3.0], 'other': [0.0, 1.0]})
    """
    windows = [
        (p[0], p[1])
        for p in (series if isinstance(series, list) else [])
        if isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[1], dict)
    ]
    phases: list[str] = []
    for _, ms in windows:
        phases += [k for k in ms if k not in phases]
    size = -(-len(windows) // MAX_BARS) if windows else 1
    labels: list[str] = []
    stacks: dict[str, list[float]] = {k: [] for k in phases}
    for start in range(0, len(windows), size):
        group = windows[start : start + size]
        labels.append(str(group[-1][0]))
        for phase in phases:
            values = [float(ms.get(phase) or 0.0) for _, ms in group]
            stacks[phase].append(sum(values) / len(values))
    return labels, stacks


def step_phases(run: dict[str, Any], index: int) -> str:
    """Stacked bars of ms per batch per phase over the logging windows (one bar as fallback)."""
    figures = _figures(run)
    labels, stacks = phase_windows(figures.get(PHASE_SERIES))
    whole = figures.get("phase_ms")
    if not labels and isinstance(whole, dict) and whole:
        labels, stacks = ["whole run"], {k: [float(v or 0.0)] for k, v in whole.items()}
        caption = "Mean host ms per training batch of each phase over the whole run."
    elif labels:
        caption = (
            "Mean host ms per training batch of each phase, per logging window "
            "(labelled by its last step)."
        )
    else:
        return '<p class="muted">No step-phase figures in this run (StepTimeline off).</p>'
    stacks = {k: v for k, v in stacks.items() if any(v)}
    svg = charts.stacked_bars(
        f"step_phases-{index}", labels, stacks, "ms per batch", horizontal=len(labels) == 1
    )
    out = chart("step_phases", svg, caption, index)
    shares = figures.get("phase_share")
    if isinstance(whole, dict) and isinstance(shares, dict):
        rows = [[k, whole.get(k), f"{float(shares.get(k) or 0):.1%}"] for k in whole]
        out += table(["phase", "ms per batch", "share"], rows, numeric=[1, 2])
    return out


def _stages(figures: dict[str, Any]) -> tuple[list[str], list[float]]:
    labels: list[str] = []
    values: list[float] = []
    named = [
        ("fetch_ms", "fetch (per sample)"),
        *(
            (k, f"stage {k[len('stage_') : -len('_ms')]} (per call)")
            for k in sorted(figures)
            if k.startswith("stage_") and k.endswith("_ms")
        ),
        ("collate_ms", "collate (per batch)"),
        ("queue_wait_ms", "queue wait (per batch)"),
    ]
    for key, label in named:
        if is_number(figures.get(key)):
            labels.append(label)
            values.append(float(figures[key]))
    return labels, values


def data_pipeline(run: dict[str, Any], index: int) -> str:
    """The data X-ray: ms per stage, the loader and model ceilings, per-epoch rates, verdict."""
    figures = _figures(run)
    labels, values = _stages(figures)
    out = []
    verdict = figures.get("verdict")
    if verdict:
        out.append(f'<p class="verdict"><strong>Verdict:</strong> {esc(verdict)}</p>')
    if labels:
        svg = charts.bar_chart(
            f"data_pipeline-{index}", labels, values, "ms", [f"{fmt(v)} ms" for v in values]
        )
        out.append(
            chart(
                "data_pipeline",
                svg,
                "Where a sample's loading time goes: each stage's mean ms per call "
                "(measured in the loading processes).",
                index,
            )
        )
    loader: Any = figures.get("loader_ceiling_samples_per_sec")
    model: Any = figures.get("model_ceiling_samples_per_sec")
    epochs = [e for e in figures.get("run_epochs") or [] if isinstance(e, dict)]
    if is_number(loader) or is_number(model):
        known = [(n, float(v)) for n, v in (("loader", loader), ("model", model)) if is_number(v)]
        names, rates = [n for n, _ in known], [v for _, v in known]
        svg = charts.bar_chart(
            f"data_ceilings-{index}", names, rates, "samples / s", [fmt(v) for v in rates]
        )
        out.append(
            chart(
                "data_ceilings",
                svg,
                "Ceilings: the samples/s the loader can deliver and the model can consume.",
                index,
            )
        )
    elif epochs:
        series = {
            label: [[e["epoch"], e[key]] for e in epochs if is_number(e.get(key))]
            for label, key in (
                ("loader", "loader_samples_per_sec"),
                ("model", "model_samples_per_sec"),
            )
        }
        svg = charts.line_chart(f"data_ceilings-{index}", series, "epoch", "samples / s")
        out.append(
            chart(
                "data_ceilings",
                svg,
                "Per epoch: the samples/s the loader delivered and the model consumed "
                "while each was busy (from the run itself).",
                index,
            )
        )
    if epochs:
        keys = [k for k in epochs[0] if k != "epoch"]
        rows = [[e.get("epoch"), *(e.get(k) for k in keys)] for e in epochs]
        out.append(
            details("Per-epoch figures", table(["epoch", *keys], rows, range(len(keys) + 1)))
        )
    scalars = [
        (k, figures.get(k))
        for k in (
            "worker_busy_fraction",
            "fetch_compute_fraction",
            "cache_hit_rate",
            "workers_needed",
        )
        if figures.get(k) is not None
    ]
    if scalars:
        out.append(table(["figure", "value"], scalars, numeric=[1]))
    return "".join(out) or '<p class="muted">No data-pipeline figures in this run.</p>'


def _ledger_parts(ledger: dict[str, Any]) -> list[tuple[str, float]]:
    parts = {k: float(v) for k, v in (ledger.get("parts") or {}).items() if is_number(v)}
    callbacks = {k: float(v) for k, v in (ledger.get("callbacks") or {}).items() if is_number(v)}
    if callbacks:
        parts.pop("callbacks", None)
        parts.update({f"callback {name}": seconds for name, seconds in callbacks.items()})
    return sorted(parts.items(), key=lambda kv: -kv[1])


def wall_time(run: dict[str, Any], index: int) -> str:
    """The wall-time ledger as bars: every part of the fit (callbacks apart), largest first."""
    ledger = _figures(run).get("wall_time")
    if not isinstance(ledger, dict) or not is_number(ledger.get("total_s")):
        return '<p class="muted">No wall-time ledger in this run.</p>'
    total = float(ledger["total_s"]) or 1.0
    parts = _ledger_parts(ledger)
    shown = [(k, v) for k, v in parts if v / total >= 0.001]
    out = ""
    if shown:
        svg = charts.bar_chart(
            f"wall_time-{index}",
            [k for k, _ in shown],
            [v for _, v in shown],
            "seconds",
            [f"{v:.2f} s ({v / total:.0%})" for _, v in shown],
        )
        out += chart(
            "wall_time",
            svg,
            f"Where the {fmt(ledger['total_s'])} s of the fit went (parts of at least 0.1%).",
            index,
        )
    rows = [[k, v, f"{v / total:.1%}"] for k, v in parts]
    return out + details("Every part", table(["part", "seconds", "share"], rows, [1, 2]))


def what_if(run: dict[str, Any], projection: Sequence[dict[str, Any]] = ()) -> str:
    """WhatIf's table: each remedy tried on this model and data, the gain, the verdict."""
    data = _figures(run).get("what_if")
    if not isinstance(data, dict) or not data.get("rows"):
        return ""
    columns = list(data.get("columns") or [])
    rows = []
    for row in data["rows"]:
        cells = dict(zip(columns, row, strict=False))
        gain = cells.get("gain")
        if is_number(gain) and is_number(cells.get("gain_low")):
            cells["gain"] = f"{gain:.2f}x ({cells['gain_low']:.2f}-{cells['gain_high']:.2f})"
        rows.append([cells.get(c) for c in _WHAT_IF_SHOWN])
    out = []
    seconds = data.get("trial_seconds")
    if is_number(seconds):
        out.append(f"<p>Remedies tried on this model and data in {seconds:.1f} s of trials.</p>")
    out.append(table(_WHAT_IF_SHOWN, rows, numeric=[3, 4]))
    applied = data.get("applied") or {}
    if isinstance(applied, dict) and applied:
        text = ", ".join(f"{k}={v}" for k, v in applied.items())
        out.append(f"<p><strong>Applied for the fit:</strong> {esc(text)}</p>")
    for finding in projection:
        out.append(f'<p class="projection">{esc(finding.get("message"))}</p>')
    return "".join(out)


def world(run: dict[str, Any], index: int) -> str:
    """Every DDP rank side by side (the text report's World table), then every rank's figures."""
    data = _figures(run).get("world")
    if not isinstance(data, dict) or not data.get("ranks"):
        return ""
    from lightning_speedpack.world.table import LEGEND, display_table, display_title, logged_table

    headers, rows = display_table(data)
    out = f'<p class="muted">{esc(display_title(data))}. {esc(LEGEND)}.</p>'
    out += table(headers, rows, range(1, len(headers)), "world")
    missing = data.get("missing") or []
    if missing:
        out += "<ul>" + "".join(f"<li>{esc(line)}</li>" for line in missing) + "</ul>"
    columns, full = logged_table(data)
    shown = {row[0] for row in rows}  # beyond 16 ranks, those the table shows
    full = [row for row in full if str(row[0]) in shown]
    turned = [[c, *(row[i] for row in full)] for i, c in enumerate(columns)]
    ranks = [f"rank {row[0]}" for row in full]
    every = table(["figure", *ranks], turned, range(1, len(ranks) + 1), "world-figures")
    return out + details("Every figure of every rank shown", every)
