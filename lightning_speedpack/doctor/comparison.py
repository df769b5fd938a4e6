"""Doctor reports compared with the first: the figures side by side, the findings gone and new.

The engine of ``speedpack compare`` (:mod:`lightning_speedpack.doctor.compare`, the command)
and of its HTML page (:mod:`lightning_speedpack.doctor.html.compare_page`): reading the JSON
reports and comparing them, nothing printed or drawn. It imports neither torch nor Lightning.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["LABELS", "SERIES", "Comparison", "ReportError", "compare", "load_report"]

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
