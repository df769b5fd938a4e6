"""The largest, the fastest, or the nearest batch size that fits, a multiple of 8, rank-agreed."""

from __future__ import annotations

from contextlib import suppress
from typing import TYPE_CHECKING, Any, Literal

from typing_extensions import override

from lightning_speedpack.batch_size.caveats import (
    BatchSizeWarning,
    Caveat,
    few_steps_caveat,
    unscaled_lr_caveat,
)
from lightning_speedpack.batch_size.checks import (
    BatchSizeTuningError,
    check_arguments,
    check_batch_size_holder,
    check_supported,
)
from lightning_speedpack.batch_size.console import print_trials_table
from lightning_speedpack.batch_size.findings import (
    caveat_findings,
    multiple_finding,
    trials_finding,
)
from lightning_speedpack.batch_size.lr_scaling import scale_learning_rates
from lightning_speedpack.batch_size.measure import run_sizes
from lightning_speedpack.batch_size.search import (
    SizeSearch,
    Trial,
    free_memory,
    nearest_candidates,
    next_throughput_size,
    pick_fastest,
    pick_nearest,
)
from lightning_speedpack.core.batch import BatchSizeError, infer_batch_size
from lightning_speedpack.core.collectives import validate_timeout
from lightning_speedpack.core.findings import Finding
from lightning_speedpack.core.hook_hub import hub_of
from lightning_speedpack.core.lightning import (
    Callback,
    lightning_getattr,
    lightning_setattr,
    rank_zero_info,
    rank_zero_warn,
)
from lightning_speedpack.core.registry import register_diagnostic
from lightning_speedpack.core.tables import (
    TABLES,
    Cell,
    log_fit_end,
    log_line_chart,
    log_summary,
    log_table,
)
from lightning_speedpack.core.trials import (
    StateSnapshot,
    TrialRunner,
    dataloader_source,
    dataset_length,
    logging_disabled,
)

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = ["BatchSizeTuner", "BatchSizeTuningError", "BatchSizeWarning"]

Mode = Literal["max", "throughput", "nearest"]
_MAX_REFINEMENTS = 8  # extra throughput measurements around the fastest size


class BatchSizeTuner(Callback):
    """Set the batch size to the largest, fastest or nearest one that fits, a multiple of 8.

    Tensor cores want batch sizes that are multiples of 8 and the guides say to fill device
    memory. At the start of ``fit``, before any training, the tuner runs real training steps
    (forward, backward, optimizer step) on real batches of the train dataloader, plus one
    validation step when there is a val dataloader, at growing sizes (``"max"`` and
    ``"throughput"``): doubled until a size does not fit, then a binary search between the last
    size that fit and the first that did not. Every size tried is a multiple of ``multiple_of``
    (``"nearest"`` also tries today's size). An out-of-memory error (``torch.OutOfMemoryError``
    or a known CUDA/cuDNN/cuBLAS/CPU-allocator message) means "does not fit"; memory is freed and
    the search goes on. Any other exception propagates unchanged.

    - ``mode="max"`` keeps the largest size that fit, minus ``margin``, rounded down to
      ``multiple_of``, verified by one more trial at that exact size.
    - ``mode="throughput"`` also measures samples/s (compute only: transfer and step; the
      median over the steps after a warm-up step) at every size that fits, measures a few more
      sizes around the fastest one (bisecting towards the peak on both sides), and keeps the
      fastest not above the ``"max"`` choice; sizes within 2% of the fastest count as tied and
      the larger wins. On several ranks the samples/s are the mean over ranks.
    - ``mode="nearest"`` follows the guides' literal advice, "use a batch size that is a
      multiple of 8", without moving far from the script's size: it measures samples/s (as
      ``"throughput"`` does) at today's size (the value of ``attr_name``) and at the multiples
      of ``multiple_of`` just below and above it (48, 50 and 56 for 50), multiples capped by
      ``max_val`` and the dataset's length per rank, and keeps the fastest that fits; sizes
      within 2% of the fastest count as tied and the one closest to today's size wins, so
      today's size stays when the multiple is not measurably faster (it need not be a
      multiple then). A size that already is a multiple is kept as it is, without trials
      (``trials`` stays empty; the info line says "already a multiple of 8"): measuring its
      neighbours is what ``"throughput"`` is for. ``init_val`` and ``margin`` play no part.

    Everything else is left as found: parameters and buffers (bit-identical), gradients, the
    optimizer and LR-scheduler state, train/eval modes, the trainer's step and epoch, the other
    callbacks (their hooks are not called by trials), loggers (``self.log`` is a no-op during
    trials) and the torch, numpy and Python RNG states. Only the batch size changes -- on the
    LightningModule, its ``hparams`` and/or the datamodule, wherever Lightning's
    ``lightning_setattr`` finds ``attr_name`` -- so Lightning builds the dataloaders with it.
    A dataset smaller than a candidate (per rank: its length over the world size) caps the search
    at that length rounded down to ``multiple_of``. ``scale_lr=True`` also multiplies every
    param group's learning rate (and the schedulers' base learning rates) by
    ``chosen / original``.

    Two warnings (:class:`~lightning_speedpack.batch_size.caveats.BatchSizeWarning`, on rank 0,
    and as findings of severity ``"warning"`` in :meth:`doctor_findings`; findings of severity
    ``"info"`` and no warning with ``dry_run``) follow a choice that changes the optimisation the
    script was written for, in any mode:

    - ``batch-size-few-steps``: the chosen size leaves fewer than 10 optimizer steps per epoch
      (the dataset's length per rank over the size, over ``accumulate_grad_batches``), and fewer
      than the script's size did: "batch size 2048 leaves 2 optimizer steps per epoch on 4,096
      samples (batch size 50 left 82), ...". Not checked for a dataset without a length.
    - ``batch-size-lr-unscaled``: the chosen size is more than 4x the script's, with
      ``scale_lr=False``: "batch size 2048 is 41x the batch size 50 the script set, with the
      learning rate unchanged: pass scale_lr=True or set the learning rate for the new size".

    After tuning, :attr:`batch_size` is the chosen size, :attr:`trials` the list of
    ``(batch_size, fits, samples_per_sec)`` (``mode="nearest"`` included), a table is printed on
    rank 0, and every logger gets
    these hyperparameters:

    ====================  =====================================================================
    key                   value
    ====================  =====================================================================
    ``batch_size``        the batch size the run trains with
    ``tuned_batch_size``  the size the tuner chose (differs from ``batch_size`` with ``dry_run``)
    ====================  =====================================================================

    At the end of fit (once, rank 0, through the Trainer's loggers; see
    :mod:`lightning_speedpack.core.tables` for what W&B, CSV and TensorBoard get):

    =====================================  ==================================================
    key                                    what
    =====================================  ==================================================
    ``speedpack/batch_size_trials``        table, one row per trial: ``batch_size``, ``fits``,
                                           ``samples_per_sec`` (empty when not measured),
                                           ``chosen`` (when trials ran)
    ``speedpack/batch_size_trials_chart``  line chart of samples/s against batch size (W&B;
                                           TensorBoard: a scalar with the batch size as its
                                           step), when samples/s were measured
    ``speedpack/tuned_batch_size``         summary: the size the tuner chose (when trials ran)
    ``speedpack/batch_size``               summary: the batch size the fit trained with
    =====================================  ==================================================

    When it is the last of the pack's callbacks on the Trainer it also logs
    ``speedpack/findings`` (every pack callback's findings) and their counts.

    Trials draw their batches in the main process: a DataLoader's ``num_workers`` is set to 0
    for the trial and put back afterwards. Each trial builds a loader for its own size, so with
    workers every trial would fork a fresh worker pool while other threads (W&B, the previous
    iterator's feeders, Lightning's observer) are alive, and a fork taken while another thread
    holds a lock can deadlock the child inside ``fork``, hanging the run. Loading is not part of
    the timed step, so trial results do not change; the fit's own loader starts its workers once,
    as without the tuner.

    Rank policy: runs on every rank; every rank tries the same sizes and the ranks agree through
    one small all-reduce per trial on "fits on all ranks" (and "failed on some rank"), so the
    chosen size is identical everywhere. Trials call the LightningModule's ``training_step``
    directly (not through the DDP wrapper), so a size that runs out of memory on one rank only
    cannot leave the ranks in different collectives. The agreement waits at most
    ``collective_timeout`` seconds: a rank that died or is stuck makes the others raise
    :class:`~lightning_speedpack.core.collectives.CollectiveTimeoutError` ("BatchSizeTuner: rank
    agreement for batch size 64 (trial 3) did not complete within 300 s: ...") instead of
    waiting for ever. Prints on rank 0 only.

    Resuming: the chosen size is saved in the checkpoint (``state_dict``, under a ``state_key``
    that includes ``mode``); fitting again from a checkpoint applies it without new trials
    unless ``retune_on_resume=True``.

    Supported: single-device and DDP strategies (``"ddp"``, ``"ddp_spawn"``) with automatic
    optimization. GPU paths (``torch.cuda.OutOfMemoryError``, ``empty_cache``, the device
    synchronisation around throughput timing) were exercised on the CPU only, through an injected
    ``torch.OutOfMemoryError``. Under ``"ddp_spawn"`` the tuned size lives in the worker processes;
    the main process's callback and model keep their old values.

    Args:
        mode: ``"max"`` (largest size that fits), ``"throughput"`` (fastest per sample) or
            ``"nearest"`` (today's size or a multiple next to it, the fastest).
        multiple_of: every size tried and chosen is a multiple of this (in ``"nearest"`` mode,
            today's size is tried, and kept, too).
        init_val: the first size tried (rounded up to a multiple); at most ``max_val``.
        max_val: no size above this is tried (in ``"nearest"`` mode: no multiple; today's size
            is measured whatever it is).
        steps_per_trial: training steps per trial (at least 2 in ``"throughput"`` and
            ``"nearest"`` modes: the first is a warm-up).
        margin: fraction in ``[0, 1)`` taken off the largest fitting size before rounding down.
        attr_name: the batch-size attribute, looked up on the model, ``model.hparams`` and the
            datamodule (Lightning's order).
        scale_lr: scale the learning rates linearly with the batch size.
        retune_on_resume: (keyword-only) tune again when resuming from a checkpoint that holds a
            tuned size.
        dry_run: (keyword-only) run the trials and report the choice, but keep the original
            batch size and learning rate.
        report_only: (keyword-only) run no trials; only record the batch size in use for the
            doctor's report. This is how ``speedpack doctor`` attaches the tuner.
        verbose: (keyword-only) print the trials table on rank 0.
        collective_timeout: (keyword-only) seconds each rank agreement may take under DDP;
            ``None``: ``LIGHTNING_SPEEDPACK_COLLECTIVE_TIMEOUT`` or 300 s. Never longer than the
            process group's own timeout.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: an argument is out of range, or ``init_val > max_val``.

    Example:
        >>> from pytorch_lightning import Trainer
        >>> from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset
        >>> from torch.utils.data import DataLoader
        >>> class Model(BoringModel):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.batch_size = 8
        ...     def train_dataloader(self):
        ...         return DataLoader(RandomDataset(32, 640), batch_size=self.batch_size)
        >>> tuner = BatchSizeTuner(max_val=32, margin=0.0, verbose=False)
        >>> trainer = Trainer(accelerator="cpu", max_steps=1, callbacks=[tuner], logger=False,
        ...                   enable_checkpointing=False, enable_progress_bar=False,
        ...                   enable_model_summary=False, limit_val_batches=0)
        >>> trainer.fit(Model())
        >>> tuner.batch_size, [t.batch_size for t in tuner.trials]
        (32, [8, 16, 32])
    """

    def __init__(
        self,
        mode: Mode = "max",
        multiple_of: int = 8,
        init_val: int = 8,
        max_val: int = 8192,
        steps_per_trial: int = 3,
        margin: float = 0.05,
        attr_name: str = "batch_size",
        scale_lr: bool = False,
        *,
        retune_on_resume: bool = False,
        dry_run: bool = False,
        report_only: bool = False,
        verbose: bool = True,
        collective_timeout: float | None = None,
    ) -> None:
        check_arguments(
            mode=mode,
            multiple_of=multiple_of,
            init_val=init_val,
            max_val=max_val,
            steps_per_trial=steps_per_trial,
            margin=margin,
            attr_name=attr_name,
            flags={
                "scale_lr": scale_lr,
                "retune_on_resume": retune_on_resume,
                "dry_run": dry_run,
                "report_only": report_only,
                "verbose": verbose,
            },
        )
        if collective_timeout is not None:
            validate_timeout("collective_timeout", collective_timeout)
        self.collective_timeout = collective_timeout
        self.mode: Mode = mode
        self.multiple_of = multiple_of
        self.init_val = init_val
        self.max_val = max_val
        self.steps_per_trial = steps_per_trial
        self.margin = float(margin)
        self.attr_name = attr_name
        self.scale_lr = scale_lr
        self.retune_on_resume = retune_on_resume
        self.dry_run = dry_run
        self.report_only = report_only
        self.verbose = verbose
        self.batch_size: int | None = None
        self.trials: list[Trial] = []
        self.tuned = False
        self._restored = False
        self._original: int | None = None
        self._in_use: int | None = None
        self._on_gpu = False
        self._kept: str | None = None  # mode="nearest" kept the size without trials: why
        self._caveats: list[Caveat] = []

    @property
    @override
    def state_key(self) -> str:
        # Lightning reads this on every hook call (the profiler's action names): build it once
        # per (mode, attr_name), not per call.
        args = (self.mode, self.attr_name)
        cached = self.__dict__.get("_state_key_cache")
        if cached is None or cached[0] != args:
            cached = self.__dict__["_state_key_cache"] = (
                args,
                self._generate_state_key(mode=self.mode, attr_name=self.attr_name),
            )
        return str(cached[1])

    # ------------------------------------------------------------------ hooks

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._in_use = None
        self._kept, self._caveats = None, []
        self._on_gpu = trainer.strategy.root_device.type == "cuda"
        resuming, self._restored = self._restored and trainer.ckpt_path is not None, False
        if self.report_only:
            return
        if getattr(trainer, "fast_dev_run", False):
            rank_zero_info("BatchSizeTuner: skipped because `fast_dev_run` is enabled.")
            return
        if resuming and self.tuned and not self.retune_on_resume:
            if self.batch_size is not None and not self.dry_run:
                check_batch_size_holder(pl_module, self.attr_name)
                lightning_setattr(pl_module, self.attr_name, self.batch_size)
                rank_zero_info(
                    f"BatchSizeTuner: resuming with the tuned batch size {self.batch_size} "
                    "(pass `retune_on_resume=True` to tune again)."
                )
            return
        self._tune(trainer, pl_module)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        size = getattr(trainer.train_dataloader, "batch_size", None)
        self._in_use = size if isinstance(size, int) else None

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if batch_idx != 0:
            return
        if self._in_use is None:  # a custom batch sampler: read the batch
            with suppress(BatchSizeError):
                self._in_use = infer_batch_size(batch)  # shape only, no device sync
        if self._in_use is not None and (hub := hub_of(self)) is not None:
            hub.quiet(self, ("on_train_batch_start",))  # known: nothing left to read this fit

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        log_fit_end(trainer, self)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "tuned": self.tuned,
            "original_batch_size": self._original,
            # plain lists: checkpoints load with `weights_only=True`
            "trials": [[t.batch_size, t.fits, t.samples_per_sec] for t in self.trials],
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.batch_size = state_dict.get("batch_size")
        self.tuned = bool(state_dict.get("tuned", False))
        self._original = state_dict.get("original_batch_size")
        self.trials = [Trial(int(b), bool(f), s) for b, f, s in state_dict.get("trials", [])]
        self._restored = True

    # ----------------------------------------------------------------- tables

    def log_tables(self, trainer: pl.Trainer) -> None:
        """Log the trials table, the samples/s chart and the batch sizes (rank 0, no sync)."""
        fields: dict[str, Cell] = {}
        if self._in_use is not None:
            fields["speedpack/batch_size"] = self._in_use
        if self.trials:
            chosen = self.batch_size
            rows: list[list[Cell]] = [
                [t.batch_size, t.fits, t.samples_per_sec, t.fits and t.batch_size == chosen]
                for t in self.trials
            ]
            log_table(
                trainer, "speedpack/batch_size_trials", TABLES["speedpack/batch_size_trials"], rows
            )
            speeds = {  # one point per size (the last measured), in size order
                t.batch_size: t.samples_per_sec
                for t in self.trials
                if t.fits and t.samples_per_sec is not None
            }
            if speeds:
                log_line_chart(
                    trainer,
                    "speedpack/batch_size_trials_chart",
                    sorted(speeds.items()),
                    "batch_size",
                    "samples_per_sec",
                    title="BatchSizeTuner: samples/s vs batch size",
                )
            fields["speedpack/tuned_batch_size"] = chosen
        log_summary(trainer, fields)

    # ----------------------------------------------------------------- doctor

    def doctor_findings(self) -> list[Finding]:
        """Findings: a batch size that is not a multiple of 8, the trials table, the caveats."""
        findings = [
            multiple_finding(self._in_use, self._on_gpu),
            trials_finding(
                self.mode, self.trials, self.batch_size, dry_run=self.dry_run, kept=self._kept
            ),
        ]
        return [f for f in findings if f is not None] + caveat_findings(
            self._caveats, applied=not self.dry_run
        )

    def doctor_figures(self) -> dict[str, Any]:
        """Whole-run figures: ``batch_size`` in use (and ``tuned_batch_size`` when trials ran)."""
        figures: dict[str, Any] = {"batch_size": self._in_use}
        if self.trials:
            figures["tuned_batch_size"] = self.batch_size
        return figures

    # ----------------------------------------------------------------- tuning

    def _tune(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        check_supported(trainer, pl_module, self.attr_name)
        original = int(lightning_getattr(pl_module, self.attr_name))  # type: ignore[arg-type]
        source = dataloader_source(trainer, pl_module, "BatchSizeTuner", BatchSizeTuningError)
        snapshot = StateSnapshot.take(
            trainer, pl_module
        )  # before any dataloader draws random numbers
        final = original
        try:
            loader = source.train_dataloader()
            samples = dataset_length(loader)
            if samples is not None:  # each rank trains on its shard of the dataset
                samples //= trainer.world_size
            with logging_disabled(pl_module):
                run = TrialRunner(
                    trainer,
                    pl_module,
                    source,
                    self.steps_per_trial,
                    owner="BatchSizeTuner",
                    error_type=BatchSizeTuningError,
                    collective_timeout=self.collective_timeout,
                )
                if self.mode == "nearest":
                    trials, chosen = self._nearest(run, snapshot, original, samples)
                else:
                    trials, chosen = self._search(run, snapshot, samples)
            self.trials, self.batch_size, self.tuned = trials, chosen, True
            self._original = original
            if not self.dry_run:
                final = chosen
        finally:
            snapshot.restore()
            lightning_setattr(pl_module, self.attr_name, final)
            free_memory()
        if self.scale_lr and final != original:
            scale_learning_rates(trainer, final / original)
        self._announce(trainer, original)
        self._warn(trainer, original, samples, drop_last=getattr(loader, "drop_last", 0) is True)

    def _search(
        self, run: TrialRunner, snapshot: StateSnapshot, cap: int | None
    ) -> tuple[list[Trial], int]:
        """``"max"``/``"throughput"``: grow, bisect, verify (and refine around the fastest)."""
        try:
            search = SizeSearch(self.init_val, self.max_val, self.multiple_of, self.margin, cap)
        except ValueError as err:
            raise BatchSizeTuningError(f"BatchSizeTuner: {err}") from None
        while (size := search.next_size()) is not None:
            lightning_setattr(run.module, self.attr_name, size)
            fits, speed = run(size)
            search.record(size, fits, speed)
            snapshot.restore_grads()
        if search.result is not None and self.mode == "throughput":
            self._refine(search, run)
        return self._choose(search)

    def _nearest(
        self, run: TrialRunner, snapshot: StateSnapshot, original: int, samples: int | None
    ) -> tuple[list[Trial], int]:
        """``"nearest"``: today's size and its nearest multiples; the fastest, ties to today's."""
        cap = self.max_val if samples is None else max(1, min(self.max_val, samples))
        candidates = nearest_candidates(original, self.multiple_of, cap)
        if candidates == [original]:
            self._kept = (
                f"batch size {original} is already a multiple of {self.multiple_of}"
                if original % self.multiple_of == 0
                else f"no multiple of {self.multiple_of} is <= {cap} (the smaller of max_val "
                "and the dataset's length per rank)"
            )
            return [], original
        trials = run_sizes(run, candidates, self.attr_name, snapshot)
        chosen = pick_nearest(trials, original)
        if chosen is None:
            raise BatchSizeTuningError(
                f"BatchSizeTuner: none of the batch sizes {candidates} fits in memory; lower the "
                "batch size, make the model smaller or use mixed precision"
            )
        return trials, chosen

    def _refine(self, search: SizeSearch, run: TrialRunner) -> None:
        """Measure more sizes around the fastest one (sizes are agreed, so ranks stay in step)."""
        assert search.result is not None
        for _ in range(_MAX_REFINEMENTS):
            size = next_throughput_size(search.trials, search.result, self.multiple_of)
            if size is None:
                return
            lightning_setattr(run.module, self.attr_name, size)
            fits, speed = run(size)
            search.trials.append(Trial(size, fits, speed if fits else None))

    def _choose(self, search: SizeSearch) -> tuple[list[Trial], int]:
        if search.result is None:
            raise BatchSizeTuningError(
                f"BatchSizeTuner: not even a batch of `multiple_of`={self.multiple_of} samples "
                f"fits in memory (tried {[t.batch_size for t in search.trials]}); lower "
                "`multiple_of`, make the model smaller or use mixed precision"
            )
        trials = search.trials
        if self.mode == "max":
            return trials, search.result
        fastest = pick_fastest(trials, limit=search.result)
        return trials, search.result if fastest is None else fastest

    def _announce(self, trainer: pl.Trainer, original: int) -> None:
        chosen = self.batch_size
        in_use = original if self.dry_run else chosen
        for logger in trainer.loggers:
            logger.log_hyperparams({"batch_size": in_use, "tuned_batch_size": chosen})
        if self._kept is not None:
            rank_zero_info(f"BatchSizeTuner: {self._kept}; kept it, no trials (mode='nearest').")
            return
        verb = "would use" if self.dry_run else "uses"
        rank_zero_info(
            f"BatchSizeTuner: {verb} batch size {chosen} (was {original}; mode={self.mode!r}, "
            f"{len(self.trials)} trials)."
        )
        if self.verbose and trainer.is_global_zero:
            print_trials_table(self.trials, chosen, self.mode)

    def _warn(
        self, trainer: pl.Trainer, original: int, samples: int | None, drop_last: bool
    ) -> None:
        """Warn (rank 0) when the chosen size changes the optimisation the script set up."""
        chosen, applied = self.batch_size, not self.dry_run
        if chosen is None:  # pragma: no cover - set by _tune
            return
        accumulate = getattr(trainer, "accumulate_grad_batches", 1)
        caveats = [
            few_steps_caveat(
                chosen=chosen,
                original=original,
                samples=samples,
                multiple_of=self.multiple_of,
                accumulate=accumulate if isinstance(accumulate, int) else 1,
                drop_last=drop_last,
                per_rank=trainer.world_size > 1,
                suggest_nearest=self.mode != "nearest",
                applied=applied,
            )
            if samples  # a dataset without a length (or an empty one): no steps to count
            else None,
            unscaled_lr_caveat(
                chosen=chosen, original=original, scale_lr=self.scale_lr, applied=applied
            ),
        ]
        self._caveats = [c for c in caveats if c is not None]
        if applied:  # a dry run trains with the script's size: the doctor's report says it
            for caveat in self._caveats:
                rank_zero_warn(f"BatchSizeTuner: {caveat.text}", category=BatchSizeWarning)


def _doctor_factory(_ctx: Any) -> Callback:
    # Under the doctor the tuner must not change the user's run: it only records the batch size
    # in use. A BatchSizeTuner the script added itself is reused, and its trials are reported.
    return BatchSizeTuner(report_only=True, verbose=False)


register_diagnostic("batch_size", BatchSizeTuner, factory=_doctor_factory, order=40)
