"""``speedpack doctor``: run a script with every diagnostic attached and report what slows it."""

from lightning_speedpack.doctor.registry import (
    Diagnosable,
    Diagnostic,
    DoctorContext,
    register_diagnostic,
    registered_diagnostics,
    unregister_diagnostic,
)
from lightning_speedpack.doctor.report import Finding, Report, RunSummary

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
