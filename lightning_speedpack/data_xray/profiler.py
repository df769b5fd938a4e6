"""DataPipelineProfiler: time every stage of data loading inside the workers; two ceilings."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import torch
from typing_extensions import override

from lightning_speedpack.core import sampling
from lightning_speedpack.core import stages as _stages
from lightning_speedpack.core.batch import BatchSizer
from lightning_speedpack.core.findings import Finding
from lightning_speedpack.core.hook_hub import hub_of
from lightning_speedpack.core.lightning import Callback, rank_zero_info, rank_zero_warn
from lightning_speedpack.core.registry import DoctorContext, register_diagnostic
from lightning_speedpack.core.steps import step_reader
from lightning_speedpack.data_xray.ceilings import (
    Verdict,
    batch_unit,
    cpu_count,
    loader_ceiling,
    verdict,
)
from lightning_speedpack.data_xray.fit_loaders import FitLoaders
from lightning_speedpack.data_xray.instrument import LoaderProbe
from lightning_speedpack.data_xray.loaders import (
    dataset_location,
    fillable,
    loader_fix,
    loader_location,
    not_timed_reason,
)
from lightning_speedpack.data_xray.outputs import (
    log_ceilings,
    log_metrics,
    publish_verdict,
    write_wandb_summary,
)
from lightning_speedpack.data_xray.pipeline import PipelineTotals, delta
from lightning_speedpack.data_xray.report import XrayReport
from lightning_speedpack.data_xray.run_check import (
    EpochClock,
    EpochFigures,
    RunVerdict,
    check_verdict,
    loader_cores,
    slowest_stage,
)

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = ["DataPipelineProfiler"]

_PROBES = ("start", "off")
#: What the profiler leaves uncalled under the doctor's hub once an epoch's first batch is in.
_BATCH_START = ("on_train_batch_start",)


class DataPipelineProfiler(Callback):
    r"""Time each stage of the training data pipeline inside the workers; find the bound.

    Use it when steps wait for data (``throughput/data_wait_fraction`` is high) to learn where
    a sample's time goes -- the dataset's fetch (``__getitem__``/``__getitems__``, or
    ``__next__`` of a stream), the ``collate_fn``, the worker-to-main queue, any named
    :func:`~lightning_speedpack.core.stages.stage` -- and whether more workers, a cache or a
    faster model is the fix. No edit to the dataset is needed: the training DataLoader is
    given thin timing proxies when Lightning sets it up (its collate function and
    ``worker_init_fn`` are wrapped; each worker times its own copy of the dataset) and gets its
    own back after the fit. Batches are unchanged. Each worker adds its timings to its own
    row of a small shared-memory table; nothing crosses processes per sample. Works with
    ``num_workers=0``, ``fork``, ``spawn`` and persistent workers.

    With ``probe="start"`` it measures two ceilings when training starts: the *loader
    ceiling* (the training loader alone, a fresh iterator on a copy of it, after warm-up) and
    the *model ceiling* (``model_steps`` real training steps on one batch already in memory,
    with parameters, optimizer, RNG and torchmetrics states put back bit-identically and
    ``self.log`` muted; these steps run your ``training_step``, so whatever else it touches --
    a global, a file, a logger called directly -- it touches, and the report says how many
    ran). A stream (``IterableDataset``: WebDataset, LitData, MosaicML, a ``CachedStream``) is
    never read by a second reader: its loader ceiling is read from the fit's own batches (busy
    time per loading process) and its model ceiling timed on the fit's first batch, with the
    verdict at the end of training. Either way it states the verdict, e.g. "data-bound: the
    loader delivers 310 samples/s, the model could consume 2,400", with the number of workers
    that would close the gap at the measured per-worker rate.

    The verdict is then checked against the run (``run_check``): each training epoch's own
    figures (samples/s over its steps, the time spent inside the loader's ``next``, what the
    loading processes did, the cache's hits) are kept in ``epochs``; at the end of training a
    probe figure the run refutes (a loader ceiling below the rate the run consumed, a model
    ceiling below the steps' own pace, "data-bound" with under 5% data wait) is replaced by
    the run's own and the report says so in one line. A cached run is judged on its epochs
    after the cache filled, the filling epochs stated apart ("epoch 1: data-bound while the
    cache fills (4.1 s, once); from epoch 2: model-bound ..."). The workers it asks for never
    exceed the cores this rank's loader can use (cores per local rank, less the training
    process) unless the fetch is measured to wait rather than compute; when workers cannot
    close the gap it says what can.

    A training loader that is not a torch DataLoader (a ``torchdata.nodes.Loader``, DALI, FFCV,
    a generator) cannot be seen into: its stages are not timed and no ceiling is read from it
    (the report says so once: "not timed: not a torch DataLoader: torchdata.nodes.Loader").
    The time each training step waits at the fetch is timed for any iterable (through
    ``trainer.profiler``) and decides: from 20% of the training time spent waiting the run is
    data-bound (as with a DataLoader whatever its ceilings), the fix phrased for that kind of
    loader; below, model-bound. With ``probe="start"`` the model ceiling is timed on the fit's
    first batch; the loader's is never made up from the run's own pace.

    Rank policy: measures on every rank (each its own loader); logs and reports rank 0's.

    ========================================  ==================================================
    Key                                       Meaning
    ========================================  ==================================================
    ``data/fetch_ms``                         mean time per sample in the dataset's fetch
    ``data/collate_ms``                       mean time per batch in ``collate_fn``
    ``data/queue_wait_ms``                    mean time a finished batch waits for the main
                                              process (workers only)
    ``data/stage/<name>_ms``                  mean time per call of a named stage
    ``data/worker_busy_fraction``             fetch + collate time / wall time, per process
    ``data/fetch_compute_fraction``           the part of that time spent computing (on a CPU,
                                              or ready and waiting for one), not waiting for
                                              I/O or a sleep (read on every fetch after one of
                                              1 ms or more, else on one in 8)
    ``data/cache_hit_rate``                   hits / reads of a ``CachedDataset`` (its stages)
    ``data/loader_ceiling_samples_per_sec``   the loader alone (logged once, at the probe)
    ``data/model_ceiling_samples_per_sec``    the model alone (logged once, at the probe)
    ========================================  ==================================================

    Keys go through every logger at ``trainer.global_step``; with a ``WandbLogger`` the run
    summary gets ``data/verdict``, both ceilings and ``data/workers_needed``.

    Args:
        probe: ``"start"`` to measure the ceilings when training starts, ``"off"`` for none.
        probe_batches: batches the loader ceiling times (after warm-up).
        model_steps: training steps the model ceiling times (after one warm-up step).
        log_every_n_steps: log every this many steps; ``None`` follows the Trainer's.
        prefix: prefix of the logged keys.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: ``probe`` is not ``"start"``/``"off"`` or a count is not positive.

    Example:
        >>> from pytorch_lightning import Trainer
        >>> from pytorch_lightning.demos.boring_classes import BoringModel
        >>> profiler = DataPipelineProfiler(probe="start", probe_batches=4, model_steps=2)
        >>> trainer = Trainer(max_steps=8, callbacks=[profiler], logger=False,
        ...                   enable_progress_bar=False, enable_model_summary=False,
        ...                   enable_checkpointing=False, accelerator="cpu")
        >>> trainer.fit(BoringModel())
        >>> figures = profiler.doctor_figures()
        >>> figures["batches"], figures["verdict"].split(":")[0] in ("data-bound", "model-bound")
        (8, True)
    """

    def __init__(
        self,
        probe: str = "start",
        probe_batches: int = 20,
        model_steps: int = 5,
        log_every_n_steps: int | None = None,
        prefix: str = "data/",
    ) -> None:
        if not isinstance(probe, str) or probe not in _PROBES:
            raise ValueError(f"`probe` must be one of {_PROBES}, got {probe!r}")
        for name, value in (("probe_batches", probe_batches), ("model_steps", model_steps)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be a positive int, got {value!r}")
        if log_every_n_steps is not None and (
            isinstance(log_every_n_steps, bool)
            or not isinstance(log_every_n_steps, int)
            or log_every_n_steps < 1
        ):
            raise ValueError(
                f"`log_every_n_steps` must be a positive int or None, got {log_every_n_steps!r}"
            )
        if not isinstance(prefix, str):
            raise TypeError(f"`prefix` must be a str, got {prefix!r}")
        self.probe, self.probe_batches, self.model_steps = probe, probe_batches, model_steps
        self.log_every_n_steps, self.prefix = log_every_n_steps, prefix
        self._state_key = self._generate_state_key(probe=probe, prefix=prefix)
        self.totals = PipelineTotals()
        self.verdict: Verdict | None = None
        self.loader_ceiling: float | None = None
        self.model_ceiling: float | None = None
        self.last_metrics: dict[str, float] = {}
        self._batches = 0
        self._unit = "samples"  # what the first training batch counts (core.batch)
        self._last_logged_step = -1
        self._pending = PipelineTotals()
        self._location: str | None = None
        self.trial_steps = 0  # the user's training steps the model ceiling ran before the fit
        self.not_measured: str | None = None  # why the loader was not read by a side probe
        self._from_fit = False  # a stream: both ceilings come from the fit's own batches
        self.epochs: list[EpochFigures] = []  # the run's own evidence, epoch by epoch
        self.run_check: RunVerdict | None = None  # the verdict checked against those epochs
        self._epoch: EpochClock | None = None
        self._epoch_totals = PipelineTotals()
        self._ours_cached = False  # the training data is a CachedDataset (fill() can help)
        self._unmeasured: list[str] = []  # why a ceiling could not be measured
        self.not_timed: str | None = None  # why the stages were not timed (not a DataLoader)
        self._loader_fix: str | None = None  # the data-bound fix for that kind of loader
        self._loaders = FitLoaders()  # runtime only (a fresh one when pickled)
        # Per batch: the fast path of core.batch (one C call for an (x, y) tuple), 1 when a
        # batch says no size, as samples_in_batch; the log interval is read once per fit.
        self._sizer = BatchSizer()
        self._every = log_every_n_steps or 50
        self._steps: Callable[[], int] | None = None  # this fit's global step, read cheaply

    @property
    @override
    def state_key(self) -> str:
        return self._state_key

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_loaders"] = FitLoaders()
        state["_steps"] = None  # a reader of the last fit's Trainer, maybe a closure
        return state

    # ---- Lightning hooks -------------------------------------------------------------------

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self.totals, self.verdict, self.last_metrics = PipelineTotals(), None, {}
        self._unit = "samples"
        self.loader_ceiling = self.model_ceiling = None
        self.not_measured, self._from_fit, self.trial_steps = None, False, 0
        self._batches, self._last_logged_step, self._pending = 0, -1, PipelineTotals()
        self.epochs, self.run_check, self._epoch = [], None, None
        self._epoch_totals, self._ours_cached, self._unmeasured = PipelineTotals(), False, []
        self.not_timed, self._loader_fix = None, None
        self._sizer = BatchSizer()
        self._every = sampling.log_interval(self.log_every_n_steps, trainer)
        self._steps = None
        self._loaders.new_fit()
        self._loaders.shadow(trainer)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._keep_train_loaders(trainer)
        if self.probe == "start" and self.not_timed is not None:
            self._from_fit = True  # no loader to probe aside: the model on the fit's first batch
        elif self.probe == "start" and self._loaders.probes:
            self._run_probes(trainer, pl_module)
        self._loaders.mark()
        self._loaders.activate_main()

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        hub = hub_of(self)
        if hub is not None:  # its first batch starts the epoch's steady window
            hub.quiet(self)
        self._keep_train_loaders(trainer)  # loaders reloaded for this epoch
        self._loaders.activate_main()
        self._epoch = EpochClock(trainer.current_epoch, self._loaders.waited())
        self._epoch_totals = PipelineTotals()

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._from_fit:  # once: the model ceiling on the fit's own first batch
            self._from_fit = False
            self._time_model(trainer, pl_module, batch)
        epoch = self._epoch
        if epoch is not None and not epoch.first_batch_seen:
            epoch.first_batch(self._loaders.waited())
            hub = hub_of(self)
            if hub is not None:  # the doctor's: nothing to do here until the next epoch
                hub.quiet(self, _BATCH_START)

    @override
    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self._batches += 1
        if self._batches == 1:
            self._unit = batch_unit(batch)  # graphs for PyG: the verdict says graphs/s
        epoch = self._epoch
        if epoch is not None:
            epoch.samples += self._sizer(batch)
            epoch.batches += 1
        # `log_every_n_steps=0` (and `barebones=True`): Lightning logs no step, nor does this
        if not self._every:
            return
        step = (self._steps or self._read_steps(trainer))()
        if step % self._every == 0 and step != self._last_logged_step:
            self._window()
            self._log(trainer)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        _stages.deactivate()  # validation fetches are not the training pipeline
        if self._epoch is not None:
            self._epoch.validation_started()

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._epoch is not None:
            self._epoch.validation_ended()
        if trainer.training:
            self._loaders.activate_main()

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._window()  # before a new worker pool reuses rows
        self._end_epoch()

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._window()
        self._end_epoch()  # a fit stopped by max_steps inside an epoch
        _stages.deactivate()
        workers = self._loaders.workers
        if (
            self.not_measured is not None and self._loaders.probes
        ):  # a stream: ceilings from the fit
            per_process = self.totals.per_process_samples_per_sec()
            self.loader_ceiling = None if per_process is None else per_process * max(workers, 1)
            self.verdict = verdict(self.loader_ceiling, self.model_ceiling, per_process)
            self._log_ceilings(trainer)
        elif self.not_timed is not None and self.model_ceiling is not None:
            self.verdict = verdict(None, self.model_ceiling)  # the run's wait will decide
            self._log_ceilings(trainer)
        self._check_against_run(trainer, workers)
        if trainer.global_step != self._last_logged_step:  # the unlogged tail, once
            self._log(trainer)
        if trainer.is_global_zero:
            write_wandb_summary(
                trainer,
                self.prefix,
                self.totals,
                self.verdict,
                self.loader_ceiling,
                self.model_ceiling,
            )

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._cleanup(trainer)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._cleanup(trainer)

    # ---- doctor ----------------------------------------------------------------------------

    def doctor_figures(self) -> dict[str, Any]:
        """Whole-run figures: per-stage ms, busy fraction, ceilings, verdict, workers needed."""
        return self._report().figures()

    def doctor_findings(self) -> list[Finding]:
        """The stage table (``data-pipeline``), what was not timed, and the verdict."""
        return self._report().findings()

    def verdict_message(self) -> str | None:
        """The verdict as the report states it: checked against the run when it could be."""
        return self._report().message()

    def _report(self) -> XrayReport:
        return XrayReport(
            self.totals,
            prefix=self.prefix,
            batches=self._batches,
            loader_ceiling=self.loader_ceiling,
            model_ceiling=self.model_ceiling,
            trial_steps=self.trial_steps,
            not_measured=self.not_measured,
            not_timed=self.not_timed,
            verdict=self.verdict,
            run_check=self.run_check,
            epochs=self.epochs,
            location=self._location,
            ours_cached=self._ours_cached,
            loader_fix=self._loader_fix,
        )

    # ---- internals -------------------------------------------------------------------------

    def _keep_train_loaders(self, trainer: pl.Trainer) -> None:
        """Give back the loaders no longer training; name those the X-ray cannot see into."""
        loaders, opaque = self._loaders.keep_train(trainer)
        if self._location is None and loaders:
            self._location = dataset_location(loaders[0].dataset)
        if opaque and self.not_timed is None:  # once a fit (one line in the report)
            self.not_timed = not_timed_reason(opaque)
            self._loader_fix = loader_fix(opaque[0])
            self._location = self._location or loader_location(opaque[0])
            rank_zero_info(f"DataPipelineProfiler: stages not timed: {self.not_timed}")

    def _run_probes(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        probe = self._loaders.probes[0]
        if isinstance(probe.loader.dataset, torch.utils.data.IterableDataset):
            # A stream may hold state a second reader would change or collide with (LitData's
            # resumable position, MosaicML's shared memory, a cache's pass counts): it is never
            # read aside from the fit. Both ceilings come from the fit's own batches.
            self.not_measured = (
                "the loader ceiling of a stream is read from the fit's own batches (busy time per "
                "loading process), never from a second reader of the stream"
            )
            self._from_fit = True
            return
        main = _stages._ACTIVE
        if probe.workers == 0:
            _stages.activate(probe.table, 1)  # the probe's own row; row 0 is the fit's
        before = probe.table.read()
        t0 = time.perf_counter()
        side = probe.side_copy()
        try:
            result = loader_ceiling(side, batches=self.probe_batches)
        finally:
            LoaderProbe.close_copy(side)
            _stages._ACTIVE = main
        rows = delta(before, probe.table.read(), t0, time.perf_counter(), live=[])
        during = PipelineTotals()
        during.add(rows)
        self.loader_ceiling = result.samples_per_sec
        if result.batch is not None:
            self._time_model(trainer, pl_module, result.batch)
        self._conclude(trainer, probe.workers, during.per_process_samples_per_sec())

    def _time_model(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> None:
        """The model ceiling: ``model_steps`` of the user's training steps, all state put back.

        These steps run the user's ``training_step`` (and whatever it touches besides the
        module, optimizer and RNG states that are put back); ``self.log`` is a no-op meanwhile.
        """
        from lightning_speedpack.core.trials import time_training_steps

        try:
            seconds, samples = time_training_steps(trainer, pl_module, batch, self.model_steps)
            self.model_ceiling = samples / seconds if seconds > 0 else None
            self.trial_steps = 1 + self.model_steps
        except Exception as err:  # a probe must never end the fit
            self._unmeasured.append(f"the model ceiling failed ({type(err).__name__}: {err})")
            rank_zero_warn(f"DataPipelineProfiler: the model ceiling was not measured: {err}")

    def _conclude(self, trainer: pl.Trainer, workers: int, per_worker: float | None) -> None:
        """State the verdict, publish it to the advisor, log both ceilings."""
        self.verdict = verdict(self.loader_ceiling, self.model_ceiling, per_worker, workers=workers)
        if self.verdict.bound == "unknown":
            if self.loader_ceiling is None and not self._unmeasured:
                self._unmeasured.append(
                    "the loader-ceiling probe timed no batch (the loader is shorter than its "
                    "warm-up)"
                )
            self.verdict.reason = "; ".join(self._unmeasured) or None
        rank_zero_info(f"DataPipelineProfiler: {self.verdict.message}")
        publish_verdict(self.verdict, workers)
        self._log_ceilings(trainer)

    def _log_ceilings(self, trainer: pl.Trainer) -> None:
        log_ceilings(trainer, self.prefix, self.loader_ceiling, self.model_ceiling)

    def _end_epoch(self) -> None:
        clock, self._epoch = self._epoch, None
        if clock is None or clock.samples == 0:
            return
        processes = max(self._loaders.workers, 1)
        self.epochs.append(clock.finish(self._loaders.waited(), self._epoch_totals, processes))
        self._epoch_totals = PipelineTotals()

    def _check_against_run(self, trainer: pl.Trainer, workers: int) -> None:
        """Check the probe's verdict against the run's epochs; publish what stands."""
        local_ranks = max(1, int(trainer.world_size) // max(1, int(trainer.num_nodes)))
        hits, misses = self.totals.cache_reads()
        checked = check_verdict(
            self.verdict,
            self.epochs,
            cores=loader_cores(cpu_count(), local_ranks),
            workers=workers,
            cached=hits + misses > 0,
            slowest_stage=slowest_stage(self.totals),
            loader_seen=self.not_timed is None,
        )
        if self.verdict is not None:
            self.verdict.unit = self._unit
        if checked is not None:
            checked.verdict.unit = self._unit
        if checked is None:
            if self.verdict is not None and self.verdict.bound == "unknown":
                self.verdict.reason = (
                    f"{self.verdict.reason or 'a ceiling could not be measured'}, and the fit "
                    "ran no training step to read it from"
                )
            return
        self.run_check, self.verdict = checked, checked.verdict
        self._ours_cached = any(fillable(p.loader.dataset) for p in self._loaders.probes)
        steady = checked.steady
        waits = (steady.wait_fraction, steady.wait_ms_per_batch) if steady else (None, None)
        publish_verdict(checked.verdict, workers, *waits)
        rank_zero_info(f"DataPipelineProfiler, checked against the run: {checked.message}")

    def _read_steps(self, trainer: pl.Trainer) -> Callable[[], int]:
        self._steps = step_reader(trainer)
        return self._steps

    def _window(self) -> None:
        """What the loading processes did since the last read, added to the run totals."""
        window = self._loaders.window()
        for totals in (self.totals, self._pending, self._epoch_totals):
            totals.merge(window)

    def _log(self, trainer: pl.Trainer) -> None:
        metrics = self._pending.metrics(self.prefix)
        self._pending = PipelineTotals()
        self._last_logged_step = trainer.global_step
        if metrics and trainer.is_global_zero:
            self.last_metrics = metrics
            log_metrics(trainer, metrics)

    def _cleanup(self, trainer: pl.Trainer) -> None:
        self._loaders.close()


def _doctor_factory(ctx: DoctorContext) -> DataPipelineProfiler:
    # The ceilings probe (a second worker pool, its warm-up, then model steps) costs a few
    # tenths of a second once per fit: most of the doctor's own cost on a short fit, so only
    # `--deep` runs it. The in-worker stage timings are always on. Under the doctor the probe is
    # shorter than the default: 8 timed batches after the warm-up and 3 steps give a verdict.
    # The findings read the run's totals, so the workers' table is read at the Trainer's logging
    # cadence and at each epoch's end (a read and its sums: 78 us, median on one rank of the DDP
    # zoo's clean job, of which the table's own 27 us; 0.17-0.26 ms before its memoryview read).
    probe: Literal["start", "off"] = "start" if ctx.deep else "off"
    return DataPipelineProfiler(probe=probe, probe_batches=8, model_steps=3)


register_diagnostic(
    "data",
    DataPipelineProfiler,
    factory=_doctor_factory,
    order=15,
    deep_adds="the loader and model ceilings probed aside from the fit (without it, the verdict "
    "comes from the run's own epochs)",
)
