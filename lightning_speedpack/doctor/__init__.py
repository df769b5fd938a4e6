"""``speedpack doctor``: run a script with every diagnostic attached and report what slows it.

The names here are imported lazily, so ``speedpack --help`` (and ``speedpack cache ...``) start
without importing Lightning.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_HOMES = {
    "Diagnosable": "lightning_speedpack.core.registry",
    "Diagnostic": "lightning_speedpack.core.registry",
    "DoctorContext": "lightning_speedpack.core.registry",
    "Finding": "lightning_speedpack.core.findings",
    "Report": "lightning_speedpack.doctor.report",
    "RunSummary": "lightning_speedpack.doctor.report",
    "register_diagnostic": "lightning_speedpack.core.registry",
    "registered_diagnostics": "lightning_speedpack.core.registry",
    "unregister_diagnostic": "lightning_speedpack.core.registry",
}

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


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
