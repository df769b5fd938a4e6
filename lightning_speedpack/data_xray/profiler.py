"""DataPipelineProfiler: time every stage of data loading inside the workers; two ceilings."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Literal

import torch
from typing_extensions import override

from lightning_speedpack.core import events
from lightning_speedpack.core import stages as _stages
from lightning_speedpack.core.findings import Finding
from lightning_speedpack.core.lightning import (
    Callback,
    classes,
    namespace_of,
    rank_zero_info,
    rank_zero_warn,
)
from lightning_speedpack.core.loader_hook import LoaderHook, hook_dataloaders
from lightning_speedpack.core.locations import user_code_location
from lightning_speedpack.core.nested import leaves
from lightning_speedpack.core.registry import DoctorContext, register_diagnostic
from lightning_speedpack.core.stages import CACHE_MISS_STAGE, RowSnapshot
from lightning_speedpack.data_xray.ceilings import (
    Verdict,
    cpu_count,
    loader_ceiling,
    samples_in_batch,
    verdict,
)
from lightning_speedpack.data_xray.instrument import LoaderProbe
from lightning_speedpack.data_xray.pipeline import PipelineTotals, delta, format_stage_table
from lightning_speedpack.data_xray.run_check import (
    COLLATE,
    EpochClock,
    EpochFigures,
    RunVerdict,
    check_verdict,
    loader_cores,
)

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = ["DataPipelineProfiler"]

_PROBES = ("start", "off")


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
                                              I/O or a sleep
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
        self._waited_closed = 0.0  # data wait of loaders no longer in the fit
        self._ours_cached = False  # the training data is a CachedDataset (fill() can help)
        self._unmeasured: list[str] = []  # why a ceiling could not be measured
        # runtime only (never pickled)
        self._probes: list[LoaderProbe] = []
        self._reads: dict[int, tuple[list[RowSnapshot], float]] = {}
        self._waits: dict[int, tuple[float, int]] = {}
        self._shadowed: LoaderHook | None = None
        self._main_probe: LoaderProbe | None = None
        self._main_recorder: Any = None

    @property
    @override
    def state_key(self) -> str:
        return self._state_key

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(
            _probes=[], _reads={}, _waits={}, _shadowed=None, _main_probe=None, _main_recorder=None
        )
        return state

    # ---- Lightning hooks -------------------------------------------------------------------

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self.totals, self.verdict, self.last_metrics = PipelineTotals(), None, {}
        self.loader_ceiling = self.model_ceiling = None
        self.not_measured, self._from_fit, self.trial_steps = None, False, 0
        self._batches, self._last_logged_step, self._pending = 0, -1, PipelineTotals()
        self.epochs, self.run_check, self._epoch = [], None, None
        self._epoch_totals, self._waited_closed = PipelineTotals(), 0.0
        self._ours_cached, self._unmeasured = False, []
        self._shadow(trainer)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._keep_train_probes(trainer)
        if self.probe == "start" and self._probes:
            self._run_probes(trainer, pl_module)
        self._mark_all()
        self._activate_main()

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._keep_train_probes(trainer)  # loaders reloaded for this epoch
        self._activate_main()
        self._epoch = EpochClock(trainer.current_epoch, self._waited())
        self._epoch_totals = PipelineTotals()

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._from_fit:  # once: the model ceiling on the fit's own first batch
            self._from_fit = False
            self._time_model(trainer, pl_module, batch)
        if self._epoch is not None and not self._epoch.first_batch_seen:
            self._epoch.first_batch(self._waited())

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
        if self._epoch is not None:
            self._epoch.samples += samples_in_batch(batch)
            self._epoch.batches += 1
        every = self.log_every_n_steps or int(getattr(trainer, "log_every_n_steps", 50))
        if trainer.global_step % every == 0 and trainer.global_step != self._last_logged_step:
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
            self._activate_main()

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._window()  # before a new worker pool reuses rows
        self._end_epoch()

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._window()
        self._end_epoch()  # a fit stopped by max_steps inside an epoch
        _stages.deactivate()
        workers = self._probes[0].workers if self._probes else 0
        if self.not_measured is not None and self._probes:  # a stream: ceilings from the fit
            per_process = self.totals.per_process_samples_per_sec()
            self.loader_ceiling = None if per_process is None else per_process * max(workers, 1)
            self.verdict = verdict(self.loader_ceiling, self.model_ceiling, per_process)
            self._log_ceilings(trainer)
        self._check_against_run(trainer, workers)
        if trainer.global_step != self._last_logged_step:  # the unlogged tail, once
            self._log(trainer)
        if trainer.is_global_zero:
            self._write_wandb_summary(trainer)

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
        figures: dict[str, Any] = {
            k.removeprefix(self.prefix).replace("/", "_"): v
            for k, v in self.totals.metrics(self.prefix).items()
        }
        figures["batches"] = self._batches
        figures["loader_ceiling_samples_per_sec"] = self.loader_ceiling
        figures["model_ceiling_samples_per_sec"] = self.model_ceiling
        figures["trial_steps"] = self.trial_steps
        if self.not_measured is not None:
            figures["not_measured"] = self.not_measured
        if self.run_check is not None:
            figures["verdict_revisions"] = list(self.run_check.revisions)
        figures["run_epochs"] = [_epoch_row(e) for e in self.epochs]
        if self.verdict is not None:
            figures["verdict"] = self.verdict_message()
            figures["bound"] = self.verdict.bound
            figures["workers_needed"] = self.verdict.workers_needed
            figures["per_worker_samples_per_sec"] = self.verdict.per_worker_samples_per_sec
        return figures

    def doctor_findings(self) -> list[Finding]:
        """The stage table (``data-pipeline``) and the verdict (``data-bound``/``model-bound``)."""
        found: list[Finding] = []
        if self.totals.samples > 0 or self.totals.batches > 0:
            found.append(
                Finding(
                    component="data",
                    id="data-pipeline",
                    message="where a training sample's loading time goes:\n"
                    + format_stage_table(self.totals),
                    location=self._location,
                    figures=self.totals.metrics(self.prefix),
                    severity="info",
                )
            )
        if self.not_measured is not None:
            found.append(
                Finding(
                    component="data",
                    id="loader-ceiling-from-the-fit",
                    message=f"not measured aside from the fit: {self.not_measured}",
                    severity="info",
                )
            )
        if self.trial_steps:
            found.append(
                Finding(
                    component="data",
                    id="trial-steps",
                    message=f"the model-ceiling probe ran {self.trial_steps} of your training "
                    "steps before the fit went on (parameters, optimizer, RNG and metric states "
                    "put back; self.log muted; anything else your training_step touches, it "
                    "touched)",
                    figures={"trial_steps": self.trial_steps},
                    severity="info",
                )
            )
        v = self.verdict
        if v is not None and v.bound == "unknown":
            found.append(
                Finding(component="data", id="bound-unknown", message=v.message, severity="info")
            )
        if v is not None and v.bound != "unknown":
            found.append(
                Finding(
                    component="data",
                    id=f"{v.bound}-bound",
                    message=self.verdict_message() or v.message,
                    location=self._location if v.bound == "data" else None,
                    figures={
                        "loader_ceiling_samples_per_sec": v.loader_samples_per_sec,
                        "model_ceiling_samples_per_sec": v.model_samples_per_sec,
                        "workers_needed": v.workers_needed,
                    },
                    severity=self._verdict_severity(v),
                    fix=self._verdict_fix(v),
                )
            )
        return found

    def verdict_message(self) -> str | None:
        """The verdict as the report states it: checked against the run when it could be."""
        if self.run_check is not None:
            return self.run_check.message
        return None if self.verdict is None else self.verdict.message

    def _verdict_severity(self, v: Verdict) -> Literal["info", "warning", "error"]:
        """Data-bound is a warning; an error when the run waited more than it computed."""
        if v.bound != "data":
            return "info"
        steady = self.run_check.steady if self.run_check is not None else None
        return "error" if steady is not None and steady.wait_fraction > 0.5 else "warning"

    def _verdict_fix(self, v: Verdict) -> str | None:
        if v.bound == "data":
            if v.transfer_note is not None:
                return (
                    "larger batches, or DataLoader(num_workers=0) when a sample is cheap to "
                    "read (a cache): fewer handovers from worker processes per sample"
                )
            if v.instead is not None:
                more = f"DataLoader(num_workers={v.workers_needed}); " if v.workers_needed else ""
                return more + v.instead
            if v.workers_needed:
                return (
                    f"raise DataLoader(num_workers=...) to about {v.workers_needed} "
                    "(persistent_workers=True) and/or cache the deterministic preprocessing "
                    "with lightning_speedpack.CachedDataset"
                )
            return "cache the deterministic preprocessing with CachedDataset"
        check = self.run_check
        if check is not None and check.filling_bound == "data" and self._ours_cached:
            return (
                "once per run the first epoch decodes while training; CachedDataset.fill() "
                "before fit decodes in processes of its own instead"
            )
        return None

    # ---- internals -------------------------------------------------------------------------

    def _shadow(self, trainer: pl.Trainer) -> None:
        """Instrument each training DataLoader as Lightning processes it (before any iterator)."""
        if self._shadowed is not None:
            return
        namespace = namespace_of(trainer).__name__
        seed_module = (
            "lightning.fabric.utilities.seed"
            if namespace.startswith("lightning.")
            else "lightning_fabric.utilities.seed"
        )

        def instrument(dataloader: object) -> object:
            if (
                trainer.training
                and not trainer.sanity_checking
                and isinstance(dataloader, torch.utils.data.DataLoader)
                and not any(p.loader is dataloader for p in self._probes)
            ):
                self._probes.append(LoaderProbe(dataloader, seed_module, trainer.global_rank))
                self._activate_main()  # the fit's first batches are fetched before train start
            return dataloader

        # After every other listener (WhatIf's rebuilt loader is the one the fit iterates).
        self._shadowed = hook_dataloaders(trainer.strategy, instrument, priority=90)

    def _unshadow(self) -> None:
        if self._shadowed is None:
            return
        hook, self._shadowed = self._shadowed, None
        hook.remove()

    def _keep_train_probes(self, trainer: pl.Trainer) -> None:
        """Undo the instrumentation of loaders that are not (or no longer) training loaders."""
        loaders = leaves(trainer.train_dataloader, torch.utils.data.DataLoader)
        keep = []
        for probe in self._probes:
            if any(probe.loader is dl for dl in loaders):
                keep.append(probe)
            else:
                self._close(probe)
        self._probes = keep
        if self._location is None and loaders:
            self._location = _fetch_location(loaders[0].dataset)

    def _activate_main(self) -> None:
        """Record the main process's fetches when a training loader has no workers."""
        main = next((p for p in self._probes if p.workers == 0), None)
        if main is None:
            self._main_probe = self._main_recorder = None
            _stages.deactivate()
            return
        if main is not self._main_probe or self._main_recorder is None:
            self._main_probe = main
            self._main_recorder = _stages.activate(main.table, 0)
        _stages._ACTIVE = self._main_recorder  # resumed: the row keeps counting

    def _run_probes(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        probe = self._probes[0]
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
        self.verdict = verdict(self.loader_ceiling, self.model_ceiling, per_worker)
        if self.verdict.bound == "unknown":
            if self.loader_ceiling is None and not self._unmeasured:
                self._unmeasured.append(
                    "the loader-ceiling probe timed no batch (the loader is shorter than its "
                    "warm-up)"
                )
            self.verdict.reason = "; ".join(self._unmeasured) or None
        rank_zero_info(f"DataPipelineProfiler: {self.verdict.message}")
        self._publish(self.verdict, workers)
        self._log_ceilings(trainer)

    def _log_ceilings(self, trainer: pl.Trainer) -> None:
        """Both ceilings through every logger, once (rank 0)."""
        if not trainer.is_global_zero:
            return
        metrics = {
            f"{self.prefix}loader_ceiling_samples_per_sec": self.loader_ceiling,
            f"{self.prefix}model_ceiling_samples_per_sec": self.model_ceiling,
        }
        values = {k: float(v) for k, v in metrics.items() if v is not None}
        if values:
            for logger in trainer.loggers:
                logger.log_metrics(values, step=trainer.global_step)

    @staticmethod
    def _publish(
        v: Verdict, workers: int, wait: float | None = None, wait_ms: float | None = None
    ) -> None:
        """Tell the advisor (its ``dataloader-workers`` finding follows the measured verdict)."""
        events.publish(
            events.DATA_VERDICT,
            events.DataVerdict(
                v.bound,
                v.loader_samples_per_sec,
                v.model_samples_per_sec,
                v.workers_needed,
                v.per_worker_samples_per_sec,
                workers,
                wait,
                wait_ms,
                v.cores is None and v.transfer_note is None,
            ),
        )

    def _waited(self) -> float:
        """Seconds the fit has spent inside its training loaders' ``next`` so far."""
        return self._waited_closed + sum(p.next_seconds for p in self._probes)

    def _end_epoch(self) -> None:
        clock, self._epoch = self._epoch, None
        if clock is None or clock.samples == 0:
            return
        processes = max(self._probes[0].workers, 1) if self._probes else 1
        self.epochs.append(clock.finish(self._waited(), self._epoch_totals, processes))
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
            slowest_stage=self._slowest_stage(),
        )
        if checked is None:
            if self.verdict is not None and self.verdict.bound == "unknown":
                self.verdict.reason = (
                    f"{self.verdict.reason or 'a ceiling could not be measured'}, and the fit "
                    "ran no training step to read it from"
                )
            return
        self.run_check, self.verdict = checked, checked.verdict
        self._ours_cached = any(_fillable(p.loader.dataset) for p in self._probes)
        steady = checked.steady
        waits = (steady.wait_fraction, steady.wait_ms_per_batch) if steady else (None, None)
        self._publish(checked.verdict, workers, *waits)
        rank_zero_info(f"DataPipelineProfiler, checked against the run: {checked.message}")

    def _slowest_stage(self) -> tuple[str, float] | None:
        """What to make cheaper: the collate function when it costs more than the fetches.

        Else the named stage that costs most per call, the cache's fill excepted (once).
        """
        t = self.totals
        if t.batches > 0 and t.collate_seconds > t.fetch_seconds:
            return COLLATE, 1000.0 * t.collate_seconds / t.batches
        costs = [
            (name, 1000.0 * seconds / count)
            for name, (seconds, count) in self.totals.stages.items()
            if count > 0 and name != CACHE_MISS_STAGE
        ]
        return max(costs, key=lambda c: c[1]) if costs else None

    def _mark_all(self) -> None:
        """Start the fit's window here: what ran before (the probes) is not counted."""
        now = time.perf_counter()
        for probe in self._probes:
            probe.count_from = now
            rows = probe.table.read()
            for r in probe.live_rows():  # the fit's own processes: counted from their start
                rows[r].pid = 0
            self._reads[id(probe)] = (rows, now)
            self._waits[id(probe)] = (probe.wait_seconds, probe.waits)

    def _window(self) -> PipelineTotals:
        """Read every table; add what happened since the last read to the run totals."""
        window = PipelineTotals()
        now = time.perf_counter()
        for probe in self._probes:
            rows = probe.table.read()
            before, t_before = self._reads.get(id(probe), (None, now))
            if before is None:
                t_before = min((r.start for r in rows if r.pid), default=now)
            waited, n_waited = self._waits.get(id(probe), (0.0, 0))
            window.add(
                delta(before, rows, t_before, now, probe.live_rows()),
                probe.wait_seconds - waited,
                probe.waits - n_waited,
            )
            self._reads[id(probe)] = (rows, now)
            self._waits[id(probe)] = (probe.wait_seconds, probe.waits)
        self.totals.merge(window)
        self._pending.merge(window)
        self._epoch_totals.merge(window)
        return window

    def _log(self, trainer: pl.Trainer) -> None:
        metrics = self._pending.metrics(self.prefix)
        self._pending = PipelineTotals()
        self._last_logged_step = trainer.global_step
        if not metrics or not trainer.is_global_zero:
            return
        self.last_metrics = metrics
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)

    def _write_wandb_summary(self, trainer: pl.Trainer) -> None:
        runs = [
            lg.experiment
            for lg in trainer.loggers
            if isinstance(lg, classes("loggers.WandbLogger"))
        ]
        if not runs:
            return
        p = self.prefix
        summary: dict[str, Any] = {f"{p}{k}": v for k, v in self.totals.metrics("").items()}
        if self.verdict is not None:
            summary[f"{p}verdict"] = self.verdict.message
            summary[f"{p}workers_needed"] = self.verdict.workers_needed
        summary[f"{p}loader_ceiling_samples_per_sec"] = self.loader_ceiling
        summary[f"{p}model_ceiling_samples_per_sec"] = self.model_ceiling
        summary = {k: v for k, v in summary.items() if v is not None}
        for run in runs:
            run.summary.update(summary)

    def _close(self, probe: LoaderProbe) -> None:
        self._waited_closed += probe.next_seconds
        probe.next_seconds = 0.0
        probe.restore()
        self._reads.pop(id(probe), None)
        self._waits.pop(id(probe), None)

    def _cleanup(self, trainer: pl.Trainer) -> None:
        _stages.deactivate()
        self._unshadow()
        for probe in self._probes:
            self._close(probe)
        self._probes = []
        self._main_probe = self._main_recorder = None


def _fetch_location(dataset: Any) -> str | None:
    cls = type(dataset)
    for name in ("__getitems__", "__getitem__", "__iter__"):
        location = user_code_location(getattr(cls, name, None))
        if location is not None:
            return location
    return None


def _fillable(dataset: Any) -> bool:
    """A CachedDataset (known by its methods: the X-ray does not import the cache's room)."""
    return callable(getattr(dataset, "fill", None)) and callable(
        getattr(dataset, "cache_info", None)
    )


def _epoch_row(e: EpochFigures) -> dict[str, Any]:
    """One epoch of the run's evidence, for the JSON report."""
    reads = e.hits + e.misses
    return {
        "epoch": e.epoch,
        "seconds": round(e.seconds, 4),
        "samples": e.samples,
        "samples_per_sec": round(e.rate, 2),
        "data_wait_fraction": round(e.wait_fraction, 4),
        "model_samples_per_sec": round(e.model_rate, 2),
        "loader_samples_per_sec": None if e.loader_rate is None else round(e.loader_rate, 2),
        "cache_hit_rate": None if reads == 0 else round(e.hits / reads, 4),
        "start_seconds": round(e.start_seconds, 4),
    }


def _doctor_factory(ctx: DoctorContext) -> DataPipelineProfiler:
    # The ceilings probe (a second worker pool, its warm-up, then model steps) costs a few
    # tenths of a second once per fit: most of the doctor's own cost on a short fit, so only
    # `--deep` runs it. The in-worker stage timings are always on. Under the doctor the probe is
    # shorter than the default: 8 timed batches after the warm-up and 3 steps give a verdict.
    probe: Literal["start", "off"] = "start" if ctx.deep else "off"
    return DataPipelineProfiler(probe=probe, probe_batches=8, model_steps=3, log_every_n_steps=10)


register_diagnostic(
    "data",
    DataPipelineProfiler,
    factory=_doctor_factory,
    order=15,
    deep_adds="the loader and model ceilings probed aside from the fit (without it, the verdict "
    "comes from the run's own epochs)",
)
