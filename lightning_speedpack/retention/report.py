"""What LossRetentionDetector reports: one :class:`RetainedGraph` per holder, worded and as rows."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from lightning_speedpack.core.findings import Finding
from lightning_speedpack.core.tables import Cell

__all__ = [
    "EXTRA_PATH",
    "TABLE",
    "RetainedGraph",
    "RetainedGraphError",
    "RetainedGraphWarning",
    "doctor_finding",
    "table_rows",
]

EXTRA_PATH = "training_step()"
"""The path prefix of a graph-carrying key returned from ``training_step``."""

TABLE = "speedpack/retained_graphs"
"""The run table of the holders (columns in :data:`~lightning_speedpack.core.tables.TABLES`)."""


class RetainedGraphError(RuntimeError):
    """Raised in ``mode="error"`` when something keeps graphs from earlier steps alive."""


class RetainedGraphWarning(UserWarning):
    """Warned in ``mode="warn"``: once per holder, and once per graph-carrying returned key."""


@dataclass
class RetainedGraph:
    """One holder of tensors that keep an autograd graph from an earlier step alive.

    Attributes:
        path: the holder, e.g. ``model.losses``, ``model.hist["aux"]``,
            ``my_script.GLOBAL_LOSSES`` or ``training_step()["aux"]`` for a returned key.
        step_first_seen: the training batch (0-based, counted over the fit) of the check that
            first found it.
        count: graph-carrying tensors from earlier steps it held at the last check.
        backpropagated: ``True`` when ``backward`` already ran through the graphs (only the
            graph nodes are kept, ~KiB per step); ``False`` when it never did, so every saved
            activation is kept too.
        est_bytes: bytes of saved tensors (activations) the graphs keep alive, estimated from
            up to 8 of them; parameters are not counted.
        example_grad_fn: the ``grad_fn`` name of one retained tensor, e.g. ``"MeanBackward0"``.
        example_path: one retained tensor's full path, e.g. ``model.losses[17]``.

    Example:
        >>> g = RetainedGraph("model.losses", 1, 5, True, 0, "MeanBackward0", "model.losses[4]")
        >>> g.severity
        'warning'
    """

    path: str
    step_first_seen: int
    count: int
    backpropagated: bool
    est_bytes: int
    example_grad_fn: str
    example_path: str = ""

    @property
    def severity(self) -> Literal["warning", "error"]:
        """``"error"`` when activations are retained (never back-propagated), else ``"warning"``."""
        return "warning" if self.backpropagated else "error"

    def describe(self) -> str:
        """A one-paragraph message naming the holder, what it keeps, and the fix."""
        if self.path.startswith(EXTRA_PATH):
            kept = (
                "its graph nodes"
                if self.backpropagated
                else f"~{_size(self.est_bytes)} of saved activations"
            )
            return (
                f"{self.path} returned from training_step still carries a grad_fn "
                f"({self.example_grad_fn}); Lightning passes the keys other than 'loss' to "
                f"on_train_batch_end without detaching them, so whatever stores the outputs "
                f"keeps {kept} per step. Fix: return `.detach()`ed values."
            )
        what = (
            "graph nodes (back-propagated)"
            if self.backpropagated
            else f"never back-propagated graphs with ~{_size(self.est_bytes)} of saved activations"
        )
        return (
            f"{self.path} holds {self.count} tensor(s) with autograd graphs from earlier steps "
            f"(first found at batch {self.step_first_seen}, e.g. {self.example_path or self.path}: "
            f"{self.example_grad_fn}): {what}; one more per step it keeps. {self.fix()}"
        )

    def fix(self) -> str:
        """The fix to apply."""
        return (
            "Store `loss.detach()` (or `loss.item()` for a Python number) instead of the tensor, "
            "and clear the container at epoch end."
        )


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def doctor_finding(f: RetainedGraph) -> Finding:
    """The doctor's :class:`~lightning_speedpack.core.findings.Finding` for one holder."""
    returned = f.path.startswith(EXTRA_PATH)
    return Finding(
        component="loss_retention",
        id="returned-graph"
        if returned
        else "retained-graph"
        if f.backpropagated
        else "retained-activations",
        message=f.describe(),
        location=f.path,
        figures={
            "count": f.count,
            "est_bytes": f.est_bytes,
            "backpropagated": f.backpropagated,
            "step_first_seen": f.step_first_seen,
        },
        severity=f.severity,
        fix="Return `.detach()`ed values for every key but 'loss'." if returned else f.fix(),
    )


def table_rows(findings: Iterable[RetainedGraph]) -> list[list[Cell]]:
    """Rows of the ``speedpack/retained_graphs`` table: one per holder, columns as ``TABLES`` fixes.

    Every cell is a plain Python value (counts from ``len``, bytes from storage sizes): logging
    them reads nothing from a device.

    Example:
        >>> table_rows([RetainedGraph("model.losses", 1, 5, True, 0, "MeanBackward0")])
        [['model.losses', 1, 5, True, 0, 'MeanBackward0']]
    """
    return [
        [f.path, f.step_first_seen, f.count, f.backpropagated, f.est_bytes, f.example_grad_fn]
        for f in findings
    ]
