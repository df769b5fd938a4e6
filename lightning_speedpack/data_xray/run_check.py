"""The run as evidence: each training epoch's own figures, and the verdict they bear out.

A ceiling measured at fit start is a prediction about the whole run; the run itself then
shows what the loader delivered and the model consumed. :class:`EpochFigures` holds one
epoch's evidence (its wall time without validation, the time the training process waited in
the loader's ``next``, what the loading processes did and how busy they were, the cache's hits
and misses); :func:`check_verdict` compares the probe's verdict with it, revises every claim
the run refutes, and splits a cached run into the epochs that filled the cache and those that
read from it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from lightning_speedpack.core.stages import CACHE_MISS_STAGE
from lightning_speedpack.data_xray.ceilings import BOUND_MARGIN, HANDOVER_REMEDY, Verdict
from lightning_speedpack.data_xray.pipeline import PipelineTotals

__all__ = [
    "COLLATE",
    "DATA_WAIT_MIN",
    "EpochClock",
    "EpochFigures",
    "Phase",
    "RunVerdict",
    "check_verdict",
    "loader_cores",
    "slowest_stage",
]

#: A run that waits for data less than this share of its training time is not data-bound.
DATA_WAIT_MIN = 0.05
#: A ceiling this far below what the run achieved was wrong for this run (noise allowance).
REFUTED_BELOW = 0.95
#: A run that waits for data more than this share of its training time is data-bound,
#: whatever the ceilings say (the loader's own pace misses the handover to the step).
DATA_WAIT_MANY = 0.2
#: The name :func:`check_verdict` is given for the collate function when it costs the most.
COLLATE = "collate_fn"
#: Loading processes able to deliver this many times what reached the step were mostly idle.
IDLE_LOADER = 1.5
#: An epoch whose cache reads missed more than this share was still filling the cache.
FILLING_MISSES = 0.05
#: A loading process whose fetch uses less CPU than this share of its wall time waits (sleep,
#: I/O) rather than computes: more such workers than cores can still help.
WAITING_CPU_SHARE = 0.5


@dataclass
class EpochFigures:
    """One training epoch as the run measured it.

    Example:
        >>> e = EpochFigures(epoch=0, seconds=2.0, samples=1000, data_wait_seconds=0.5,
        ...                  busy_seconds=3.0, loaded_samples=1000, processes=2)
        >>> round(e.rate), round(e.model_rate), round(e.loader_rate), e.wait_fraction
        (500, 667, 667, 0.25)
    """

    epoch: int
    seconds: float  # training wall time of the epoch, validation excluded
    samples: int  # samples the training steps consumed
    data_wait_seconds: float  # the training process inside the loader's `next`
    busy_seconds: float = 0.0  # fetch + collate, summed over the loading processes
    loaded_samples: float = 0.0  # samples those processes loaded
    processes: int = 1  # loading processes: the workers, or the training process itself
    cpu_seconds: float = 0.0  # compute time of those fetches and collates (0: not measured)
    hits: float = 0.0  # cache reads served from the cache
    misses: float = 0.0  # cache reads that decoded
    batches: int = 0  # training batches (steps) of the epoch
    start_seconds: float = 0.0  # the epoch's start to its first batch (worker spin-up): apart

    @property
    def rate(self) -> float:
        """Samples per second the run consumed over this epoch's training time."""
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def wait_fraction(self) -> float:
        """Share of the training time spent waiting for the next batch."""
        return self.data_wait_seconds / self.seconds if self.seconds > 0 else 0.0

    @property
    def model_rate(self) -> float:
        """Samples per second of the time not spent waiting for data: the model's own pace."""
        busy = self.seconds - self.data_wait_seconds
        return self.samples / busy if busy > 0 else 0.0

    @property
    def loader_rate(self) -> float | None:
        """Samples per second the loading processes could deliver working all the time."""
        if self.busy_seconds <= 0 or self.loaded_samples <= 0:
            return None
        return self.loaded_samples / self.busy_seconds * self.processes

    @property
    def filling(self) -> bool:
        """The cache was still filling: more than 5% of this epoch's cache reads decoded."""
        return self.misses > FILLING_MISSES * (self.hits + self.misses)


@dataclass
class Phase:
    """Epochs alike (filling the cache, or reading from it), summed.

    Example:
        >>> a = EpochFigures(1, 1.0, 900, 0.1, busy_seconds=0.3, loaded_samples=900, processes=2)
        >>> b = EpochFigures(2, 1.0, 1100, 0.1, busy_seconds=0.3, loaded_samples=1100, processes=2)
        >>> p = Phase("warm", [a, b])
        >>> p.label, p.rate, round(p.loader_rate), p.spread("rate")
        ('epochs 2-3', 1000.0, 6667, (900.0, 1100.0))
    """

    name: str  # "filling", "warm" or "run"
    epochs: list[EpochFigures]

    def _sum(self, name: str) -> float:
        return float(sum(getattr(e, name) for e in self.epochs))

    @property
    def seconds(self) -> float:
        """Training seconds of these epochs."""
        return self._sum("seconds")

    @property
    def rate(self) -> float:
        """Samples per second the run consumed over these epochs."""
        s = self.seconds
        return self._sum("samples") / s if s > 0 else 0.0

    @property
    def wait_fraction(self) -> float:
        """Share of these epochs' training time spent waiting for data."""
        s = self.seconds
        return self._sum("data_wait_seconds") / s if s > 0 else 0.0

    @property
    def model_rate(self) -> float:
        """Samples per second of the time not spent waiting: the model's own pace."""
        busy = self.seconds - self._sum("data_wait_seconds")
        return self._sum("samples") / busy if busy > 0 else 0.0

    @property
    def wait_ms_per_batch(self) -> float | None:
        """Mean milliseconds the training process waited for each batch."""
        batches = self._sum("batches")
        return 1000.0 * self._sum("data_wait_seconds") / batches if batches else None

    @property
    def per_process_rate(self) -> float | None:
        """Samples per second one loading process produced while busy."""
        busy = self._sum("busy_seconds")
        loaded = self._sum("loaded_samples")
        return loaded / busy if busy > 0 and loaded > 0 else None

    @property
    def loader_rate(self) -> float | None:
        """Samples per second the loading processes could deliver, all busy."""
        per = self.per_process_rate
        return None if per is None else per * max(e.processes for e in self.epochs)

    @property
    def cpu_share(self) -> float | None:
        """CPU time over wall time of the fetches (None: not measured)."""
        wall, cpu = self._sum("busy_seconds"), self._sum("cpu_seconds")
        return cpu / wall if wall > 0 and cpu > 0 else None

    def spread(self, name: str) -> tuple[float, float] | None:
        """Lowest and highest per-epoch value of a rate (None with one epoch)."""
        values = [getattr(e, name) for e in self.epochs if e.seconds > 0]
        values = [v for v in values if v]
        return (min(values), max(values)) if len(values) > 1 else None

    @property
    def label(self) -> str:
        """``epoch 1`` or ``epochs 2-8`` (counted from 1)."""
        first, last = self.epochs[0].epoch + 1, self.epochs[-1].epoch + 1
        return f"epoch {first}" if first == last else f"epochs {first}-{last}"


@dataclass
class RunVerdict:
    """The verdict after the run: what bounds it once the cache is warm, and what changed.

    Example:
        >>> cold = EpochFigures(0, 4.1, 2000, 3.0, busy_seconds=8.0, loaded_samples=2000,
        ...                     processes=2, misses=2000)
        >>> warm = EpochFigures(1, 1.6, 2000, 0.02, busy_seconds=0.6, loaded_samples=2000,
        ...                     processes=2, hits=2000)
        >>> print(check_verdict(None, [cold, warm], cores=1, workers=2, cached=True).message)
        epoch 1: data-bound while the cache fills (4.1 s, once); from epoch 2: model-bound: the
        model consumes 1,266 samples/s, the loader could deliver 6,667 warm
    """

    verdict: Verdict
    filling: Phase | None = None  # the epochs that filled a cache, when the run had such
    filling_bound: str | None = None  # "data"/"model" during those epochs
    revisions: list[str] = field(default_factory=list)  # one line per refuted probe figure
    steady: Phase | None = None
    probe_bound: str | None = None  # the probe's verdict before the run checked it

    @property
    def message(self) -> str:
        """The verdict with the cold epochs first when a cache filled, and the revisions."""
        text = self.verdict.message
        filling, steady = self.filling, self.steady
        if filling is not None and self.filling_bound is not None and steady is not None:
            if self.filling_bound != self.verdict.bound:
                head = (
                    f"{filling.label}: {self.filling_bound}-bound while the cache fills "
                    f"({filling.seconds:.1f} s, once)"
                )
                text = f"{head}; from epoch {steady.epochs[0].epoch + 1}: {text}"
            else:
                text += f" ({filling.label} filled the cache: {filling.seconds:.1f} s)"
        if (
            self.verdict.bound == "data"
            and steady is not None
            and self.verdict.wait_fraction is None
        ):
            text += f" (the run waited for data {steady.wait_fraction:.0%} of its training time)"
        if self.revisions:
            what = "verdict" if self.probe_bound != self.verdict.bound else "figures"
            text += " [" + "; ".join(self.revisions) + f": {what} revised]"
        return text


def loader_cores(cpus: int, local_ranks: int) -> int:
    """Cores one rank's loader can use: the node's cores per rank, less the training process.

    Example:
        >>> loader_cores(2, 1), loader_cores(16, 2), loader_cores(4, 8)
        (1, 7, 1)
    """
    return max(1, cpus // max(1, local_ranks) - 1)


def slowest_stage(totals: PipelineTotals) -> tuple[str, float] | None:
    """What to make cheaper: the collate function when it costs more than the fetches.

    Else the named stage that costs most per call, the cache's fill excepted (once).

    Example:
        >>> from lightning_speedpack.data_xray.pipeline import RowDelta
        >>> t = PipelineTotals()
        >>> t.add([RowDelta(1, 2.0, 0.5, 50, 0.1, 5, {"decode": (0.2, 50)})])
        >>> slowest_stage(t)
        ('decode', 4.0)
    """
    if totals.batches > 0 and totals.collate_seconds > totals.fetch_seconds:
        return COLLATE, 1000.0 * totals.collate_seconds / totals.batches
    costs = [
        (name, 1000.0 * seconds / count)
        for name, (seconds, count) in totals.stages.items()
        if count > 0 and name != CACHE_MISS_STAGE
    ]
    return max(costs, key=lambda c: c[1]) if costs else None


def phases(epochs: list[EpochFigures]) -> tuple[Phase | None, Phase]:
    """The epochs that filled a cache (if the run had both kinds) and the rest."""
    filling = [e for e in epochs if e.filling]
    rest = [e for e in epochs if not e.filling]
    if filling and rest:
        return Phase("filling", filling), Phase("warm", rest)
    return None, Phase("run", epochs)


def check_verdict(
    probe: Verdict | None,
    epochs: list[EpochFigures],
    *,
    cores: int,
    workers: int,
    cached: bool,
    slowest_stage: tuple[str, float] | None = None,
    loader_seen: bool = True,
) -> RunVerdict | None:
    """The probe's verdict checked against the run's epochs; rebuilt where they refute it.

    When no loader figure was measured -- the loader is not a torch DataLoader
    (``loader_seen=False``: its stages and ceiling cannot be timed), or neither the probe nor
    the loading processes gave one -- the wait at the fetch decides, at the share that makes a
    DataLoader run data-bound whatever its ceilings (:data:`DATA_WAIT_MANY`), and no loader
    figure is given (:func:`_wait_verdict`).

    Args:
        probe: the verdict from the ceilings probe (None when it did not run or failed).
        epochs: the run's training epochs (those with at least one step).
        cores: the cores this rank's loader can use (:func:`loader_cores`).
        workers: the loader's ``num_workers``.
        cached: whether the training data goes through a cache the X-ray sees.
        slowest_stage: the named stage that costs most per sample, and its ms.
        loader_seen: False when a training loader is not a torch DataLoader: a loader figure
            (from the probe or the loading processes) would not be the fit's loader.

    Returns None when the run has no epoch with a step (nothing to check against).

    Example:
        >>> warm = EpochFigures(1, 1.0, 1300, 0.02, busy_seconds=0.5, loaded_samples=1300,
        ...                     processes=2, hits=1300)
        >>> probe = Verdict("data", 300.0, 1200.0, 12, 100.0)
        >>> checked = check_verdict(probe, [warm], cores=1, workers=2, cached=True)
        >>> checked.verdict.bound, checked.revisions[0]
        ('model', 'probe at fit start: loader 300 samples/s; the run consumed 1,300')
    """
    epochs = [e for e in epochs if e.samples > 0 and e.seconds > 0]
    if not epochs:
        return None
    filling, steady = phases(epochs)
    loader, model, revisions = _unrefuted(probe, steady, filling, loader_seen)
    if loader is None:
        return _wait_verdict(probe, model, steady, filling, revisions)
    bound, transfer = _bound(loader, model, steady, workers)
    if probe is not None and bound != probe.bound and not revisions:
        revisions.append(f"the run waited for data {steady.wait_fraction:.0%} of its training time")
    if bound == "data" and (transfer or (loader or 0.0) >= model):
        loader = steady.rate  # the ceilings missed the wait: what reached the step
    if bound == "model":
        model = steady.model_rate  # bound by the model: its pace in the run is the ceiling
    verdict = _steady_verdict(
        bound,
        loader,
        model,
        steady,
        cores=cores,
        workers=workers,
        cached=cached,
        slowest_stage=slowest_stage,
        warm=filling is not None,
    )
    enough = (
        workers > 0 and verdict.workers_needed is not None and verdict.workers_needed <= workers
    )
    if transfer or (enough and verdict.cores is None):  # as many workers as it needs: the handover
        verdict.workers_needed, verdict.cores = None, None
        verdict.transfer_note = _transfer_note(steady, workers)
    filling_bound = None
    if filling is not None:
        cold_loader = filling.loader_rate or filling.rate
        data_cold = filling.wait_fraction >= DATA_WAIT_MIN and model > cold_loader * BOUND_MARGIN
        filling_bound = "data" if data_cold else "model"
    probe_bound = probe.bound if probe is not None else None
    return RunVerdict(verdict, filling, filling_bound, revisions, steady, probe_bound)


def _unrefuted(
    probe: Verdict | None, steady: Phase, filling: Phase | None, loader_seen: bool = True
) -> tuple[float | None, float, list[str]]:
    """The probe's loader and model figures where the run does not refute them, else the run's.

    After a cache filled, the loader figure is the warm epochs' own (the probe read it cold).
    The loader figure is None when nothing measured one (never the run's own pace alone).
    """
    revisions: list[str] = []
    achieved, run_model = steady.rate, steady.model_rate
    loader = probe.loader_samples_per_sec if probe and loader_seen else None
    model = probe.model_samples_per_sec if probe else None
    if loader is not None and loader < achieved * REFUTED_BELOW:
        where = "fit start" if filling is None else "fit start, cold cache"
        revisions.append(
            f"probe at {where}: loader {loader:,.0f} samples/s; the run consumed {achieved:,.0f}"
        )
        loader = None
    if model is not None and model < run_model * REFUTED_BELOW:
        revisions.append(
            f"probe: model {model:,.0f} samples/s; the run's steps went at {run_model:,.0f}"
        )
        model = None
    measured = steady.loader_rate if loader_seen else None
    if (loader is None or filling is not None) and measured is not None:
        loader = max(measured, achieved)
    elif filling is not None:
        loader = None
    return loader, run_model if model is None else model, revisions


def _wait_verdict(
    probe: Verdict | None,
    model: float,
    steady: Phase,
    filling: Phase | None,
    revisions: list[str],
) -> RunVerdict:
    """No loader figure: data-bound from :data:`DATA_WAIT_MANY` of the time waiting at the fetch.

    The model figure is the probe's (when the run does not refute it) or the run's own pace
    while not waiting; the loader figure stays None.
    """
    wait = steady.wait_fraction
    bound = "data" if wait >= DATA_WAIT_MANY else "model"
    if bound == "model":
        model = steady.model_rate
    verdict = Verdict(bound, None, model, warm=filling is not None)
    verdict.model_spread = steady.spread("model_rate")
    verdict.wait_fraction, verdict.delivered = wait, steady.rate
    filling_bound = None
    if filling is not None:
        filling_bound = "data" if filling.wait_fraction >= DATA_WAIT_MANY else "model"
    probe_bound = probe.bound if probe is not None else None
    if probe_bound in ("data", "model") and probe_bound != bound and not revisions:
        revisions.append(f"the run waited for data {wait:.0%} of its training time")
    return RunVerdict(verdict, filling, filling_bound, revisions, steady, probe_bound)


def _bound(loader: float | None, model: float, steady: Phase, workers: int) -> tuple[str, bool]:
    """``"data"``/``"model"``, and whether a data bound lies in the handover of batches.

    The ceilings decide between 5% and 20% data wait; under 5% the run is not data-bound,
    from 20% it is. When workers could deliver well over what reached the step, the time
    goes in handing batches over from the worker processes (more workers would not help).
    With ``num_workers=0`` loading and step alternate: a worker would overlap them.
    """
    wait = steady.wait_fraction
    bound = "data" if model > (loader or 0.0) * BOUND_MARGIN else "model"
    if wait < DATA_WAIT_MIN:
        return "model", False
    if wait < DATA_WAIT_MANY:
        return bound, False
    run_loader = steady.loader_rate
    idle = run_loader is not None and run_loader > IDLE_LOADER * steady.rate
    return "data", workers > 0 and (bound == "model" or idle)


def _steady_verdict(
    bound: str,
    loader: float | None,
    model: float,
    steady: Phase,
    *,
    cores: int,
    workers: int,
    cached: bool,
    slowest_stage: tuple[str, float] | None,
    warm: bool,
) -> Verdict:
    per = steady.per_process_rate
    verdict = Verdict(bound, loader, model, None, per, warm=warm)
    verdict.model_spread = steady.spread("model_rate")
    if bound != "data" or not per:
        return verdict
    needed = max(1, math.ceil(model / per))
    cpu = steady.cpu_share
    waiting = cpu is not None and cpu < WAITING_CPU_SHARE
    verdict.cpu_share = cpu
    if waiting or needed <= cores:
        verdict.workers_needed = needed
        verdict.more_than_cores = needed > cores
        return verdict
    verdict.cores = cores
    verdict.workers_needed = cores if cores > workers else None
    verdict.instead = _what_can(cached, slowest_stage)
    return verdict


def _transfer_note(steady: Phase, workers: int) -> str:
    could = steady.loader_rate or (steady.per_process_rate or 0.0) * max(workers, 1)
    return (
        f"the workers could load {could:,.0f} samples/s yet the step "
        "waited: the time goes in handing batches from the worker processes to the training "
        f"process; {HANDOVER_REMEDY}"
    )


def _what_can(cached: bool, slowest_stage: tuple[str, float] | None) -> str:
    if slowest_stage is not None and slowest_stage[0] == COLLATE:
        return (
            f"make the collate_fn cheaper ({slowest_stage[1]:.1f} ms a batch, more than the "
            "fetch of its samples)"
        )
    if not cached:
        return (
            "cache the deterministic preprocessing with lightning_speedpack.CachedDataset "
            "(decoded once, read from RAM after)"
        )
    if slowest_stage is not None:
        name, ms = slowest_stage
        return f"make the '{name}' stage cheaper ({ms:.2f} ms per sample, the costliest)"
    return "make the per-sample work after the cache (the transform) cheaper"


class EpochClock:
    """One training epoch's evidence as the profiler's hooks see it go by.

    Wall time from the epoch's first batch (the epoch's start before it -- worker spin-up, the
    first fetch -- is kept apart: paid once an epoch, it is not the loader's pace), less
    validation run inside it; the samples the steps consumed; the data wait read from the
    loader's ``next`` (a running total passed in).

    Example:
        >>> clock = EpochClock(epoch=0, waited=0.0)
        >>> clock.first_batch(waited=0.01)  # the wait for the first batch is the epoch's start
        >>> clock.samples, clock.batches = 64, 2
        >>> e = clock.finish(waited=0.01, totals=PipelineTotals(), processes=1)
        >>> (e.samples, e.batches, e.data_wait_seconds)
        (64, 2, 0.0)
    """

    def __init__(self, epoch: int, waited: float) -> None:
        self.epoch = epoch
        self.start = time.perf_counter()
        self.start_seconds = 0.0
        self.first_batch_seen = False
        self.validation = 0.0
        self.samples = 0
        self.batches = 0
        self._waited = waited
        self._validating: float | None = None

    def first_batch(self, waited: float) -> None:
        """The epoch's first batch starts: the steady window starts here."""
        now = time.perf_counter()
        self.start_seconds, self.start = now - self.start, now
        self._waited, self.first_batch_seen = waited, True

    def validation_started(self) -> None:
        """Validation inside the epoch starts: its time is not training time."""
        self._validating = time.perf_counter()

    def validation_ended(self) -> None:
        """Validation inside the epoch ended."""
        if self._validating is not None:
            self.validation += time.perf_counter() - self._validating
            self._validating = None

    def finish(self, waited: float, totals: PipelineTotals, processes: int) -> EpochFigures:
        """The epoch's figures; ``totals`` is what the loading processes did in it."""
        self.validation_ended()
        hits, misses = totals.cache_reads()
        return EpochFigures(
            epoch=self.epoch,
            seconds=max(time.perf_counter() - self.start - self.validation, 0.0),
            samples=self.samples,
            data_wait_seconds=max(waited - self._waited, 0.0),
            busy_seconds=totals.busy_seconds,
            loaded_samples=totals.samples,
            processes=processes,
            cpu_seconds=totals.fetch_cpu_seconds,
            hits=hits,
            misses=misses,
            batches=self.batches,
            start_seconds=self.start_seconds,
        )
