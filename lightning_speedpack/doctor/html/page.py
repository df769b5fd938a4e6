"""The report page of ``speedpack doctor --html``: one self-contained HTML file per report.

Made from the JSON report alone (``Report.to_dict()``), so a page can be made again from an
archived ``--json`` file. Sections: a header (script, date, device and world size when the
report carries them, run count), a summary strip (samples/s, wall time, data wait, top
finding), then the world (DDP ranks side by side), throughput, step phases, data pipeline,
wall time, what-if, sync points, retained graphs, every finding with its fix, and every
figure. A report with no run (the script failed before a fit ended) still gets a page with
its findings.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

from lightning_speedpack.core.findings import findings_from_dicts
from lightning_speedpack.doctor.grouping import presented
from lightning_speedpack.doctor.html import findings as _findings
from lightning_speedpack.doctor.html import sections
from lightning_speedpack.doctor.html.markup import details, document, esc, fmt, is_number, table

__all__ = ["header", "render_report_page", "run_label", "scalar_rows", "write_report_page"]

_SCRIPT_KEYS = ("script", "command", "argv")
_DATE_KEYS = ("created", "date", "generated_at", "started_at")
_DEVICE_KEYS = ("device", "accelerator", "device_name")
_WORLD_KEYS = ("world_size", "num_processes", "devices")


def _first(sources: list[dict[str, Any]], keys: tuple[str, ...]) -> Any:
    for source in sources:
        for key in keys:
            value = source.get(key)
            if value not in (None, "", []):
                return value
    return None


def _runs(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in report.get("runs") or [] if isinstance(r, dict)]


def run_label(index: int, count: int) -> str:
    """``""`` for a report's only run, else ``"Run <index>"``."""
    return "" if count == 1 else f"Run {index}"


def header(
    title: str,
    report: dict[str, Any],
    runs: list[dict[str, Any]],
    count: tuple[str, Any] | None = None,
) -> str:
    """The page header: title, then script/command, date, device, world size and run count.

    ``count`` replaces the last item (``("runs", len(runs))``), e.g. ``("reports", 2)``.
    """
    sources = [report] + [r.get("figures") or {} for r in reversed(runs)]
    items: list[tuple[str, Any]] = []
    script = _first([report], _SCRIPT_KEYS)
    if script is not None:
        items.append(("script", " ".join(map(str, script)) if isinstance(script, list) else script))
    date = _first([report], _DATE_KEYS)
    if date is not None:
        items.append(("date", date))
    else:  # the report carries no date: say when the page was made
        items.append(("page made", _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")))
    device = _first(sources, _DEVICE_KEYS)
    if device is not None:
        items.append(("device", device))
    world = _first(sources, _WORLD_KEYS)
    if world is not None:
        ranks = any(isinstance((r.get("figures") or {}).get("world"), dict) for r in runs)
        note = "every rank in World; other figures" if ranks else "figures"
        items.append(("world size", f"{world} ({note} of rank 0; samples/s of the world)"))
    items.append(count or ("runs", len(runs)))
    meta = "".join(f"<div><dt>{esc(k)}</dt><dd>{esc(v)}</dd></div>" for k, v in items)
    return f'<header class="page"><h1>{esc(title)}</h1><dl class="meta">{meta}</dl></header>'


def _tile(label: str, value: str, cls: str = "tile") -> str:
    return (
        f'<div class="{cls}"><div class="label">{esc(label)}</div>'
        f'<div class="value">{esc(value)}</div></div>'
    )


def _summary(report: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    tiles = []
    if runs:
        run = runs[-1]
        figures = run.get("figures") or {}
        unit = str(figures.get("sample_unit") or "samples")  # graphs (PyG), batches, ...
        tiles.append(_tile(f"{unit}/s", fmt(run.get("samples_per_sec"))))
        tiles.append(_tile("wall time", f"{fmt(run.get('wall_s'))} s"))
        tiles.append(_tile(unit, fmt(run.get("samples"))))
        wait = figures.get("data_wait_fraction")
        if is_number(wait):
            tiles.append(_tile("data wait", f"{wait:.0%} of each step"))
    else:
        tiles.append(_tile("runs", "no fit completed"))
    shown = presented(findings_from_dicts(report.get("findings") or []))
    # The top finding is what to fix first: a warning or error that pays on this hardware.
    urgent = [f for f in shown if f.severity != "info" and f.pays_on is None]
    if urgent:
        top = urgent[0]
        message = top.message.splitlines()[0] if top.message else top.id
        text = f"[{top.severity}] {message[:200]}{'...' if len(message) > 200 else ''}"
        tiles.append(_tile("top finding", text, "tile wide"))
    elif shown:
        text = f"no warning that pays on this hardware; {len(shown)} notes below"
        tiles.append(_tile("top finding", text, "tile wide"))
    return f'<section class="summary" aria-label="summary">{"".join(tiles)}</section>'


def _block(key: str, title: str, body: str, intro: str = "") -> str:
    if not body:
        return ""
    lead = f'<p class="muted">{esc(intro)}</p>' if intro else ""
    return f'<section class="block" id="{esc(key)}"><h2>{esc(title)}</h2>{lead}{body}</section>'


def _per_run(runs: list[dict[str, Any]], draw: Any) -> str:
    parts = []
    for i, run in enumerate(runs):
        label = run_label(i, len(runs))
        body = draw(run, i)
        if body:
            parts.append((f"<h3>{esc(label)}</h3>" if label else "") + body)
    return "".join(parts)


def scalar_rows(runs: list[dict[str, Any]]) -> list[list[Any]]:
    """One row per scalar figure (``wall_s``, ``samples``, ... then by name), a cell per run."""
    keys = ["wall_s", "samples", "samples_per_sec"]
    for run in runs:
        keys += [
            k
            for k, v in (run.get("figures") or {}).items()
            if (v is None or isinstance(v, (int, float, str, bool))) and k not in keys
        ]

    def value(run: dict[str, Any], key: str) -> Any:
        return run[key] if key in run and key in keys[:3] else (run.get("figures") or {}).get(key)

    return [[k, *(value(r, k) for r in runs)] for k in keys]


def render_report_page(report: dict[str, Any]) -> str:
    """The doctor report (``Report.to_dict()``) as one self-contained HTML page.

    Example:
        >>> page = render_report_page({"findings": [], "runs": [], "skipped": []})
        >>> page.startswith("<!DOCTYPE html>") and "No Trainer.fit" in page
        True
    """
    runs = _runs(report)
    found = findings_from_dicts(report.get("findings") or [])
    body = [header("speedpack doctor report", report, runs), _summary(report, runs)]
    if not runs:
        body.append(
            '<p class="muted">No Trainer.fit ran to completion, so there are no run figures; '
            "the findings below are what the diagnostics saw before the script ended.</p>"
        )
    else:
        if len(runs) > 1:
            rows = [
                [i, r.get("wall_s"), r.get("samples"), r.get("samples_per_sec")]
                for i, r in enumerate(runs)
            ]
            body.append(
                _block(
                    "runs",
                    "Runs",
                    table(["run", "wall s", "samples", "samples/s"], rows, [0, 1, 2, 3]),
                )
            )
        body.append(
            _block(
                "world",
                "World",
                _per_run(runs, sections.world),
                "Every DDP rank's own figures, gathered by rank 0 at the end of fit.",
            )
        )
        body.append(_block("throughput", "Throughput", _per_run(runs, sections.throughput)))
        body.append(
            _block(
                "step-phases",
                "Step phases",
                _per_run(runs, sections.step_phases),
                "Host time of a training batch, cut into phases (StepTimeline).",
            )
        )
        body.append(
            _block("data-pipeline", "Data pipeline", _per_run(runs, sections.data_pipeline))
        )
        body.append(_block("wall-time", "Wall time", _per_run(runs, sections.wall_time)))
        projection = [
            f for f in report.get("findings") or [] if f.get("id") == "what-if-projection"
        ]
        what_if = _per_run(runs, lambda run, i: sections.what_if(run, projection))
        body.append(_block("what-if", "What if", what_if))
    body.append(
        _block(
            "sync-points",
            "Sync points",
            _findings.sync_points(found),
            "Where the host waits for the device: each call site, its code line, how often.",
        )
    )
    body.append(
        _block(
            "retained-graphs",
            "Retained graphs",
            _findings.retained_graphs(found),
            "Containers holding losses with their autograd graphs from earlier steps.",
        )
    )
    body.append(_block("findings", "Findings", _findings.finding_list(found)))
    if runs:
        header_row = ["figure", *(run_label(i, len(runs)) or "value" for i in range(len(runs)))]
        figures = table(header_row, scalar_rows(runs), range(1, len(runs) + 1), "figures")
        body.append(_block("figures", "All figures", details("Every scalar figure", figures)))
    skipped = report.get("skipped") or []
    if skipped:
        items = "".join(f"<li>{esc(s)}</li>" for s in skipped)
        body.append(
            _block("skipped", "Left out", f"<ul>{items}</ul>", "`speedpack doctor --deep` adds:")
        )
    return document("speedpack doctor report", "\n".join(b for b in body if b))


def write_report_page(report: dict[str, Any], path: str | Path) -> Path:
    """Write :func:`render_report_page` of ``report`` to ``path`` (parents made); return it.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     out = write_report_page({"findings": [], "runs": []}, Path(tmp) / "r.html")
        ...     out.read_text().count("<html")
        1
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render_report_page(report), encoding="utf-8")
    return target
