"""The what-if table, the projection, the findings: what ``WhatIf`` measured, in words and rows.

One row per knob: today, the candidate, the fit's samples/s before -> after (the medians of the
rounds, projected from the trial and the other side's pace, see
:mod:`~lightning_speedpack.what_if.fit_gain`; the trial's own ceilings when the other side was
not measured), the gain with its spread, the numerics and the verdict; the note keeps the
trial's own ratio ("the loader alone 314 -> 626 samples/s, 1.99x"). The projection: the
end-to-end samples/s of the two ceilings combined as the fit combines them (one after the
other without workers on a CPU, the slower of the two with them), today and with the winners,
beside what the fit then measured.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from lightning_speedpack.core.events import KnobResult, WhatIfResults
from lightning_speedpack.core.findings import Finding
from lightning_speedpack.core.tables import TABLES
from lightning_speedpack.what_if.fit_gain import fit_rate, overlaps, side_rates
from lightning_speedpack.what_if.knobs import RUN_TIME
from lightning_speedpack.what_if.measure import APPLY, Measurement

__all__ = ["COLUMNS", "Projection", "findings", "format_table", "project", "results", "rows"]

COLUMNS: tuple[str, ...] = TABLES["speedpack/what_if"]


def _note(m: Measurement) -> str:
    parts = [_alone(m)] if m.projected else []
    if m.reason:
        parts.append(m.reason)
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


def _alone(m: Measurement) -> str:
    """The trial's own ceilings and ratio, and the other side's pace the fit's gain used."""
    other = m.extra.get("other_side")
    with_ = (
        f"the model's step at {other:,.0f}" if m.side == "loader" else f"the loader at {other:,.0f}"
    )
    return (
        f"the {m.side} alone {_n(m.ceiling_before)} -> {_n(m.ceiling_after)} samples/s "
        f"({m.ceiling_gain or 0.0:.2f}x); the fit, with {with_} samples/s: {m.gain or 0.0:.2f}x"
    )


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
                _round(m.rate_before, 1),
                _round(m.rate_after, 1),
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
            f"{m.rate_before:,.0f} -> {m.rate_after:,.0f}"
            if m.rate_before is not None and m.rate_after is not None
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
    """End-to-end samples/s: the two ceilings combined as the fit does, today and with the winners.

    ``overlap_today`` / ``overlap_after``: whether loading runs beside the step (workers, or an
    accelerator) -- then the slower ceiling sets the pace; else the two times add.
    """

    loader_today: float | None
    model_today: float | None
    loader_after: float | None
    model_after: float | None
    fit_measured: float | None = None
    overlap_today: bool = True
    overlap_after: bool = True

    @property
    def today(self) -> float | None:
        """The fit's samples/s today."""
        return _combined(self.loader_today, self.model_today, self.overlap_today)

    @property
    def after(self) -> float | None:
        """The fit's samples/s with the winners."""
        return _combined(self.loader_after, self.model_after, self.overlap_after)

    def message(self) -> str:
        """The projection in one sentence."""
        parts = []
        if self.today is not None:
            both = f"loader {_n(self.loader_today)}, model {_n(self.model_today)}"
            how = f"min({both})" if self.overlap_today else f"{both} one after the other"
            parts.append(f"end to end today: {how} = {self.today:,.0f} samples/s")
        if self.after is not None:
            parts.append(f"with the winners: {self.after:,.0f} samples/s")
        if self.fit_measured is not None:
            parts.append(f"the fit measured {self.fit_measured:,.0f} samples/s")
        return "; ".join(parts) or "no ceiling was measured"


def _n(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _combined(loader: float | None, model: float | None, overlapped: bool) -> float | None:
    if loader and model:
        return fit_rate(loader, model, overlapped)
    known = [v for v in (loader, model) if v is not None]
    return min(known) if known else None


def project(
    found: Sequence[Measurement],
    min_gain: float,
    tolerance: float,
    fit: float | None = None,
    paces: tuple[float | None, float | None] = (None, None),
    workers: int | None = None,
    accelerator: bool = False,
) -> Projection:
    """Both ceilings today (the baselines) and with every ``apply`` winner, combined as the fit.

    ``paces`` are today's loader and model samples/s from the first pass of each (the trials'
    calibration): the ceilings when no knob of that side measured its own baseline. Each
    winner multiplies its side's ceiling by its own trial's gain (the loader's or the
    model's alone); ``workers`` (today's; None: unknown, the overlap assumed) and the
    ``num_workers`` winner say whether loading and the step overlap
    (:func:`~lightning_speedpack.what_if.fit_gain.fit_rate`).

    Example:
        >>> w = Measurement("num_workers", "loader", "0", "2", 2, [100.0] * 3, [190.0] * 3)
        >>> c = Measurement("channels_last", "model", "-", "cl", True, [400.0] * 3, [440.0] * 3)
        >>> p = project([w, c], 1.05, 1e-3, workers=0)
        >>> round(p.today), round(p.after)
        (80, 190)
    """
    loader_today, model_today = side_rates(found, paces)
    loader_after, model_after = loader_today, model_today
    after_workers = workers
    for m in found:
        gain = m.ceiling_gain
        if m.verdict(min_gain, tolerance) != APPLY or gain is None:
            continue
        if m.side == "loader" and loader_after is not None:
            loader_after *= gain
            if m.knob == "num_workers" and isinstance(m.value, int):
                after_workers = m.value
        elif m.side == "model" and model_after is not None and m.knob != "batch_size":
            model_after *= gain
    return Projection(
        loader_today,
        model_today,
        loader_after,
        model_after,
        fit,
        overlap_today=workers is None or overlaps(workers, accelerator),
        overlap_after=after_workers is None or overlaps(after_workers, accelerator),
    )


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
        if m.projected and m.ceiling_gain is not None:
            figures[f"{m.side}_alone_gain"] = round(m.ceiling_gain, 3)
            measured = (
                f"{m.knob}: {m.today} -> {m.candidate} gains the fit {m.gain:.2f}x "
                f"({spread[0]:.2f}-{spread[1]:.2f} over the rounds; the {m.side} alone "
                f"{m.ceiling_gain:.2f}x) on this model and data"
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
