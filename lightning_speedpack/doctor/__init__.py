"""``speedpack doctor``: run a script with every diagnostic attached and report what slows it."""

from lightning_speedpack.core.findings import Finding
from lightning_speedpack.core.registry import (
    Diagnosable,
    Diagnostic,
    DoctorContext,
    register_diagnostic,
    registered_diagnostics,
    unregister_diagnostic,
)
from lightning_speedpack.doctor.report import Report, RunSummary

__all__ = [
    "Diagnosable",
    "Diagnostic",
    "DoctorContext",
    "Finding",
    "Report",
    "RunSummary",
    "register_diagnostic",
    "registered_diagnostics",
    "unregister_diagnostic",
]
