"""The advisor's findings as a table: printed on rank 0, and logged as ``speedpack/advisor``.

Example:
    >>> from lightning_speedpack.advisor.rules import AdvisorFinding
    >>> found = [AdvisorFinding("zero-grad", "warning", "grads kept", "w.grad", "set_to_none=True")]
    >>> table_rows(found)
    [['zero-grad', 'warning', 'w.grad', 'set_to_none=True', None]]
    >>> summary_fields(found, None)["speedpack/advisor_findings"]
    1
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lightning_speedpack.advisor.rules import AdvisorFinding
from lightning_speedpack.core.tables import Cell

__all__ = ["print_findings", "severity_label", "summary_fields", "table_rows"]


def print_findings(
    console: Any,
    findings: Sequence[AdvisorFinding],
    skipped: Mapping[str, str],
    gpu_findings: Sequence[AdvisorFinding],
) -> None:
    """Print ``findings`` (and the ``skipped`` checks) as a rich table to ``console``.

    A table in a terminal; in a log file, records unless the table fits (``core.console``).
    """
    from lightning_speedpack.core.console import print_paragraph, print_table

    rows = [[severity_label(f), f.id, f.message, f.evidence, f.fix] for f in findings]
    title = f"SpeedAdvisor: {len(findings)} finding(s)"
    columns = ("severity", "id", "finding", "evidence", "fix")
    print_table(console, title, columns, rows, show_lines=True)
    if skipped:
        reasons = sorted(set(skipped.values()))
        line = f"skipped {', '.join(sorted(skipped))}: {'; '.join(reasons)}"
        if gpu_findings:  # read for a GPU instead: what would pay there
            found = ", ".join(dict.fromkeys(f.id for f in gpu_findings))
            line += f"; for a GPU later, see gpu_findings: {found}"
        print_paragraph(console, line)


def table_rows(findings: Sequence[AdvisorFinding]) -> list[list[Cell]]:
    """Rows of ``speedpack/advisor``: ``id``, ``severity``, ``evidence``, ``fix``, ``location``."""
    return [[f.id, f.severity, f.evidence, f.fix, f.location] for f in findings]


def summary_fields(
    findings: Sequence[AdvisorFinding], data_wait_fraction: float | None
) -> dict[str, Cell]:
    """Summary fields: findings per severity, their number, and the measured data wait."""
    fields: dict[str, Cell] = {
        f"speedpack/advisor/{severity}": sum(f.severity == severity for f in findings)
        for severity in ("error", "warning", "info")
    }
    fields["speedpack/advisor_findings"] = len(findings)
    if data_wait_fraction is not None:
        fields["speedpack/advisor/data_wait_fraction"] = round(data_wait_fraction, 4)
    return fields


def severity_label(finding: AdvisorFinding) -> str:
    """The severity, with where it pays when not here: ``"info, on GPU"``."""
    return f"{finding.severity}, on {finding.pays_on}" if finding.pays_on else finding.severity
