"""The vocabulary every tool reports in: a :class:`Finding` and its :data:`Severity`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Figure", "Finding", "Severity"]

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
