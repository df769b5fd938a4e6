"""The what-if table, the projection, the findings: what ``WhatIf`` measured, in words and rows.

One row per knob: today, the candidate, the ceiling before -> after (samples/s, the medians of
the rounds), the gain with its spread, the numerics and the verdict. The projection: the
end-to-end samples/s a run can reach is the lower of its two ceilings, today and with the
winners, beside what the fit then measured.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from lightning_speedpack.core.events import KnobResult, WhatIfResults
from lightning_speedpack.core.findings import Finding
from lightning_speedpack.core.tables import TABLES
from lightning_speedpack.what_if.knobs import RUN_TIME
from lightning_speedpack.what_if.measure import APPLY, Measurement

__all__ = ["COLUMNS", "Projection", "findings", "format_table", "project", "results", "rows"]

COLUMNS: tuple[str, ...] = TABLES["speedpack/what_if"]


def _note(m: Measurement) -> str:
    parts = [m.reason] if m.reason else []
    extra = m.extra
    if "compile_s" in extra:
        even = extra.get("break_even_steps")
        parts.append(
            f"compile {extra['compile_s']:.1f} s apart"
            + (f", pays off after {even:,} steps" if even else ", never pays off here")
        )
    if "epoch_start_s" in extra:
        before, after = extra["epoch_start_s"]
        parts.append(f"epoch start {before:.2f} s -> {after:.2f} s")
    if "rounds" in extra:
        parts.append(extra["rounds"])
    if "with_num_workers" in extra:
        parts.append(f"with num_workers={extra['with_num_workers']}")
    if m.status is None and m.knob not in RUN_TIME and "applied_by" in extra:
        parts.append(f"not applied at run time: {extra['applied_by']}")
    return "; ".join(parts)


def rows(found: Sequence[Measurement], min_gain: float, tolerance: float) -> list[list[Any]]:
    """The table's rows (plain values), in :data:`COLUMNS` order."""
    out = []
    for m in found:
        low, high = m.spread or (None, None)
        out.append(
            [
                m.knob,
                m.side,
                m.today,
                m.candidate,
                _round(m.ceiling_before, 1),
                _round(m.ceiling_after, 1),
                _round(m.gain, 3),
                _round(low, 3),
                _round(high, 3),
                None if m.numerics is None else float(f"{m.numerics:.3g}"),
                m.verdict(min_gain, tolerance),
                _note(m),
            ]
        )
    return out


def _how(m: Measurement) -> str | None:
    """The line that applies a knob never applied at run time."""
    if m.knob == "precision":
        return f'Trainer(precision="{m.candidate}")'
    if m.knob == "compile":
        return "model = torch.compile(model) before trainer.fit(model)"
    if m.knob == "batch_size":
        return f"batch_size={m.candidate} (or BatchSizeTuner(mode='nearest'))"
    return None


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def format_table(found: Sequence[Measurement], min_gain: float, tolerance: float) -> str:
    """The table as plain text, one knob per line (for logs and the doctor's report).

    Example:
        >>> m = Measurement("num_workers", "loader", "0", "2", 2, [100.0] * 3, [190.0] * 3)
        >>> print(format_table([m], 1.05, 1e-3))  # doctest: +NORMALIZE_WHITESPACE
        knob today candidate before -> after samples/s gain (spread) verdict
        num_workers 0 2 100 -> 190 1.90x (1.90-1.90) apply
    """
    lines = [
        f"{'knob':<18} {'today':<12} {'candidate':<14} {'before -> after samples/s':<27} "
        f"{'gain (spread)':<22} verdict"
    ]
    for m in found:
        verdict = m.verdict(min_gain, tolerance)
        ceilings = (
            f"{m.ceiling_before:,.0f} -> {m.ceiling_after:,.0f}"
            if m.ceiling_before is not None and m.ceiling_after is not None
            else "-"
        )
        gain = "-"
        if m.gain is not None and m.spread is not None:
            gain = f"{m.gain:.2f}x ({m.spread[0]:.2f}-{m.spread[1]:.2f})"
        note = _note(m)
        if m.numerics is not None and verdict != APPLY:
            note = (
                f"loss moved {m.numerics:.2g}; {note}" if note else f"loss moved {m.numerics:.2g}"
            )
        line = (
            f"{m.knob:<18} {m.today[:12]:<12} {(m.candidate or '-')[:14]:<14} {ceilings:<27} "
            f"{gain:<22} {verdict}"
        )
        lines.append(line + (f": {note}" if note else ""))
    return "\n".join(lines)


@dataclass(frozen=True)
class Projection:
    """End-to-end samples/s: the lower of the two ceilings, today and with the winners."""

    loader_today: float | None
    model_today: float | None
    loader_after: float | None
    model_after: float | None
    fit_measured: float | None = None

    @property
    def today(self) -> float | None:
        """min(loader, model) today."""
        return _min(self.loader_today, self.model_today)

    @property
    def after(self) -> float | None:
        """min(loader, model) with the winners."""
        return _min(self.loader_after, self.model_after)

    def message(self) -> str:
        """The projection in one sentence."""
        parts = []
        if self.today is not None:
            parts.append(
                f"end to end today: min(loader {_n(self.loader_today)}, model "
                f"{_n(self.model_today)}) = {self.today:,.0f} samples/s"
            )
        if self.after is not None:
            parts.append(f"with the winners: {self.after:,.0f} samples/s")
        if self.fit_measured is not None:
            parts.append(f"the fit measured {self.fit_measured:,.0f} samples/s")
        return "; ".join(parts) or "no ceiling was measured"


def _median(values: Sequence[float | None]) -> float | None:
    known = sorted(v for v in values if v is not None)
    return statistics.median(known) if known else None


def _n(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _min(a: float | None, b: float | None) -> float | None:
    known = [v for v in (a, b) if v is not None]
    return min(known) if known else None


def project(
    found: Sequence[Measurement],
    min_gain: float,
    tolerance: float,
    fit: float | None = None,
    paces: tuple[float | None, float | None] = (None, None),
) -> Projection:
    """Both ceilings today (the baselines) and with every ``apply`` winner (gains multiplied).

    ``paces`` are today's loader and model samples/s from the first pass of each (the trials'
    calibration): the ceilings when no knob of that side measured its own baseline.

    Example:
        >>> w = Measurement("num_workers", "loader", "0", "2", 2, [100.0] * 3, [190.0] * 3)
        >>> c = Measurement("channels_last", "model", "-", "cl", True, [400.0] * 3, [440.0] * 3)
        >>> p = project([w, c], 1.05, 1e-3)
        >>> round(p.today), round(p.after)
        (100, 190)
    """
    loader = [
        m for m in found if m.side == "loader" and m.ceiling_before and not m.extra.get("on_top")
    ]
    model = [m for m in found if m.side == "model" and m.ceiling_before and m.knob != "batch_size"]
    # Each knob measured its own baseline; the median of them is the least disturbed figure.
    loader_today = _median([m.ceiling_before for m in loader]) or paces[0]
    model_today = _median([m.ceiling_before for m in model]) or paces[1]
    loader_after, model_after = loader_today, model_today
    for m in found:
        if m.verdict(min_gain, tolerance) != APPLY or m.gain is None:
            continue
        if m.side == "loader" and loader_after is not None:
            loader_after *= m.gain
        elif m.side == "model" and model_after is not None and m.knob != "batch_size":
            model_after *= m.gain
    return Projection(loader_today, model_today, loader_after, model_after, fit)


def results(
    found: Sequence[Measurement],
    min_gain: float,
    tolerance: float,
    applied: Collection[str] = (),
) -> WhatIfResults:
    """What the advisor gets (see :data:`~lightning_speedpack.core.events.WHAT_IF`)."""
    return WhatIfResults(
        tuple(
            KnobResult(
                m.knob,
                m.today,
                m.candidate,
                m.gain,
                m.verdict(min_gain, tolerance),
                m.reason,
                m.side,
                m.knob in applied,
            )
            for m in found
        ),
        min_gain,
    )


def findings(
    found: Sequence[Measurement],
    min_gain: float,
    tolerance: float,
    applied: dict[str, Any],
    projection: Projection,
) -> list[Finding]:
    """A finding per measured winner (not applied: a warning; applied: info); the projection."""
    out = []
    for m in found:
        verdict = m.verdict(min_gain, tolerance)
        if verdict != APPLY or m.gain is None:
            continue
        spread = m.spread or (m.gain, m.gain)
        figures = {
            "knob": m.knob,
            "gain": round(m.gain, 3),
            "gain_low": round(spread[0], 3),
            "gain_high": round(spread[1], 3),
            "candidate": m.candidate,
        }
        measured = (
            f"{m.knob}: {m.today} -> {m.candidate} measured {m.gain:.2f}x "
            f"({spread[0]:.2f}-{spread[1]:.2f} over the rounds) on this model and data"
        )
        if m.knob in applied:
            out.append(
                Finding(
                    "what_if",
                    f"what-if-{m.knob}",
                    f"applied for this fit: {measured}",
                    severity="info",
                    figures=figures,
                )
            )
            continue
        how = m.extra.get("applied_by") or _how(m)
        if m.knob in RUN_TIME:
            how = f"WhatIf(apply=[{m.knob!r}]) applies it for the fit, or set it in the code"
        elif m.knob == "cache":
            how = "wrap the dataset: CachedDataset(dataset) (its __getitem__ must be deterministic)"
        out.append(
            Finding(
                "what_if",
                f"what-if-{m.knob}",
                measured,
                severity="warning",
                fix=how,
                figures=figures,
            )
        )
    if projection.today is not None:
        out.append(
            Finding(
                "what_if",
                "what-if-projection",
                projection.message(),
                severity="info",
                figures={
                    "today_samples_per_sec": _round(projection.today, 1),
                    "after_samples_per_sec": _round(projection.after, 1),
                    "fit_samples_per_sec": _round(projection.fit_measured, 1),
                },
            )
        )
    return out
