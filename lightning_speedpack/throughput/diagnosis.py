"""What the doctor concludes from ThroughputLogger's figures: the ``data-wait`` finding.

Plain functions over figures, so the rule can be tested without a Trainer. Where the user's
dataset reads its samples (``file.py:LINE`` of ``__getitem__``) is looked up only when a
finding needs it: reading source lines costs more than a hundred training steps' worth of
the logger's own bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning_speedpack.core.batch import BatchSizer
from lightning_speedpack.core.findings import Finding
from lightning_speedpack.core.locations import user_code_location

__all__ = ["DATA_WAIT_THRESHOLD", "batch_size_findings", "data_wait_findings", "getitem_location"]

#: More than this fraction of the step time waiting for the next batch is a finding.
DATA_WAIT_THRESHOLD = 0.2


def data_wait_findings(
    figures: dict[str, Any],
    num_workers: int | None,
    locate: Callable[[], str | None] = lambda: None,
) -> list[Finding]:
    """A ``data-wait`` warning when more than 20% of the step time waits for data.

    ``locate`` gives the finding's location (the dataset's ``__getitem__``); it is called only
    when there is a finding.

    Example:
        >>> [f.id for f in data_wait_findings({"data_wait_fraction": 0.6}, num_workers=0)]
        ['data-wait']
        >>> data_wait_findings({"data_wait_fraction": 0.1}, num_workers=0)
        []
    """
    fraction = figures.get("data_wait_fraction")
    if fraction is None or fraction <= DATA_WAIT_THRESHOLD:
        return []
    location = locate()
    return [
        Finding(
            component="throughput",
            id="data-wait",
            message=(
                f"{fraction:.0%} of each training step waits for the DataLoader's next batch "
                f"(step {figures.get('step_time_ms', 0.0):.1f} ms)"
            ),
            location=location,
            figures={"data_wait_fraction": fraction, "num_workers": num_workers},
            severity="warning",
            fix=(
                "cache the deterministic preprocessing with lightning_speedpack.CachedDataset "
                f"and/or raise DataLoader(num_workers=...) (now {num_workers}) with "
                "persistent_workers=True (and pin_memory=True on GPU)"
            ),
        )
    ]


def batch_size_findings(sizer: BatchSizer | None) -> list[Finding]:
    """One ``batch-size-not-measured`` info when some batch's size could not be read.

    The run's rates then count batches, not samples; the finding says why and which argument
    supplies the size.

    Example:
        >>> sizer = BatchSizer()
        >>> _ = sizer(object())
        >>> [(f.id, f.severity, f.figures["unsized_batches"]) for f in batch_size_findings(sizer)]
        [('batch-size-not-measured', 'info', 1)]
    """
    if sizer is None or sizer.not_measured is None:
        return []
    return [
        Finding(
            component="throughput",
            id="batch-size-not-measured",
            message=f"samples/s not measured ({sizer.unsized_batches} batches): "
            + sizer.not_measured.split(": it has no")[0]
            + "; the rates count batches",
            figures={"unsized_batches": sizer.unsized_batches, "sample_unit": sizer.unit},
            severity="info",
            fix="log the size with `self.log(..., batch_size=n)` in training_step, or pass "
            "`ThroughputLogger(batch_size_fn=lambda batch: ...)` (strict=True raises instead)",
        )
    ]


def getitem_location(getitem: Any) -> str | None:
    """``file.py:LINE`` of a dataset's ``__getitem__`` when it is the user's own code.

    Example:
        >>> from torch.utils.data import TensorDataset
        >>> getitem_location(TensorDataset.__getitem__) is None  # torch's, not the user's
        True
    """
    return user_code_location(getitem)
