"""The advisor's findings with what ``WhatIf`` measured: the gain each remedy gave on this model.

``WhatIf`` tries remedies (more workers, a cache, another precision, ...) on the user's own model
and data at train start and publishes what each gave
(:data:`~lightning_speedpack.core.events.WHAT_IF`, a
:class:`~lightning_speedpack.core.events.WhatIfResults`). A checklist item whose remedy was
tried should say what it gave, and must not urge a remedy that was measured not to pay:
:func:`with_measured_gains` amends the findings so. :data:`FINDING_KNOBS` says which knob backs
which finding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType

from lightning_speedpack.advisor.vocabulary import AdvisorFinding
from lightning_speedpack.core.events import KnobResult, WhatIfResults

__all__ = [
    "CHANGES_NUMERICS",
    "FINDING_KNOBS",
    "NOT_MEASURED",
    "NO_GAIN",
    "UNCERTAIN",
    "best_measured",
    "with_measured_gains",
]

FINDING_KNOBS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "dataloader-workers": ("num_workers",),
        "persistent-workers": ("persistent_workers",),
        "pin-memory": ("pin_memory",),
        "data-wait": ("cache", "num_workers"),  # either remedy; the better measured one speaks
        "batch-size-multiple": ("batch_size",),
        "precision": ("precision",),
        "cudnn-benchmark": ("cudnn_benchmark",),
        "channels-last": ("channels_last",),
    }
)
"""Advisor finding id -> the ``WhatIf`` knobs whose trial measures its remedy."""

NOT_MEASURED = frozenset({"not applicable", "not tried"})
"""``KnobResult.verdict`` values that carry no measurement: the finding stays as it is."""

CHANGES_NUMERICS = "changes the numerics"
"""The verdict of a remedy that was faster but computes something else (e.g. lower precision)."""

NO_GAIN = "no gain here"
"""The verdict of a remedy ``WhatIf`` measured not to pay; counts as none whatever its median."""

UNCERTAIN = "uncertain"
"""The verdict of a remedy whose median gained ``min_gain`` but not every round did."""


def best_measured(finding_id: str, results: WhatIfResults) -> KnobResult | None:
    """The measured trial of ``finding_id``'s knobs with the highest gain (None: none measured).

    Example:
        >>> from lightning_speedpack.core.events import KnobResult, WhatIfResults
        >>> r = WhatIfResults((KnobResult("cache", "off", "on", 1.9, "apply"),
        ...                    KnobResult("num_workers", "0", "2", 1.4, "apply")))
        >>> best_measured("data-wait", r).knob, best_measured("zero-grad", r)
        ('cache', None)
    """
    tried = [
        knob
        for name in FINDING_KNOBS.get(finding_id, ())
        if (knob := results.get(name)) is not None
        and knob.gain is not None
        and knob.verdict not in NOT_MEASURED
    ]
    return max(tried, key=lambda k: k.gain or 0.0, default=None)


def with_measured_gains(
    found: list[AdvisorFinding], results: WhatIfResults | None
) -> list[AdvisorFinding]:
    """Every finding whose knob ``WhatIf`` measured, carrying the gain; no advice it refuted.

    For each finding with a knob in :data:`FINDING_KNOBS` that was measured (the best, when
    ``data-wait`` has both the cache and the workers):

    - it carries the measurement: ``figures["measured_gain"]`` (3 decimals),
      ``figures["measured_candidate"]`` and ``figures["measured_knob"]``, and its evidence ends
      "; tried: <knob>=<candidate> gave <gain>x on this model";
    - a gain under ``results.min_gain`` (or a trial ``WhatIf`` itself called "no gain here")
      makes it ``info``, with "no gain here" in the evidence and a fix that says to leave the
      setting: the rule of thumb is not a warning against what was measured;
    - a remedy ``WhatIf`` applied for this fit makes it ``info`` ("applied by WhatIf");
    - a remedy that "changes the numerics" makes it ``info`` too, whatever its gain, and says
      so: a faster run that computes something else is a choice, not a fix to apply;
    - otherwise it keeps its severity, and its fix gets the measured gain (an "uncertain"
      verdict, the median over ``min_gain`` but not every round, is said in the evidence).

    Knobs reported "not applicable" or "not tried", findings without a knob, and every finding
    when ``results`` is None pass through unchanged. Apply it once, to the checks' findings.

    Example:
        >>> from lightning_speedpack.core.events import KnobResult, WhatIfResults
        >>> workers = AdvisorFinding("dataloader-workers", "warning", "no workers",
        ...                          "num_workers=0", "DataLoader(num_workers=2)")
        >>> r = WhatIfResults((KnobResult("num_workers", "0", "2", 0.98, "no gain here"),), 1.05)
        >>> (f,) = with_measured_gains([workers], r)
        >>> f.severity, f.figures["measured_gain"]
        ('info', 0.98)
        >>> print(f.evidence)
        num_workers=0; tried: num_workers=2 gave 0.98x on this model: no gain here
    """
    if results is None:
        return found
    amended: list[AdvisorFinding] = []
    for finding in found:
        knob = best_measured(finding.id, results)
        amended.append(finding if knob is None else _with_gain(finding, knob, results.min_gain))
    return amended


def _with_gain(finding: AdvisorFinding, knob: KnobResult, min_gain: float) -> AdvisorFinding:
    gain = knob.gain or 0.0  # shown to 2 decimals, kept to 3
    tried = knob.knob if knob.candidate is None else f"{knob.knob}={knob.candidate}"
    said = f"tried: {tried} gave {gain:.2f}x on this model"
    figures = {
        **finding.figures,
        "measured_knob": knob.knob,
        "measured_gain": round(gain, 3),
        "measured_candidate": knob.candidate,
    }
    if knob.applied:
        return replace(
            finding,
            severity="info",
            evidence=f"{finding.evidence}; {said}: applied by WhatIf for this fit",
            fix=f"applied for this fit by WhatIf (measured {gain:.2f}x); to keep it without "
            f"WhatIf: {finding.fix}",
            figures={**figures, "applied_by_what_if": True},
        )
    if knob.verdict == CHANGES_NUMERICS:
        return replace(
            finding,
            severity="info",
            evidence=f"{finding.evidence}; {said}, but it changes the numerics",
            fix=f"{finding.fix} (measured {gain:.2f}x on this model, but it changes the "
            "numerics: compare the loss curves before adopting it)",
            figures=figures,
        )
    if gain < min_gain or knob.verdict == NO_GAIN:
        why = (
            f"under the {min_gain:.2f}x that counts as a gain"
            if gain < min_gain
            else "no gain over the spread of WhatIf's rounds"
        )
        return replace(
            finding,
            severity="info",
            evidence=f"{finding.evidence}; {said}: no gain here",
            fix=f"leave {knob.knob}={knob.today}: {tried} measured {gain:.2f}x on this model, "
            f"{why} (the checklist's fix: {finding.fix})",
            figures=figures,
        )
    if knob.verdict == UNCERTAIN:
        said = f"{said} (the median; not every round gained)"
    return replace(
        finding,
        evidence=f"{finding.evidence}; {said}",
        fix=f"{finding.fix} (measured {gain:.2f}x on this model)",
        figures=figures,
    )
