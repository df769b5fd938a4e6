"""What :class:`~lightning_speedpack.BatchSizeTuner` reports to the doctor, as findings.

- :func:`multiple_finding`: ``batch-size-multiple``, a batch size in use that is not a multiple
  of 8.
- :func:`trials_finding`: ``batch-size-trials``, what the tuner chose and the trials table (or
  why ``mode="nearest"`` kept the size without trials).
- :func:`caveat_findings`: ``batch-size-few-steps`` and ``batch-size-lr-unscaled``, from
  :mod:`~lightning_speedpack.batch_size.caveats`.
"""

from __future__ import annotations

from collections.abc import Sequence

from lightning_speedpack.batch_size.caveats import Caveat
from lightning_speedpack.batch_size.search import Trial, format_trials
from lightning_speedpack.core.findings import Finding, Severity

__all__ = ["TENSOR_CORE_MULTIPLE", "caveat_findings", "multiple_finding", "trials_finding"]

#: Tensor cores run fp16/bf16 matrix products fastest on multiples of this.
TENSOR_CORE_MULTIPLE = 8


def multiple_finding(size: int | None, on_gpu: bool) -> Finding | None:
    """``batch-size-multiple`` for a ``size`` in use that is not a multiple of 8, else ``None``.

    A warning on a GPU, an info elsewhere (no tensor cores to feed).

    Example:
        >>> finding = multiple_finding(30, on_gpu=True)
        >>> finding.severity, finding.figures
        ('warning', {'batch_size': 30, 'suggested_batch_size': 24})
        >>> multiple_finding(32, on_gpu=True) is None
        True
    """
    m = TENSOR_CORE_MULTIPLE
    if size is None or size % m == 0:
        return None
    suggestion = max(m, size - size % m)
    return Finding(
        "batch_size",
        "batch-size-multiple",
        f"the batch size {size} is not a multiple of {m}; "
        "tensor cores run fp16/bf16 matrix products fastest on multiples of 8",
        figures={"batch_size": size, "suggested_batch_size": suggestion},
        severity="warning" if on_gpu else "info",
        fix=f"use batch size {suggestion} (or {suggestion + m}), "
        "or add `BatchSizeTuner()` to pick the largest multiple of 8 that fits",
    )


def trials_finding(
    mode: str, trials: Sequence[Trial], chosen: int | None, *, dry_run: bool, kept: str | None
) -> Finding | None:
    """``batch-size-trials``: the choice and the trials table; ``None`` when nothing was tuned.

    ``kept`` is why ``mode="nearest"`` kept the size without trials (``None`` otherwise).
    """
    if trials:
        action = "would choose" if dry_run else "chose"
        return Finding(
            "batch_size",
            "batch-size-trials",
            f"BatchSizeTuner (mode={mode!r}) {action} batch size {chosen} after "
            f"{len(trials)} trials:\n{format_trials(trials, chosen)}",
            figures={
                "tuned_batch_size": chosen,
                "trials": [[t.batch_size, t.fits, t.samples_per_sec] for t in trials],
            },
            severity="info",
        )
    if kept is not None:
        return Finding(
            "batch_size",
            "batch-size-trials",
            f"BatchSizeTuner (mode={mode!r}) kept batch size {chosen} without trials: {kept}",
            figures={"tuned_batch_size": chosen, "trials": []},
            severity="info",
        )
    return None


def caveat_findings(caveats: Sequence[Caveat], *, applied: bool) -> list[Finding]:
    """One finding per caveat: a warning when the size was applied, an info for a dry run."""
    severity: Severity = "warning" if applied else "info"
    return [
        Finding(
            "batch_size",
            caveat.id,
            f"BatchSizeTuner: {caveat.message}",
            figures=dict(caveat.figures),
            severity=severity,
            fix=caveat.fix,
        )
        for caveat in caveats
    ]
