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
then come.

Workers hide only what does not take the step's cores. On a CPU run with fewer cores than
workers, the step's threads and the fit's own process, the workers' CPU time per sample (the
CPU share of a pass without workers, times each worker's busy time per sample) is charged to
the step: a loader that sleeps or waits on I/O still hides behind it, one that computes does
not (an in-memory ``TensorDataset`` read 0.27x-0.33x as fast by 1 or 2 workers on 2 cores made
fits 0.6x-0.73x as fast, not the 1.1x an overlap promised). On an accelerator, the sum would
be the step's CPU part only, which is not measured apart: the overlap is assumed, the lower of
the two projections of a loader knob's gain.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lightning_speedpack.what_if.measure import Measurement

__all__ = ["Machine", "contended_s", "fit_rate", "overlaps", "project_fit", "side_rates"]


def fit_rate(
    loader: float,
    model: float,
    overlapped: bool,
    serial_s: float = 0.0,
    contended_s: float = 0.0,
) -> float:
    """Samples/s of a fit whose loader alone gives ``loader`` and whose step alone ``model``.

    Args:
        loader: the loader ceiling (samples/s, the loader alone).
        model: the model ceiling (samples/s, the step on a batch in memory).
        overlapped: whether loading runs beside the step (workers, or an accelerator's step).
        serial_s: seconds per sample no overlap hides (an epoch's worker start-up, spread over
            its samples).
        contended_s: seconds per sample the workers take from the step's cores (overlapped
            only): they add to the step.

    Example:
        >>> fit_rate(100.0, 400.0, overlapped=False)  # 10 ms + 2.5 ms per sample
        80.0
        >>> fit_rate(200.0, 400.0, overlapped=True), fit_rate(1000.0, 100.0, overlapped=True)
        (200.0, 100.0)
        >>> round(fit_rate(1000.0, 100.0, overlapped=True, contended_s=0.002), 1)
        83.3
    """
    if loader <= 0 or model <= 0:
        raise ValueError(f"rates must be positive, got loader={loader!r}, model={model!r}")
    serial = 1 / loader + 1 / model
    per_sample = max(1 / loader, 1 / model + contended_s) if overlapped else serial
    return 1 / (per_sample + serial_s)


def contended_s(
    loader: float, workers: int, cpu_share: float | None, cores: int, step_threads: int
) -> float:
    """Seconds per sample ``workers`` workers take from the step's cores (0: cores to spare).

    Each worker is busy ``workers / loader`` seconds per sample, ``cpu_share`` of it on a
    core; that time is the step's when the workers, the step's threads and the fit's own
    process (which also takes the workers' batches over) outnumber the cores. Unknown
    ``cpu_share``: nothing charged.

    Example:
        >>> contended_s(1000.0, 2, 1.0, cores=2, step_threads=1)  # 2 workers busy 2 ms each
        0.002
        >>> contended_s(1000.0, 2, 1.0, cores=8, step_threads=1)
        0.0
    """
    if not workers or not cpu_share or workers + step_threads + 1 <= cores:
        return 0.0
    return cpu_share * workers / loader


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


@dataclass(frozen=True)
class Machine:
    """What decides whether workers take the step's cores (see :func:`contended_s`).

    Attributes:
        accelerator: the step runs on an accelerator (loading overlaps it, no cores shared).
        cpu_share: CPU seconds over wall seconds of the loading without workers (None: not
            measured).
        cores: this rank's cores.
        step_threads: the threads the step computes with on a CPU (torch's intra-op threads).
    """

    accelerator: bool = False
    cpu_share: float | None = None
    cores: int = 1
    step_threads: int = 1

    def fit(self, loader: float, model: float, workers: int, serial_s: float = 0.0) -> float:
        """:func:`fit_rate` with ``workers`` workers on this machine."""
        contended = (
            0.0
            if self.accelerator
            else contended_s(loader, workers, self.cpu_share, self.cores, self.step_threads)
        )
        overlapped = overlaps(workers, self.accelerator)
        return fit_rate(loader, model, overlapped, serial_s=serial_s, contended_s=contended)


def project_fit(
    found: Sequence[Measurement],
    loader: float | None,
    model: float | None,
    workers: int,
    machine: Machine,
) -> None:
    """Give each measured knob the fit's samples/s, round by round, with today's other side.

    Args:
        found: the measurements (changed in place: ``fit_before``, ``fit_after``, and
            ``extra["other_side"]``, the rate they were projected with).
        loader: today's loader ceiling (samples/s; None: not measured, no model knob projected).
        model: today's model ceiling (None: not measured, no loader knob projected).
        workers: today's loader workers.
        machine: the accelerator, the loading's CPU share, the cores, the step's threads.

    A loader knob keeps the model's pace and changes the loader's; ``num_workers`` also
    changes the overlap; ``persistent_workers``' rates carry the epoch's start-up
    (``extra["ceiling"]``: the steady loader ceiling), which nothing overlaps. A model knob
    keeps today's loader.

    Example:
        >>> m = Measurement("num_workers", "loader", "0", "2", 2, [100.0], [300.0])
        >>> project_fit([m], loader=100.0, model=400.0, workers=0, machine=Machine(cores=4))
        >>> m.fit_before, m.fit_after, round(m.ceiling_gain, 2), round(m.gain, 2)
        ([80.0], [300.0], 3.0, 3.75)
    """
    for m in found:
        if m.status is not None or not m.before or not m.after:
            continue
        other = model if m.side == "loader" else loader
        if not other:
            continue
        before, after = _workers(m, workers)
        if m.side == "loader":
            ceiling = m.extra.get("ceiling")
            m.fit_before = [_loader_fit(machine, b, other, before, ceiling) for b in m.before]
            m.fit_after = [_loader_fit(machine, a, other, after, ceiling) for a in m.after]
        else:
            m.fit_before = [machine.fit(other, b, before) for b in m.before]
            m.fit_after = [machine.fit(other, a, after) for a in m.after]
        m.extra["other_side"] = other


def _workers(m: Measurement, workers: int) -> tuple[int, int]:
    """The loader's workers with today's setting, and with the candidate."""
    if m.knob == "num_workers":
        candidate = m.value if isinstance(m.value, int) else workers
        return workers, candidate
    # Measured with the worker count found so far (prefetch, persistent workers) or today's.
    with_workers = int(m.extra.get("workers", workers) or 0)
    return with_workers, with_workers


def _loader_fit(machine: Machine, rate: float, model: float, workers: int, ceiling: Any) -> float:
    """The fit's rate for one round's loader rate (with the epoch's start-up, when it has one)."""
    if ceiling is None or workers == 0:
        return machine.fit(rate, model, workers)
    # persistent_workers: the rate is samples / (epoch + start); per sample, the start-up is
    # 1/rate - 1/ceiling, and the steady loader is the ceiling.
    start = max(0.0, 1 / rate - 1 / float(ceiling))
    return machine.fit(float(ceiling), model, workers, serial_s=start)
