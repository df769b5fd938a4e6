"""The doctor's report: findings and per-run figures, printed with rich or written as JSON."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lightning_speedpack.core.findings import Finding, Severity

__all__ = ["Finding", "Report", "RunSummary", "Severity", "ordered"]

_ORDER = {"error": 0, "warning": 1, "info": 2}


def impact(finding: Finding) -> float:
    """The finding's measured share of the run: of the wall time, else of the step (0: unknown)."""
    for key in ("wall_fraction", "data_wait_fraction"):
        value = finding.figures.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return 0.0


def ordered(findings: list[Finding]) -> list[Finding]:
    """Severity first, then measured impact (largest first); ties keep their order."""
    return sorted(findings, key=lambda f: (_ORDER.get(f.severity, 3), -impact(f)))


@dataclass
class RunSummary:
    """Figures for one ``Trainer.fit`` under the doctor.

    ``figures`` holds what the diagnostic callbacks measured about the whole run
    (data-wait fraction, syncs per step, ...), keyed by name.
    """

    wall_s: float
    samples: int
    samples_per_sec: float
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    """Everything the doctor collected from one script."""

    findings: list[Finding] = field(default_factory=list)
    runs: list[RunSummary] = field(default_factory=list)
    #: what the run left out that ``speedpack doctor --deep`` adds (diagnostics, probes)
    skipped: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Return the report with its stable keys: ``findings``, ``runs`` and ``skipped``."""
        return {
            "findings": [asdict(f) for f in self.findings],
            "runs": [asdict(r) for r in self.runs],
            "skipped": list(self.skipped),
        }

    def write_json(self, path: str | Path) -> None:
        """Write :meth:`to_dict` as indented JSON to ``path``, creating parent folders."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(self.to_dict(), indent=2, default=str) + "\n")

    def print(self, console: Any = None) -> None:
        """Print the report as rich tables (to stderr so the script's stdout stays its own)."""
        from rich.console import Console
        from rich.table import Table

        console = console or Console(stderr=True)
        console.rule("[bold]speedpack doctor")
        if not self.runs:
            console.print("No Trainer.fit ran to completion, so there are no run figures.")
        runs = Table(title="Runs", show_lines=False)
        # Scalar figures the diagnostics measured become extra columns; series stay in the JSON.
        extra = sorted({k for r in self.runs for k, v in r.figures.items() if _is_scalar(v)})
        for col in ("run", "wall s", "samples", "samples/s", *extra):
            runs.add_column(col, justify="right")
        for i, run in enumerate(self.runs):
            runs.add_row(
                str(i),
                f"{run.wall_s:.2f}",
                str(run.samples),
                f"{run.samples_per_sec:.1f}",
                *(_fmt(run.figures.get(k)) for k in extra),
            )
        if self.runs:
            console.print(runs)
        for i, run in enumerate(self.runs):
            _print_wall_time(console, i, run.figures.get("wall_time"))
            _print_what_if(console, i, run.figures.get("what_if"))
        if self.skipped:
            console.print(
                f"Left out (costlier; `speedpack doctor --deep` adds): {'; '.join(self.skipped)}."
            )
        if not self.findings:
            console.print("No findings.")
            return
        table = Table(title="Findings", show_lines=True)
        for col in ("severity", "component / id", "finding", "where", "fix"):
            table.add_column(col, overflow="fold")
        for f in ordered(self.findings):
            table.add_row(
                f.severity, f"{f.component}/{f.id}", f.message, f.location or "", f.fix or ""
            )
        console.print(table)


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (int, float, str, bool)) or value is None


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def _print_what_if(console: Any, run: int, what_if: Any) -> None:
    # WhatIf's table: each remedy tried on this run's model and data, the measured gain.
    if not isinstance(what_if, dict) or not what_if.get("rows"):
        return
    from rich.table import Table

    seconds = what_if.get("trial_seconds")
    title = f"Run {run}: what if (remedies tried on this model and data"
    title += f", {seconds:.1f} s of trials)" if seconds is not None else ")"
    table = Table(title=title)
    shown = ("knob", "today", "candidate", "before", "after", "gain", "verdict", "note")
    for col in shown:
        table.add_column(col, overflow="fold")
    columns = list(what_if.get("columns", []))
    for row in what_if["rows"]:
        cells = dict(zip(columns, row, strict=False))
        gain = cells.get("gain")
        if gain is not None and cells.get("gain_low") is not None:
            gain = f"{gain:.2f}x ({cells['gain_low']:.2f}-{cells['gain_high']:.2f})"
        cells["gain"] = gain
        table.add_row(*(_fmt(cells.get(c)) for c in shown))
    console.print(table)
    applied = what_if.get("applied") or {}
    if applied:
        console.print("Applied for the fit: " + ", ".join(f"{k}={v}" for k, v in applied.items()))


def _print_wall_time(console: Any, run: int, ledger: Any) -> None:
    # The wall-time ledger's breakdown: where the run's seconds went, largest first.
    if not isinstance(ledger, dict) or not ledger.get("total_s"):
        return
    from rich.table import Table

    table = Table(title=f"Run {run}: where the wall time went ({ledger['total_s']:.2f} s)")
    for col in ("part", "seconds", "share"):
        table.add_column(col, justify="left" if col == "part" else "right")
    parts = dict(ledger.get("parts", {}))
    callbacks = ledger.get("callbacks", {})
    parts.pop("callbacks", None)
    parts.update({f"callback {name}": seconds for name, seconds in callbacks.items()})
    total = ledger["total_s"]
    for part, seconds in sorted(parts.items(), key=lambda kv: -kv[1]):
        if seconds / total >= 0.001:
            table.add_row(part, f"{seconds:.2f}", f"{seconds / total:.1%}")
    console.print(table)
