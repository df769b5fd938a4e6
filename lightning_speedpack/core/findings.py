"""The vocabulary every tool reports in: a :class:`Finding` and its :data:`Severity`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any, Literal

__all__ = ["Figure", "Finding", "Severity", "findings_from_dicts"]

Severity = Literal["info", "warning", "error"]
Figure = float | int | str | bool | None


@dataclass
class Finding:
    """One thing the doctor found: what, where in the user's code, the measured figure, the fix.

    Example:
        >>> Finding("throughput", "data-wait", "62% of each step waits for data",
        ...         figures={"data_wait_fraction": 0.62}, fix="wrap the dataset in CachedDataset")
        Finding(component='throughput', id='data-wait', ...)
    """

    component: str
    id: str
    message: str
    location: str | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    severity: Severity = "warning"
    fix: str | None = None
    #: where the fix pays: None (on this run's hardware) or ``"GPU"`` for advice that only
    #: speeds up a CUDA GPU (tensor-core multiples, host-device syncs) found on a CPU-only run;
    #: the report labels it "on GPU" and lists it after what pays here.
    pays_on: str | None = None

    def __repr__(self) -> str:
        return f"Finding(component={self.component!r}, id={self.id!r}, ...)"


def findings_from_dicts(findings: Iterable[dict[str, Any]]) -> list[Finding]:
    """A JSON report's findings (``speedpack doctor --json``) as :class:`Finding` objects.

    Unknown keys are dropped and missing ones take their defaults, so a report written by an
    older or newer release reads too (one without ``pays_on``, say).

    Example:
        >>> [f] = findings_from_dicts([{"component": "data", "id": "x", "message": "m", "new": 1}])
        >>> (f.component, f.pays_on, f.figures)
        ('data', None, {})
    """
    known = {f.name for f in fields(Finding)}
    out = []
    for item in findings:
        kwargs = {k: v for k, v in item.items() if k in known}
        kwargs.setdefault("message", "")
        if not isinstance(kwargs.get("figures"), dict):
            kwargs["figures"] = {}
        out.append(Finding(**kwargs))
    return out
