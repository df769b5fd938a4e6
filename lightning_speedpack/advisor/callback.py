"""SpeedAdvisor: the speed-up guides' checklist, checked against the actual run."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.hooks import RemovableHandle
from typing_extensions import override

from lightning_speedpack.advisor import rules as _advice
from lightning_speedpack.advisor.checklist import (
    gpu_report_checks,
    gpu_start_checks,
    in_table_order,
    report_checks,
    start_checks,
)
from lightning_speedpack.advisor.fixes import (
    APPLICABLE_FIXES,
    undo_zero_grad_set_to_none,
    zero_grad_set_to_none,
)
from lightning_speedpack.advisor.measured import with_measured_gains
from lightning_speedpack.advisor.report import print_findings, summary_fields, table_rows
from lightning_speedpack.advisor.rules import AdvisorFinding, DeviceInfo, LoaderSettings
from lightning_speedpack.advisor.run_inputs import (
    fixed_shapes,
    planned_epochs,
    tensor_shapes,
    tensors,
    train_loaders,
)
from lightning_speedpack.core import events
from lightning_speedpack.core.findings import Finding
from lightning_speedpack.core.hook_hub import hub_of
from lightning_speedpack.core.hooks import overrides
from lightning_speedpack.core.lightning import Callback, rank_zero_info
from lightning_speedpack.core.profiler_tap import FetchTimer, tap, untap
from lightning_speedpack.core.registry import register_diagnostic
from lightning_speedpack.core.tables import TABLES, log_fit_end, log_summary, log_table

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = ["APPLICABLE_FIXES", "AdvisorFinding", "DeviceInfo", "SpeedAdvisor"]


class SpeedAdvisor(Callback):
    r"""Check a run against the speed-up checklist and report what to fix, with the evidence.

    The guides to fast PyTorch training list their advice as prose; this callback checks it
    against the run itself. At the start of training it inspects the Trainer, the
    LightningModule and the train dataloaders; during the first ``measure_steps`` training
    steps it measures how long the loop waits for each batch, whether batch shapes stay fixed,
    whether ``zero_grad`` released the gradients, and (in any validation it sees) whether
    gradients are recorded. Then it prints a table of findings (rank 0) and keeps them in
    :attr:`findings`. Use it once on a new training script, or under ``speedpack doctor``,
    which attaches it and includes its findings in the report.

    ==========================  =================================================================
    finding ``id``              fires when
    ==========================  =================================================================
    ``dataloader-workers``      ``num_workers=0``, or more workers than CPU cores per process;
                                for ``num_workers=0`` only ``info`` (with the figure) once the
                                step was measured waiting under 5% of its time for data (over
                                >= 5 steps): workers would not pay there
    ``pin-memory``              ``pin_memory=False`` while training on a GPU (GPU only); with a
                                :class:`~lightning_speedpack.StepTimeline` attached, only when
                                the copy to the device takes >= 2% of the step, and it says how
                                much ("copy not measured" without one)
    ``persistent-workers``      workers > 0, several epochs, ``persistent_workers=False``
    ``data-wait``               measured: > ``data_wait_threshold`` of the time (and >= 1 ms per
                                step) waits for the next batch
    ``batch-size-multiple``     the train batch size is not a multiple of 8
    ``layer-dims-multiple``     Linear/Conv/Embedding/attention dims >= 8 not multiples of 8
    ``conv-bias-before-bn``     a Conv with a bias registered right before its BatchNorm
    ``precision``               32-bit precision on a GPU with tensor cores (GPU only)
    ``cudnn-benchmark``         conv model, fixed batch shapes, cuDNN benchmark off (GPU only)
    ``channels-last``           Conv2d weights not ``channels_last`` (GPU only)
    ``dataparallel``            an ``nn.DataParallel`` inside the model
    ``zero-grad``               a gradient still allocated right after ``zero_grad``
    ``eval-grad``               grad mode on, or outputs with a graph, during validation
    ``sync-batchnorm``          BatchNorm under DDP with per-device batches < 16 (info)
    ==========================  =================================================================

    Measured remedies: with a ``WhatIf`` on the Trainer (it tries the remedies on this model and
    data at train start and publishes the gains, :data:`~lightning_speedpack.core.events.WHAT_IF`),
    every finding whose knob was measured carries it (the knobs:
    :data:`~lightning_speedpack.advisor.measured.FINDING_KNOBS`; ``data-wait`` takes the better
    of the cache and the workers): ``figures["measured_gain"]`` and
    ``figures["measured_candidate"]``, "; tried: <knob>=<candidate> gave <gain>x on this model"
    in the evidence, and the gain in the fix. A gain under the results' ``min_gain`` makes the
    finding ``info`` ("no gain here"), and so does a remedy that changes the numerics (it says
    so); a knob "not applicable" or "not tried" changes nothing. See
    :func:`~lightning_speedpack.advisor.measured.with_measured_gains`.

    Each finding is an :class:`~lightning_speedpack.advisor.rules.AdvisorFinding` (``id``,
    ``severity``, ``message``, ``evidence``, ``fix``, ``location``, ``figures``);
    :meth:`doctor_findings` converts them to the doctor's ``Finding`` (component ``"advisor"``).

    How things are measured: the data wait of a step is the time spent inside the DataLoader's
    fetch (the data fetcher's ``next``, which Lightning announces to ``trainer.profiler``; see
    :mod:`~lightning_speedpack.core.profiler_tap`); the rest of the interval from the end of the
    previous training batch (or the start of the epoch, or the end of a validation run) is the
    step, so another callback's slow hook or a checkpoint save is not "waiting for data". Only
    ``time.perf_counter``: no device synchronisation, no collectives. The
    first training step of a fit is a warm-up and not measured. ``zero-grad`` looks, before each
    backward that follows a ``zero_grad`` (automatic optimization only), for a parameter whose
    ``.grad`` is still a tensor; that is metadata, no sync. ``eval-grad`` is checked on every
    validation batch until the first validation run ends; if that happens after the table was
    printed, the finding is appended to :attr:`findings` and printed on its own line.

    Findings that only mean something on a CUDA GPU (``pin-memory``, ``precision``,
    ``cudnn-benchmark``, ``channels-last``) are evaluated for the device the run trains on.
    Elsewhere they are listed in :attr:`skipped` with the reason, and read as if the run were
    on a tensor-core GPU: what they find goes to :attr:`gpu_findings` (``info``,
    ``pays_on="GPU"``), for when the model moves to one; the doctor reports them labelled
    "on GPU", after what pays here. These checks were exercised on the CPU only, through an
    injected ``device_info``.

    ``apply`` fixes, each announced with ``rank_zero_info``:

    - ``"cudnn_benchmark"``: sets ``torch.backends.cudnn.benchmark = True`` at fit start and
      restores the previous value when the fit ends or fails.
    - ``"channels_last"``: converts the model to ``torch.channels_last`` before it is moved
      to the device and wrapped (``setup``). Not undone: it becomes the model's own format,
      and checkpoints load into either format. Input batches are not converted.
    - ``"zero_grad_set_to_none"``: during the fit, the LightningModule's ``optimizer_zero_grad``
      runs with ``optimizer.zero_grad`` forced to ``set_to_none=True`` (the Torch 2 default,
      this only matters when an override passes ``False``). Manual optimization is not covered.

    Rank policy: runs on every rank with no collectives (each rank checks its own process);
    prints and logs on rank 0 only.

    After the measurement: :attr:`findings` (list of ``AdvisorFinding``, in the table's order),
    :attr:`skipped` (finding id -> why it was not evaluated for this device),
    :attr:`gpu_findings` (off CUDA: those checks read for a GPU), :attr:`applied` (the fixes
    applied), :attr:`measured_steps` and :attr:`data_wait_fraction` (None before any step was
    measured). Nothing is checkpointed: a resumed run measures again.

    At the end of fit (once, rank 0, through the Trainer's loggers; see
    :mod:`lightning_speedpack.core.tables` for what W&B, CSV and TensorBoard get):

    ===========================================  ===========================================
    key                                          what
    ===========================================  ===========================================
    ``speedpack/advisor``                        table, one row per finding: ``id``,
                                                 ``severity``, ``evidence``, ``fix``,
                                                 ``location``
    ``speedpack/advisor/{error,warning,info}``   summary: findings per severity
    ``speedpack/advisor_findings``               summary: number of findings
    ``speedpack/advisor/data_wait_fraction``     summary: the measured data wait (when
                                                 measured)
    ===========================================  ===========================================

    When it is the last of the pack's callbacks on the Trainer it also logs
    ``speedpack/findings`` (every pack callback's findings) and their counts.

    Args:
        measure_steps: training steps to measure after the warm-up step before reporting.
        apply: names from :data:`APPLICABLE_FIXES` to apply at fit start.
        data_wait_threshold: fraction of the time waiting for data above which ``data-wait``
            fires, in ``[0, 1)``.
        verbose: print the findings table on rank 0 when the measurement ends.
        device_info: describe the device instead of asking torch (for tests: run the GPU-only
            checks on a CPU machine). Keyword-only.

    Raises:
        ValueError: ``measure_steps`` is not a positive int, ``apply`` names an unknown fix,
            or ``data_wait_threshold`` is outside ``[0, 1)``.
        TypeError: ``apply`` is a string instead of a sequence of names, or ``device_info``
            is not a ``DeviceInfo``.

    Example:
        >>> from pytorch_lightning import Trainer
        >>> from pytorch_lightning.demos.boring_classes import BoringModel
        >>> advisor = SpeedAdvisor(measure_steps=3, verbose=False)
        >>> trainer = Trainer(accelerator="cpu", max_steps=5, callbacks=[advisor], logger=False,
        ...                   enable_checkpointing=False, enable_progress_bar=False,
        ...                   enable_model_summary=False)
        >>> trainer.fit(BoringModel())
        >>> ids = [f.id for f in advisor.findings]  # BoringModel: batch size 2, no workers
        >>> "dataloader-workers" in ids, "batch-size-multiple" in ids
        (True, True)
        >>> sorted(advisor.skipped)
        ['channels-last', 'cudnn-benchmark', 'pin-memory', 'precision']
    """

    def __init__(
        self,
        measure_steps: int = 20,
        apply: Sequence[str] = (),
        data_wait_threshold: float = 0.2,
        verbose: bool = True,
        *,
        device_info: DeviceInfo | None = None,
    ) -> None:
        errors: list[str] = []
        if (
            isinstance(measure_steps, bool)
            or not isinstance(measure_steps, int)
            or measure_steps < 1
        ):
            errors.append(f"`measure_steps` must be a positive int, got {measure_steps!r}")
        if isinstance(apply, str) or not isinstance(apply, (list, tuple, set, frozenset)):
            hint = f"; write apply=({apply!r},)" if isinstance(apply, str) else ""
            raise TypeError(f"`apply` must be a sequence of fix names, got {apply!r}{hint}")
        unknown = [name for name in apply if name not in APPLICABLE_FIXES]
        if unknown:
            errors.append(
                f"`apply` got unknown fix(es) {unknown}; allowed: {list(APPLICABLE_FIXES)}"
            )
        if not isinstance(data_wait_threshold, (int, float)) or not 0 <= data_wait_threshold < 1:
            errors.append(f"`data_wait_threshold` must be in [0, 1), got {data_wait_threshold!r}")
        if errors:
            raise ValueError("; ".join(errors))
        if device_info is not None and not isinstance(device_info, DeviceInfo):
            raise TypeError(f"`device_info` must be a DeviceInfo or None, got {device_info!r}")
        self.measure_steps = measure_steps
        self.apply = tuple(dict.fromkeys(apply))
        self.data_wait_threshold = float(data_wait_threshold)
        self.verbose = verbose
        self.device_info = device_info
        self.findings: list[AdvisorFinding] = []
        self.skipped: dict[str, str] = {}
        self.applied: list[str] = []
        self.measured_steps = 0
        self.data_wait_fraction: float | None = None
        self._reset()

    def _reset(self) -> None:
        self._static: list[AdvisorFinding] = []
        #: Off CUDA: the GPU-only checks read as if the run were on a tensor-core GPU.
        self.gpu_findings: list[AdvisorFinding] = []
        self._device = DeviceInfo("cpu")
        self._measuring = False
        self._reported = False
        self._warmup_done = False
        self._steps = 0
        self._wait_s = 0.0
        self._step_s = 0.0
        self._mark: float | None = None
        self._fetched = 0.0  # seconds inside the loader's fetch since the last mark
        self._fetches: FetchTimer | None = None
        self._tapped: Any = None  # the Trainer whose profiler the fetch timer listens to
        self._batch_idx = 0
        self._shapes: set[tuple[tuple[int, ...], ...]] = set()
        self._stale_param: str | None = None
        self._stale_step: int | None = None
        self._eval_grad: str | None = None
        self._eval_checked = False
        self._cudnn_before: bool | None = None
        self._patched_module: pl.LightningModule | None = None
        self._handles: list[RemovableHandle] = []
        self._measured: events.DataVerdict | None = None  # from the data profiler, if it ran
        self._verdicts: events.Subscription | None = None
        self._copy: events.BatchTransfer | None = None  # from the step timeline, if attached
        self._copies: events.Subscription | None = None
        self._trials: events.WhatIfResults | None = None  # from WhatIf, if it ran
        self._trial_results: events.Subscription | None = None
        self._checked: list[AdvisorFinding] = []  # the findings before WhatIf's gains

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_handles"] = []  # hook handles and the module belong to a running fit only
        state["_verdicts"] = None  # so does the subscription to the data profiler's verdict
        state["_copies"] = None  # and the one to the step timeline's copy
        state["_trial_results"] = None  # and the one to WhatIf's results
        state["_patched_module"] = None
        state["_fetches"] = state["_tapped"] = None  # the fetch timer listens to a live Trainer
        for bound in ("log", "log_dict"):  # Lightning binds the module's methods onto callbacks
            state.pop(bound, None)
        return state

    # --- fit start: apply fixes, inspect the run -------------------------------------------

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._reset()
        self.findings, self.skipped, self.applied = [], {}, []
        self.gpu_findings = []
        self.measured_steps, self.data_wait_fraction = 0, None
        self._verdicts = events.subscribe(events.DATA_VERDICT, self._on_verdict)
        self._copies = events.subscribe(events.BATCH_TRANSFER, self._on_copy)
        self._trial_results = events.subscribe(events.WHAT_IF, self._on_trials)
        if "channels_last" in self.apply:
            pl_module.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
            self._announce("channels_last", "model converted to torch.channels_last (not undone)")

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if "cudnn_benchmark" in self.apply:
            self._cudnn_before = torch.backends.cudnn.benchmark
            torch.backends.cudnn.benchmark = True
            self._announce(
                "cudnn_benchmark", "torch.backends.cudnn.benchmark = True until fit ends"
            )
        if "zero_grad_set_to_none" in self.apply:
            self._patch_zero_grad(pl_module)
            self._announce("zero_grad_set_to_none", "optimizer.zero_grad(set_to_none=True) in fit")
        self._watch_validation(trainer, pl_module)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        device = self.device_info or DeviceInfo.from_device(trainer.strategy.root_device)
        self._device = device
        reason = _advice.gpu_skip_reason(device)
        if reason is not None:
            self.skipped = dict.fromkeys(sorted(_advice.GPU_ONLY_IDS), reason)
        loaders = [LoaderSettings.from_dataloader(dl, name) for name, dl in train_loaders(trainer)]
        precision = str(trainer.precision)
        self.gpu_findings = (
            gpu_start_checks(pl_module, loaders, device, precision=precision) if reason else []
        )
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        self._static = start_checks(
            pl_module,
            loaders,
            device,
            precision=precision,
            cores=cores or 1,
            devices=trainer.num_devices,
            world_size=trainer.world_size,
            epochs=planned_epochs(trainer),
        )
        self._measuring = True
        self._fetches, self._tapped = FetchTimer(self._on_fetch), trainer
        tap(trainer, self._fetches)

    # --- measurement -----------------------------------------------------------------------

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._measuring:
            self._mark, self._fetched = time.perf_counter(), 0.0

    def _on_fetch(self, seconds: float) -> None:
        self._fetched += seconds

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if not self._measuring:
            return
        self._batch_idx = batch_idx
        self._shapes.add(tuple(tensor_shapes(batch)))

    @override
    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor
    ) -> None:
        if not (self._measuring and self._warmup_done) or self._stale_param is not None:
            return
        if not pl_module.automatic_optimization:
            return
        if self._batch_idx % trainer.accumulate_grad_batches != 0:
            return  # mid-accumulation: gradients are meant to be there
        for name, param in pl_module.named_parameters():
            if param.requires_grad and param.grad is not None:  # metadata only, no sync
                self._stale_param, self._stale_step = name, trainer.global_step
                return

    @override
    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if not self._measuring:
            return
        now = time.perf_counter()
        if self._warmup_done and self._mark is not None:
            # The interval since the last mark is this step: its fetch is the wait, the rest
            # (the step, the copy, every callback's hooks) is not.
            wait = min(self._fetched, now - self._mark)
            self._wait_s += wait
            self._step_s += now - self._mark - wait
            self._steps += 1
        self._warmup_done = True
        self._mark, self._fetched = now, 0.0
        if self._steps >= self.measure_steps:
            self._report(trainer)

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._measuring:
            self._mark, self._fetched = time.perf_counter(), 0.0  # the wait after validation
        if not self._eval_checked:
            self._eval_checked = True
            self._remove_hooks()
            if self._reported and self._eval_grad is not None:
                extra = _advice.check_eval_grad(self._eval_grad)
                self._show([*self._checked, *extra])
                if self.verbose:
                    rank_zero_info(
                        f"SpeedAdvisor: eval-grad: {extra[0].message} ({self._eval_grad})"
                    )

    @override
    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self._eval_checked or self._eval_grad is not None or trainer.state.fn != "fit":
            return
        if torch.is_grad_enabled():
            self._eval_grad = "grad mode was enabled at the end of validation_step"
        elif any(t.requires_grad for t in tensors(outputs)):
            self._eval_grad = "validation_step returned a tensor that requires grad"

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._measuring and not self._reported:
            self._report(trainer)  # the run had fewer steps than measure_steps
        elif self._reported:  # the copy's share over the whole run, not only the measured steps
            self._amend_copy()

    # --- end of fit: log, undo -------------------------------------------------------------

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        log_fit_end(trainer, self)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._restore()

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._restore()

    def _on_verdict(self, verdict: events.DataVerdict) -> None:
        self._measured = verdict
        if self._reported:  # measured after the report (the profiler ran late): amend it
            found = _advice.with_measured_workers(self._checked, verdict)
            found = _advice.with_measured_wait(found, verdict, self.data_wait_threshold)
            self._show(self._with_own_wait(found))

    def _on_copy(self, measured: events.BatchTransfer) -> None:
        self._copy = measured  # read at the report and at train end: per batch, only kept

    def _on_trials(self, results: events.WhatIfResults) -> None:
        self._trials = results  # normally before the report, which applies it
        if self._reported:
            self._show(self._checked)

    def _amend_copy(self) -> None:
        """``pin-memory`` again from the rule of thumb, with the latest measured copy."""
        pins = [f for f in self._static if f.id == "pin-memory"]
        if not pins:
            return
        found = [f for f in self._checked if f.id != "pin-memory"]
        self._show(found + _advice.with_measured_copy(pins, self._copy))

    def _with_own_wait(self, found: list[AdvisorFinding]) -> list[AdvisorFinding]:
        """``dataloader-workers`` for ``num_workers=0`` against the wait this advisor measured."""
        return _advice.with_own_data_wait(found, self.data_wait_fraction, self.measured_steps)

    def _show(self, checked: list[AdvisorFinding]) -> None:
        """Keep the checks' findings; :attr:`findings` is them, with WhatIf's measured gains."""
        self._checked = in_table_order(checked)
        self.findings = with_measured_gains(self._checked, self._trials)

    def _restore(self) -> None:
        self._measuring = False
        if self._fetches is not None:
            untap(self._tapped, self._fetches)
            self._fetches = self._tapped = None
        if self._verdicts is not None:
            self._verdicts.close()
            self._verdicts = None
        if self._copies is not None:
            self._copies.close()
            self._copies = None
        if self._trial_results is not None:
            self._trial_results.close()
            self._trial_results = None
        if self._cudnn_before is not None:
            torch.backends.cudnn.benchmark = self._cudnn_before
            self._cudnn_before = None
        if self._patched_module is not None:
            undo_zero_grad_set_to_none(self._patched_module)
            self._patched_module = None
        self._remove_hooks()

    # --- reporting -------------------------------------------------------------------------

    def _report(self, trainer: pl.Trainer) -> None:
        self._measuring = False
        if self._fetches is not None:  # measured: stop listening to every action
            untap(self._tapped, self._fetches)
            self._fetches = self._tapped = None
        if (hub := hub_of(self)) is not None:  # nothing left to do in a training batch
            hub.quiet(self, ("on_train_batch_start", "on_before_backward", "on_train_batch_end"))
        self._reported = True
        module = trainer.lightning_module
        self.measured_steps = self._steps
        total = self._wait_s + self._step_s
        self.data_wait_fraction = self._wait_s / total if self._steps and total > 0 else None
        shapes = fixed_shapes(self._shapes)
        found = report_checks(
            self._static,
            module,
            self._device,
            wait_s=self._wait_s,
            step_s=self._step_s,
            steps=self._steps,
            threshold=self.data_wait_threshold,
            cudnn_benchmark=torch.backends.cudnn.benchmark,
            fixed_shapes=shapes,
            stale_param=self._stale_param,
            stale_step=self._stale_step,
            eval_grad=self._eval_grad,
            measured=self._measured,
            data_wait_fraction=self.data_wait_fraction,
        )
        if not self._device.is_gpu:  # a run off CUDA: cuDNN autotuning too, read for a GPU
            self.gpu_findings += gpu_report_checks(module, self._device, shapes)
        self._show(_advice.with_measured_copy(found, self._copy))
        self._remove_hooks()
        if self.verbose and trainer.is_global_zero:
            self.print_table()

    def print_table(self, console: Any = None) -> None:
        """Print :attr:`findings` (and the skipped checks) as a rich table, to stderr by default."""
        from lightning_speedpack.core.console import make_console

        print_findings(console or make_console(), self.findings, self.skipped, self.gpu_findings)

    def log_tables(self, trainer: pl.Trainer) -> None:
        """Log the ``speedpack/advisor`` table and its summary counts (rank 0, no sync)."""
        rows = table_rows(self.findings)
        log_table(trainer, "speedpack/advisor", TABLES["speedpack/advisor"], rows)
        log_summary(trainer, summary_fields(self.findings, self.data_wait_fraction))

    def doctor_findings(self) -> list[Finding]:
        """:attr:`findings`, then :attr:`gpu_findings`, as the doctor's (component ``"advisor"``).

        The GPU findings carry ``pays_on="GPU"``: the report labels them "on GPU", last.
        """
        return [f.to_finding() for f in (*self.findings, *self.gpu_findings)]

    def doctor_figures(self) -> dict[str, Any]:
        """Return ``{"advisor_findings": <number of findings>}`` for the doctor's run summary."""
        return {"advisor_findings": len(self.findings)}

    # --- helpers ---------------------------------------------------------------------------

    def _announce(self, name: str, what: str) -> None:
        self.applied.append(name)
        rank_zero_info(f"SpeedAdvisor applied {name}: {what}")

    def _patch_zero_grad(self, pl_module: pl.LightningModule) -> None:
        zero_grad_set_to_none(pl_module)
        self._patched_module = pl_module

    def _watch_validation(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Forward hooks on the model and its direct children until the first validation run
        # ends (or the measurement does): one Python call per forward, no sync.
        if not overrides(type(pl_module), "validation_step") or trainer.limit_val_batches == 0:
            return  # no validation loop will run: hooks would cost a call per forward for nothing

        def check(module: torch.nn.Module, args: Any, output: Any) -> None:
            validating = trainer.validating or trainer.sanity_checking
            if validating and torch.is_grad_enabled() and self._eval_grad is None:
                self._eval_grad = "grad mode was enabled in a forward during validation"

        modules = [pl_module, *pl_module.children()]
        self._handles = [m.register_forward_hook(check) for m in modules]

    def _remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def _doctor_advisor(_ctx: Any) -> Callback:
    return SpeedAdvisor(verbose=False)


register_diagnostic("advisor", SpeedAdvisor, factory=_doctor_advisor, order=50)
