"""StepTimeline: each training step's phases as profiler/NVTX ranges, a live breakdown, a trace."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch._C._autograd import _profiler_enabled
from torch.utils.data import DataLoader
from typing_extensions import override

from lightning_speedpack.core import events, sampling
from lightning_speedpack.core.findings import Finding
from lightning_speedpack.core.hook_hub import hub_of
from lightning_speedpack.core.hooks import TRAIN_STEP_HOOKS
from lightning_speedpack.core.lightning import Callback, rank_zero_warn
from lightning_speedpack.core.nested import leaves
from lightning_speedpack.core.profiler_tap import mute, tap, untap
from lightning_speedpack.timeline import options, report
from lightning_speedpack.timeline import transfer as _transfer
from lightning_speedpack.timeline.nvtx import NvtxApi, resolve_nvtx
from lightning_speedpack.timeline.optimizer_hooks import OptimizerStepHooks
from lightning_speedpack.timeline.options import TRACE_DIR_ENV, TRACE_ENV
from lightning_speedpack.timeline.phases import PHASES, PhaseClock, shares
from lightning_speedpack.timeline.ranges import RangeStack
from lightning_speedpack.timeline.trace import SYNC_PREFIX, TopOp, TraceWindow

if TYPE_CHECKING:
    import pytorch_lightning as pl

# TRACE_ENV and TRACE_DIR_ENV live in options; the doctor's CLI imports them from here
__all__ = ["TRACE_DIR_ENV", "TRACE_ENV", "StepTimeline"]

_RANGE = {phase: f"speedpack/{phase}" for phase in PHASES}
_STEP_RANGE = "speedpack/step"
_BATCH_HOOKS = ("on_train_batch_start", "on_train_batch_end")  # asleep between samples too
_PREFIX = "throughput/phase/"


class StepTimeline(Callback):
    r"""Show where each training step's time goes: ranges for profilers, a live breakdown, a trace.

    Every training batch is cut into phases, each opened and closed from Lightning's hooks and
    from the actions Lightning times through ``trainer.profiler`` (whatever profiler the Trainer
    has; :mod:`~lightning_speedpack.core.profiler_tap` listens without replacing it):

    ==============================  ================================================================
    Range                           From ... to
    ==============================  ================================================================
    ``speedpack/data_wait``         the DataLoader's next batch: the fetcher's ``next``
                                    (``train_dataloader_next``), nothing else
    ``speedpack/batch_transfer``    Lightning's copy of the batch to the device:
                                    ``on_before_batch_transfer``, ``transfer_batch_to_device``
                                    (the default or your own) and ``on_after_batch_transfer``
    ``speedpack/training_step``     ``on_train_batch_start`` to the next phase: the forward pass
                                    (reopened inside ``optimizer.step``'s own range, so that on
                                    a GPU timeline the forward's kernels are drawn under it)
    ``speedpack/zero_grad``         ``on_before_zero_grad`` to ``on_before_backward``
    ``speedpack/backward``          ``on_before_backward`` to ``on_after_backward``
    ``speedpack/optimizer_step``    ``on_before_optimizer_step`` to the end of the optimizer's
                                    ``step`` (gradient clipping and the update)
    ``speedpack/other``             the rest of the step: Lightning's glue between the phases, and
                                    before the fetch what Lightning runs after
                                    ``on_train_batch_end`` (later callbacks' and the module's
                                    ``on_train_batch_end``, logger writes, starting an epoch's
                                    workers), other callbacks' ``on_train_batch_start``
    ``speedpack/step_<N>``          encloses one batch's phases (``N`` = ``global_step``); NVTX
                                    names it ``speedpack/step``
    ==============================  ================================================================

    With gradient accumulation, the batches that do not step have no ``zero_grad`` and
    ``optimizer_step``. With manual optimisation, ``backward`` (``manual_backward``) and
    ``optimizer_step`` (each ``opt.step()``, however many optimizers) are nested inside
    ``training_step``, which also holds ``opt.zero_grad()`` (no hook marks it).

    1. **Ranges** (``ranges=True``): each phase is a ``torch.profiler.record_function`` range
       (opened only while a profiler records, so it costs nothing otherwise) and, with
       ``nvtx="auto"`` on a machine with CUDA, an NVTX range of the same name, so
       ``nsys profile -t cuda,nvtx python train.py`` shows the phases with no edit to the script.
    2. **Live breakdown**: host-side durations (``time.perf_counter``, never a device sync)
       averaged per batch over the batches since the last log, logged as below and kept per
       window in :attr:`phase_ms_over_steps` (the doctor's series). On a GPU these
       are *host* times: the CPU runs ahead of the GPU, so a phase's kernels may finish during a
       later phase, and a phase that waits for the device (a sync, a full queue) absorbs that
       wait. Over a window their sum is the real step time. A copy from pinned memory returns
       to the host at once (``non_blocking``); one from pageable memory waits for the kernels
       queued before it, and ``batch_transfer`` holds that wait.
    3. **Trace window** (``trace_steps=(start, count)``): ``torch.profiler`` (CPU, and CUDA when
       training on CUDA) records only steps ``start .. start + count - 1`` (each with its fetch
       and copy before it), writes ``speedpack-steps<first>-<last>-rank<R>.pt.trace.json`` into
       ``trace_dir`` (open it in https://ui.perfetto.dev), prints the top operators by self time,
       and logs the file to W&B as a ``profile`` artifact when a ``WandbLogger`` is attached.
    4. **Sync points**: with :class:`~lightning_speedpack.SyncPointWarnings` attached too, each
       sync it records inside the window is an instant event ``speedpack/sync/<kind>@<file:line>``
       in the trace (and an NVTX mark while NVTX is on).

    ===================================  ==========================================================
    Key                                  Meaning
    ===================================  ==========================================================
    ``throughput/phase/<phase>_ms``      mean host milliseconds per training batch of ``<phase>``
                                         (``data_wait``, ``batch_transfer``, ``training_step``,
                                         ``zero_grad``, ``backward``, ``optimizer_step``,
                                         ``other``)
    ``data/h2d_bytes_per_batch``         tensor bytes of one batch after the copy (nested dicts,
                                         lists, tuples, dataclasses), walked on the first batch
                                         after each log only; on the CPU nothing is copied and
                                         this is the batch's size
    ``data/h2d_pinned``                  1 when every train DataLoader pins its batches for the
                                         CUDA device the run trains on (``pin_memory=True``),
                                         else 0
    ``data/h2d_gb_per_sec``              CUDA only: that batch's bytes over the device time
                                         between CUDA events around Lightning's whole
                                         ``batch_to_device`` (with ``on_after_batch_transfer``
                                         and host time before the copy: a lower bound on its
                                         rate), logged once the end event completed (``query()``)
    ===================================  ==========================================================

    The source counts as pinned when every train DataLoader has ``pin_memory=True`` (a
    ``collate_fn`` or ``transfer_batch_to_device`` that pins by itself is not seen). The CUDA
    events come from :data:`lightning_speedpack.timeline.transfer.TIMING`; on the CPU-only
    machine this was written on, that path was exercised only through injected fake events.

    With a listener on :data:`lightning_speedpack.core.events.BATCH_TRANSFER` (a
    :class:`~lightning_speedpack.SpeedAdvisor`), the run's measured copy so far
    (:meth:`measured_transfer`) is published on every logging step and at the end of every
    training epoch (before anyone's ``on_train_end``); nobody listening costs one dict lookup.

    Nothing is left behind: after fit, an exception or ``KeyboardInterrupt`` the profiler is
    stopped (an interrupted window writes no file), every NVTX range is popped, the optimizer
    hooks are removed, the Trainer's profiler gets its own ``start``/``stop`` back and the sync
    listener is unsubscribed.

    Rank policy: every rank times its own steps and, in a window, writes its own trace (rank in
    the file name); rank 0 logs its own phase times, prints and uploads to W&B. Nothing crosses
    ranks.

    Args:
        ranges: open profiler and NVTX ranges for the phases.
        nvtx: ``"auto"`` (NVTX when CUDA is available), True (CUDA required), False, or an
            :class:`~lightning_speedpack.timeline.nvtx.NvtxApi` table to call instead.
        trace_steps: ``(start, count)`` of the ``global_step``\ s to profile, or None.
        trace_dir: where the trace goes; default ``<trainer.log_dir>/traces``.
        log_every_n_steps: log every this many optimizer steps; None follows the Trainer's.
        record_shapes: ``torch.profiler`` option for the window.
        profile_memory: ``torch.profiler`` option for the window.
        with_stack: ``torch.profiler`` option for the window.
        sample_every_n_steps: time every step before step 16 and of a trace window, then one
            step in this many, from step 64 one in eight times as many (the others return
            early from each hook; under the doctor's
            :class:`~lightning_speedpack.core.hook_hub.HookHub` its hooks sleep). ``1``: all.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: a value is out of range, ``nvtx=True`` without CUDA, or a profiler option
            without ``trace_steps``.

    Example:
        >>> from pytorch_lightning import Trainer
        >>> from pytorch_lightning.demos.boring_classes import BoringModel
        >>> timeline = StepTimeline()
        >>> trainer = Trainer(max_steps=4, callbacks=[timeline], logger=False,
        ...                   enable_progress_bar=False, enable_model_summary=False,
        ...                   enable_checkpointing=False, accelerator="cpu")
        >>> trainer.fit(BoringModel())
        >>> sorted(timeline.phase_shares()) == sorted(PHASES)
        True
        >>> timeline.last_metrics["data/h2d_bytes_per_batch"]  # BoringModel: 1 x 32 float32
        128.0
        >>> round(sum(timeline.phase_shares().values()), 6)
        1.0
    """

    def __init__(
        self,
        ranges: bool = True,
        nvtx: bool | str | NvtxApi = "auto",
        trace_steps: tuple[int, int] | None = None,
        trace_dir: str | os.PathLike[str] | None = None,
        log_every_n_steps: int | None = None,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        *,
        sample_every_n_steps: int = 1,
    ) -> None:
        steps = options.check_options(
            ranges,
            nvtx,
            trace_steps,
            trace_dir,
            log_every_n_steps,
            record_shapes,
            profile_memory,
            with_stack,
        )
        self.ranges = ranges
        self.nvtx = nvtx
        self.trace_steps = steps
        self.trace_dir = trace_dir
        self.log_every_n_steps = log_every_n_steps
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self.sample_every_n_steps = options.check_sample_every(sample_every_n_steps)

        self._clock = PhaseClock()
        self._last_logged_step = -1
        self.last_metrics: dict[str, float] = {}
        #: [step, {phase: mean ms per batch}] per logging window (the doctor's series)
        self.phase_ms_over_steps: list[list[Any]] = []
        self.trace_path: Path | None = None
        self.top_ops: list[TopOp] = []
        # runtime-only: never pickled
        self._ranges = RangeStack(None, profiler=False)
        self._window: TraceWindow | None = None
        self._subscription: events.Subscription | None = None
        self._hooks = OptimizerStepHooks(self._before_optimizer_step, self._after_optimizer_step)
        self._manual = False
        self._in_batch = False
        self._step_open = False
        self._training = False
        self._sync_always = False
        self._tapped: Any = None  # the Trainer whose profiler this listens to
        self._actions: dict[str, str] = {}  # profiled action name -> transfer.action_kind
        self._copy = _transfer.CopySampler()  # pickles without its device events

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_ranges=RangeStack(None, profiler=False), _window=None, _subscription=None)
        state.update(_in_batch=False, _step_open=False, _training=False, _tapped=None, _actions={})
        return state

    # ---- results ---------------------------------------------------------------------------

    def phase_ms(self) -> dict[str, float]:
        """Mean host milliseconds per training batch of each phase, over the whole fit."""
        return self._clock.run.mean_ms()

    def phase_shares(self) -> dict[str, float]:
        """Each phase's share of the training batches' host time, over the whole fit."""
        return shares(self._clock.run.seconds)

    def measured_transfer(self) -> events.BatchTransfer | None:
        """The copy of the batches to the device over the fit so far (None before a batch)."""
        return self._copy.measured(self._clock.run)

    # ---- lifecycle -------------------------------------------------------------------------

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._cleanup()
        self._clock.reset()
        self._last_logged_step = -1
        self.last_metrics = {}
        self.phase_ms_over_steps = []
        self.trace_path = None
        self.top_ops = []
        self._copy.reset()
        table = resolve_nvtx(self.nvtx) if self.ranges else None
        self._ranges = RangeStack(table, profiler=self.ranges)
        self._sync_always = table is not None
        self._window = None
        if self.trace_steps is not None:
            directory = (
                Path(self.trace_dir)
                if self.trace_dir is not None
                else Path(trainer.log_dir or trainer.default_root_dir) / "traces"
            )
            self._window = TraceWindow(
                *self.trace_steps,
                directory,
                rank=trainer.global_rank,
                cuda=trainer.strategy.root_device.type == "cuda",
                record_shapes=self.record_shapes,
                profile_memory=self.profile_memory,
                with_stack=self.with_stack,
            )

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._manual = not pl_module.automatic_optimization
        self._training = True
        self._watch_transfer(trainer)
        self._hooks.watch(trainer.optimizers)  # hooked while a step is timed
        if self._sync_always:
            self._listen()

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._open_step(trainer)

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if not self._step_open:
            self._open_step(trainer)
            if not self._step_open:
                return  # a step left out of the sample
        self._copy.sample(batch)  # once per logging window: charged to `other`, before the step
        self._in_batch = True
        self._flat("training_step")

    @override
    def on_before_zero_grad(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if self._in_batch:
            self._enter("zero_grad")

    @override
    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor
    ) -> None:
        if self._in_batch:
            self._enter("backward")

    @override
    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._in_batch:
            self._leave()

    @override
    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if self._in_batch:
            self._enter("optimizer_step")

    def _before_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        # Lightning runs ``training_step`` as the closure of ``optimizer.step``, inside the
        # ``Optimizer.step#...`` range torch opens around the step hooks: the forward's kernels
        # would be that range's on a GPU timeline (Kineto draws each kernel under the innermost
        # range). Reopening ``training_step`` here puts it innermost again; the clock goes on.
        # (NVTX ranges are not reopened: Nsight draws a thread's ranges by time.)
        if self._in_batch and not self._manual and self._clock.current == "training_step":
            self._ranges.renew(_RANGE["training_step"])  # the profiler's only: NVTX as is

    def _after_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._in_batch and self._clock.current == "optimizer_step":
            self._leave()

    @override
    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if self._in_batch:  # else a step left out of the sample: nothing was timed
            self._ranges.close_all()
            self._clock.end_batch(time.perf_counter())
            self._in_batch = False
            self._step_open = False
        step = trainer.global_step
        window = self._window
        if window is not None and window.should_stop(step):
            self._finish_window(trainer)
        every = sampling.log_interval(self.log_every_n_steps, trainer)
        due = every and step % every == 0 and step != self._last_logged_step  # 0: logs no step
        if due and self._clock.window.batches:
            self._publish_transfer()  # once per logging window, not per batch
            self._log(trainer)
        self._open_step(trainer)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._training:
            self._pause()

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._training and not trainer.sanity_checking:
            self._open_step(trainer)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._publish_transfer()  # every batch of the epoch in it, before any on_train_end
        self._pause()

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._pause()
        self._clock.discard_batch()  # a data wait with no batch after it
        self._publish_transfer()  # the fit's last figure (for whoever reads after the fit)
        if self._window is not None and self._window.running:
            self._finish_window(trainer)
        if self._clock.window.batches and trainer.global_step != self._last_logged_step:
            self._log(trainer)
        self._cleanup()

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._cleanup()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._cleanup()

    # ---- doctor ----------------------------------------------------------------------------

    def doctor_figures(self) -> dict[str, Any]:
        """``phase_share``, ``phase_ms``, ``phase_ms_over_steps``, the copy's ``h2d_*``.

        Sampled (``sample_every_n_steps`` above 1): also ``phase_sample_every`` and
        ``phase_batches_timed``.
        """
        return report.doctor_figures(
            self._clock.run,
            self.measured_transfer(),
            self.phase_ms_over_steps,
            self.sample_every_n_steps,
        )

    def doctor_findings(self) -> list[Finding]:
        """The share of a training batch each phase takes, and the trace file (both info)."""
        return report.doctor_findings(
            self._clock.run, self.trace_path, self.top_ops, self.sample_every_n_steps
        )

    # ---- the fetch and the copy, from the profiler's actions ---------------------------------

    def wants(self, name: str) -> bool:
        """Only the fetch and the copy (asked once per action name by the tap)."""
        return bool(_transfer.action_kind(name))

    def on_action(self, name: str, started: bool, now: float) -> None:
        """Switch to ``data_wait`` or ``batch_transfer`` and back (see ``profiler_tap``).

        Only between two training batches: the validation loop's fetch and copy happen while
        the timeline is paused, and a fetch inside ``training_step`` (``dataloader_iter``)
        stays the step's.
        """
        if not self._step_open or self._in_batch:  # most batches, between samples: first
            return
        if (kind := self._actions.get(name)) is None:
            kind = self._actions[name] = _transfer.action_kind(name)
        if not kind:
            return
        if kind == _transfer.FETCH:
            self._flat("data_wait" if started else "other", now)
        elif kind == _transfer.BEFORE:
            if started:  # on_before_batch_transfer runs just before batch_to_device
                self._flat("batch_transfer", now)
        elif started:
            if self._clock.current != "batch_transfer":
                self._flat("batch_transfer", now)
            self._copy.begin()
        else:
            self._copy.end()
            self._flat("other", now)

    def _publish_transfer(self) -> None:
        if events.has_subscribers(events.BATCH_TRANSFER):
            measured = self.measured_transfer()
            if measured is not None:
                events.publish(events.BATCH_TRANSFER, measured)

    def _watch_transfer(self, trainer: pl.Trainer) -> None:
        """Listen to the profiler's actions; decide how this fit's copies are measured."""
        tap(trainer, self)
        self._tapped = trainer
        loaders = leaves(trainer.train_dataloader, DataLoader)
        self._copy.start(trainer.strategy.root_device, loaders, sampling=trainer.is_global_zero)

    # ---- internals -------------------------------------------------------------------------

    def _open_step(self, trainer: pl.Trainer) -> None:
        """Start the next batch: its step range and its data wait (and maybe the window)."""
        if self._step_open or not self._training:
            return
        step = trainer.global_step
        window = self._window
        if window is not None and window.should_start(step):
            self._start_window(step)
        if window is not None and window.running:
            window.saw_step(step)
        elif not sampling.sampled(step, self.sample_every_n_steps):
            self._idle_until_sampled(trainer, step)
            return
        self._quiet(())
        self._hooks.attach()
        self._step_open = True
        self._ranges.push(f"speedpack/step_{step}", _STEP_RANGE)
        self._ranges.push(_RANGE["other"])  # until the fetch starts
        self._clock.switch("other", time.perf_counter())

    def _idle_until_sampled(self, trainer: pl.Trainer, step: int) -> None:
        # Nothing to do before the batch whose end opens a sampled step or logs: under the
        # doctor's hub, not even called until then (its batch hooks cost ~45 us a step, cold).
        every = sampling.log_interval(self.log_every_n_steps, trainer)
        wake = sampling.end_due(step, self.sample_every_n_steps, every)
        hub = hub_of(self) if self.sample_every_n_steps > 1 else None
        self._quiet(TRAIN_STEP_HOOKS)  # quiet first: the hub keeps them quiet when it wakes us
        self._hooks.detach()
        if hub is not None and self._window is None and wake > step:
            hub.sleep(self, _BATCH_HOOKS, wake)

    def _quiet(self, hooks: tuple[str, ...]) -> None:
        # Between samples: no fetch or copy heard, and under the doctor's HookHub no hook called
        if self.sample_every_n_steps > 1:
            mute(self._tapped, self, bool(hooks))  # not tapped (None): nothing to mute
            if (hub := hub_of(self)) is not None:
                hub.quiet(self, hooks)

    def _pause(self) -> None:
        """Stop charging time and close the open ranges (validation, between epochs)."""
        self._clock.switch(None, time.perf_counter())
        self._ranges.close_all()
        self._in_batch = False
        self._step_open = False

    def _flat(self, phase: str, now: float | None = None, depth: int = 1) -> None:
        self._ranges.replace(depth, _RANGE[phase])
        self._clock.switch(phase, time.perf_counter() if now is None else now)

    def _enter(self, phase: str) -> None:
        self._flat(phase, depth=2 if self._manual else 1)  # manual: nested inside training_step

    def _leave(self) -> None:
        if not self._manual:
            self._flat("other")
            return
        self._ranges.pop_to(2)
        self._clock.switch("training_step", time.perf_counter())

    def _log(self, trainer: pl.Trainer) -> None:
        self._last_logged_step = step = trainer.global_step
        means = self._clock.take_window()
        self.phase_ms_over_steps.append([step, {k: round(v, 3) for k, v in means.items()}])
        if trainer.is_global_zero:
            self.last_metrics = {f"{_PREFIX}{name}_ms": value for name, value in means.items()}
            self.last_metrics.update(self._copy.take_metrics())
            for logger in trainer.loggers:
                logger.log_metrics(self.last_metrics, step=step)

    def _listen(self) -> None:
        if self._subscription is None:
            self._subscription = events.subscribe(events.SYNC_POINT, self._on_sync)

    def _on_sync(self, sync: events.SyncPoint) -> None:
        if self._step_open:
            self._ranges.instant(f"{SYNC_PREFIX}{sync.kind}@{sync.location}")

    def _start_window(self, step: int) -> None:
        window = self._window
        if window is None:
            return
        if _profiler_enabled():
            window.done = True
            rank_zero_warn(
                "StepTimeline: another torch profiler is already recording, so the trace "
                f"window {self.trace_steps} is skipped"
            )
            return
        window.start(step)
        self._listen()

    def _finish_window(self, trainer: pl.Trainer) -> None:
        window = self._window
        if window is None:
            return
        window.stop()
        if not self._sync_always and self._subscription is not None:
            self._subscription.close()
            self._subscription = None
        self.trace_path = window.path
        self.top_ops = window.top_ops
        if trainer.is_global_zero and window.path is not None:
            report.print_top_ops(window)
            report.log_wandb_artifact(trainer.loggers, window.path)

    def _cleanup(self) -> None:
        """Stop the profiler, pop every range, remove hooks and listeners (idempotent)."""
        self._training = False
        self._in_batch = False
        self._step_open = False
        self._quiet(())
        self._copy.stop()
        try:
            self._ranges.close_all()
        finally:
            if self._tapped is not None:
                untap(self._tapped, self)
                self._tapped = None
            if self._window is not None:
                self._window.abort()
            if self._subscription is not None:
                self._subscription.close()
                self._subscription = None
            self._hooks.forget()
