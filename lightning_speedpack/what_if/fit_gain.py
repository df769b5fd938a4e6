"""The gain a fit will see from a knob: one side's trial, projected with the other side's pace.

A trial times one side alone: the loader without a model (a loader ceiling), or the model's
step on a batch in memory (a model ceiling). The fit runs both, and how they combine decides
what a faster side is worth (issue 38):

- loading in the fit's own process (``num_workers=0``) on a CPU run: the process loads a batch,
  then steps on it; the two times add, ``1 / fit = 1 / loader + 1 / model``;
- loading in worker processes, or a step on an accelerator (its kernels run while the process
  loads the next batch): the two overlap, and the slower one sets the pace,
  ``fit = min(loader, model)``.

So a loader 2x faster makes a fit whose step takes most of the time barely faster, and moving
the loading into workers also hides the step's time behind it. :func:`fit_rate` is that
arithmetic on samples/s; :func:`project_fit` gives every measured knob the fit's rates round
by round (``Measurement.fit_before`` / ``fit_after``), from which its gain and its verdict
then come. It assumes the workers' loading does not take cores from the step; on a machine
with fewer cores than workers plus the step's threads, a CPU-heavy loader gains the fit less.
On an accelerator, the sum would be the step's CPU part only, which is not measured apart: the
overlap is assumed, the lower of the two projections of a loader knob's gain.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from lightning_speedpack.what_if.measure import Measurement

__all__ = ["fit_rate", "overlaps", "project_fit", "side_rates"]


def fit_rate(loader: float, model: float, overlapped: bool, serial_s: float = 0.0) -> float:
    """Samples/s of a fit whose loader alone gives ``loader`` and whose step alone ``model``.

    Args:
        loader: the loader ceiling (samples/s, the loader alone).
        model: the model ceiling (samples/s, the step on a batch in memory).
        overlapped: whether loading runs beside the step (workers, or an accelerator's step).
        serial_s: seconds per sample no overlap hides (an epoch's worker start-up, spread over
            its samples).

    Example:
        >>> fit_rate(100.0, 400.0, overlapped=False)  # 10 ms + 2.5 ms per sample
        80.0
        >>> fit_rate(200.0, 400.0, overlapped=True), fit_rate(1000.0, 100.0, overlapped=True)
        (200.0, 100.0)
    """
    if loader <= 0 or model <= 0:
        raise ValueError(f"rates must be positive, got loader={loader!r}, model={model!r}")
    per_sample = max(1 / loader, 1 / model) if overlapped else 1 / loader + 1 / model
    return 1 / (per_sample + serial_s)


def overlaps(workers: int, accelerator: bool) -> bool:
    """Whether the fit's loading runs beside its step: workers, or a step on an accelerator."""
    return workers > 0 or accelerator


def side_rates(
    found: Sequence[Measurement], paces: tuple[float | None, float | None]
) -> tuple[float | None, float | None]:
    """Today's loader and model samples/s: the median of the knobs' own baselines, else the pace.

    A knob measured on top of another loader winner (``extra["on_top"]``) and ``batch_size``
    (another batch) do not measure today's side.
    """
    loader = [
        m.ceiling_before
        for m in found
        if m.side == "loader" and m.ceiling_before and not m.extra.get("on_top")
    ]
    model = [
        m.ceiling_before
        for m in found
        if m.side == "model" and m.ceiling_before and m.knob != "batch_size"
    ]
    return (
        statistics.median(loader) if loader else paces[0],
        statistics.median(model) if model else paces[1],
    )


def project_fit(
    found: Sequence[Measurement],
    loader: float | None,
    model: float | None,
    workers: int,
    accelerator: bool,
) -> None:
    """Give each measured knob the fit's samples/s, round by round, with today's other side.

    Args:
        found: the measurements (changed in place: ``fit_before``, ``fit_after``, and
            ``extra["other_side"]``, the rate they were projected with).
        loader: today's loader ceiling (samples/s; None: not measured, no model knob projected).
        model: today's model ceiling (None: not measured, no loader knob projected).
        workers: today's loader workers.
        accelerator: whether the step runs on an accelerator.

    A loader knob keeps the model's pace and changes the loader's; ``num_workers`` also
    changes the overlap; ``persistent_workers``' rates carry the epoch's start-up
    (``extra["ceiling"]``: the steady loader ceiling), which nothing overlaps. A model knob
    keeps today's loader.

    Example:
        >>> m = Measurement("num_workers", "loader", "0", "2", 2, [100.0], [300.0])
        >>> project_fit([m], loader=100.0, model=400.0, workers=0, accelerator=False)
        >>> m.fit_before, m.fit_after, round(m.ceiling_gain, 2), round(m.gain, 2)
        ([80.0], [300.0], 3.0, 3.75)
    """
    for m in found:
        if m.status is not None or not m.before or not m.after:
            continue
        other = model if m.side == "loader" else loader
        if not other:
            continue
        before, after = _overlap(m, workers, accelerator)
        serial = _serial(m)
        if m.side == "loader":
            ceilings = m.extra.get("ceiling")
            m.fit_before = [_loader_fit(b, other, before, serial, ceilings) for b in m.before]
            m.fit_after = [_loader_fit(a, other, after, serial, ceilings) for a in m.after]
        else:
            m.fit_before = [fit_rate(other, b, before) for b in m.before]
            m.fit_after = [fit_rate(other, a, after) for a in m.after]
        m.extra["other_side"] = other


def _overlap(m: Measurement, workers: int, accelerator: bool) -> tuple[bool, bool]:
    """Whether loading overlaps the step with today's setting, and with the candidate."""
    if m.knob == "num_workers":
        candidate = m.value if isinstance(m.value, int) else workers
        return overlaps(workers, accelerator), overlaps(candidate, accelerator)
    # Measured with the worker count found so far (prefetch, persistent workers) or today's.
    with_workers = int(m.extra.get("workers", workers) or 0)
    both = overlaps(with_workers, accelerator)
    return both, both


def _serial(m: Measurement) -> bool:
    return m.knob == "persistent_workers" and m.extra.get("ceiling") is not None


def _loader_fit(rate: float, model: float, overlapped: bool, serial: bool, ceiling: Any) -> float:
    """The fit's rate for one round's loader rate (with its start-up, when ``serial``)."""
    if not serial:
        return fit_rate(rate, model, overlapped)
    # The rate is samples / (epoch + start): the start-up, per sample, is 1/rate - 1/ceiling.
    start = max(0.0, 1 / rate - 1 / float(ceiling))
    return fit_rate(float(ceiling), model, overlapped, serial_s=start)
