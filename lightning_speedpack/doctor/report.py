"""The doctor's report: findings and per-run figures, printed as text or written as JSON.

The text (rich tables in a terminal, a width-free layout in a log file) is
:mod:`lightning_speedpack.doctor.text`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lightning_speedpack.core.findings import Finding, Severity
from lightning_speedpack.doctor.grouping import ordered  # re-exported: its old home

__all__ = ["Finding", "Report", "RunSummary", "Severity", "ordered"]


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
    #: the script and its arguments as the doctor ran them (empty: not run by the doctor)
    command: list[str] = field(default_factory=list)
    #: when the report was made: ISO 8601 with the UTC offset (None: not run by the doctor)
    created: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the report with its stable keys: ``findings``, ``runs`` and ``skipped``.

        A report the doctor made also has ``command`` (the script and its arguments) and
        ``created`` (when), which the HTML page's header shows.
        """
        data: dict[str, Any] = {
            "findings": [asdict(f) for f in self.findings],
            "runs": [asdict(r) for r in self.runs],
            "skipped": list(self.skipped),
        }
        if self.command:
            data["command"] = list(self.command)
        if self.created is not None:
            data["created"] = self.created
        return data

    def write_json(self, path: str | Path) -> None:
        """Write :meth:`to_dict` as indented JSON to ``path``, creating parent folders."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(self.to_dict(), indent=2, default=str) + "\n")

    def print(
        self, console: Any = None, *, layout: str | None = None, width: int | None = None
    ) -> None:
        """Print the report to stderr (the script's stdout stays its own) or to ``console``.

        A terminal gets rich tables sized to it; a log file (SLURM, CI, ``nohup``) gets a layout
        that needs no width: ``figure: value`` lines and a paragraph per finding
        (:mod:`lightning_speedpack.doctor.text`).

        Args:
            console: a rich ``Console`` to print to (default: one on stderr).
            layout: ``"table"``, ``"log"``, or ``"auto"``/None (table on a terminal).
            width: columns to print at (default: the terminal's; 120 in a log).
        """
        from lightning_speedpack.doctor.text import print_report

        print_report(self, console, layout=layout, width=width)
