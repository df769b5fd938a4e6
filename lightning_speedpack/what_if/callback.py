"""``WhatIf``: try every remedy on the user's own model and data, report the gain, apply winners."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from lightning_speedpack.core import events
from lightning_speedpack.core.collectives import (
    bounded_all_reduce,
    collective_timeout,
    validate_timeout,
)
from lightning_speedpack.core.findings import Finding
from lightning_speedpack.core.lightning import Callback, classes, rank_zero_info
from lightning_speedpack.core.loader_hook import LoaderHook, hook_dataloaders
from lightning_speedpack.core.registry import register_diagnostic
from lightning_speedpack.core.tables import log_fit_end, log_summary, log_table
from lightning_speedpack.core.trials import samples_in
from lightning_speedpack.data_xray.ceilings import cpu_count
from lightning_speedpack.what_if.apply import Applied, decode, encode
from lightning_speedpack.what_if.engine import TrialPlan, Trials, WhatIfError
from lightning_speedpack.what_if.knobs import CPU_AUTO, RUN_TIME, resolve_knobs
from lightning_speedpack.what_if.measure import APPLY, NOT_TRIED, Measurement
from lightning_speedpack.what_if.report import (
    COLUMNS,
    Projection,
    findings,
    format_table,
    project,
    results,
    rows,
)

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = ["WhatIf", "WhatIfError"]

#: The default trial budget: at most this many seconds, and at most 5% of a fit of known length.
DEFAULT_BUDGET_S = 60.0
BUDGET_SHARE = 0.05


class WhatIf(Callback):
    """Try each speed remedy on this model, data and machine; report the gain; apply winners.

    The guides' rules of thumb ("add workers", "channels_last", "bf16", "a multiple of 8") pay
    on some models and cost on others. Before the first step of ``fit``, when Lightning has
    built the training loader, ``WhatIf`` runs short trials of every remedy it can try on the
    fit's own loader, model and optimizer, alternating today's setting and the candidate
    ``rounds`` times, and reports the measured gain of each (median and spread) next to the
    setting. With ``apply``, the winners are applied for the fit.

    - Loader knobs (the loader ceiling: samples/s of a fresh iterator of the same DataLoader
      with the setting changed, after warm-up): ``num_workers`` (0 up to this rank's share of
      the cores, fewer than today included), ``prefetch_factor``, ``persistent_workers`` (the
      epoch start-up, weighed against the epoch), ``pin_memory`` (CUDA) and ``cache`` (a warm
      :class:`~lightning_speedpack.CachedDataset` over a subset; it assumes a deterministic
      ``__getitem__``).
    - Model knobs (the model ceiling: the user's training steps on one batch in memory):
      ``channels_last``, ``precision`` (``bf16-mixed``; ``16-mixed`` on CUDA), ``compile``
      (compile seconds reported apart, with the steps it takes to pay off),
      ``fused_optimizer``, ``cudnn_benchmark`` and ``tf32`` (CUDA), and ``batch_size`` (the two
      multiples of 8 around today's size).
    - The gain is the fit's: a side's trial, projected with the other side's measured pace
      (loading and the step add up without workers on a CPU; with workers, or on an
      accelerator, the slower one sets the pace; see
      :mod:`~lightning_speedpack.what_if.fit_gain`). The side's own ratio stays in the note
      ("the loader alone 314 -> 626 samples/s (1.99x); the fit ...: 2.10x").
    - Numerics: the baseline and the candidate run the same batch from the same state; the
      largest relative difference of their losses is reported, and a candidate beyond
      ``tolerance`` is "changes the numerics", never applied.
    - Safety: one worker's memory is measured first; a worker count that would not fit in
      memory or in ``/dev/shm`` is not tried. A stream (``IterableDataset``) whose two workers
      yield the same items (it ignores ``get_worker_info()``) never gets a worker change. A
      library stream (LitData, MosaicML, the pack's own) is never read aside from the fit.

    Every state a trial touches is put back: parameters and buffers bit-identical, gradients,
    modes, optimizer and scheduler states, the torch, numpy and Python RNG states (the fit
    draws the same first batch as without ``WhatIf``); ``self.log`` is silent meanwhile. The
    user's ``training_step`` runs in the trials, and the loader trials read the user's dataset
    aside from the fit: what else they touch, they touch. A ``__getitem__`` with side effects
    sees those reads, and a :class:`~lightning_speedpack.CachedDataset` is partly filled by
    them, so the fit's first epoch can be faster than it would have been (the samples, their
    order and their count are unchanged).

    Verdicts: ``apply`` (every round gained at least ``min_gain``, numerics within
    tolerance), ``uncertain`` (the median did, not every round), ``no gain here``,
    ``changes the numerics``, ``not applicable`` (with the reason), ``not tried`` (the budget
    ran out). ``apply=True`` (or a list of knobs) applies the ``apply`` winners among
    ``num_workers``, ``prefetch_factor``, ``persistent_workers``, ``pin_memory`` (the fit's
    DataLoader rebuilt with the same dataset, sampler -- the distributed one included --,
    collate function, ``worker_init_fn`` and generator), ``channels_last`` (module and input
    batches), ``fused_optimizer`` (rebuilt with its state) and the cuDNN/TF32 flags, each with
    one printed line. ``cache``, ``precision``, ``compile`` and ``batch_size`` are never
    applied at run time: the report gives the line to write. What was applied is saved in the
    checkpoint; a resumed fit applies it again without new trials.

    Rank policy: every rank runs the trials (they share the machine as the fit will); rank 0
    decides, and with ``apply`` every rank applies rank 0's settings, agreed through one
    all-reduce bounded by ``collective_timeout``. Rank 0 prints and logs. ``channels_last`` is
    not applied under DDP (the wrapper's gradient buckets were built for the old layout).

    Logged at the end of fit (rank 0, every logger, see :mod:`lightning_speedpack.core.tables`):

    ====================================  ===================================================
    key                                   what
    ====================================  ===================================================
    ``speedpack/what_if``                 table, one row per knob: knob, side, today,
                                          candidate, before, after (samples/s), gain,
                                          gain_low, gain_high, numerics, verdict, note
    ``speedpack/what_if/<knob>_gain``     summary: the fit's gain of each knob
    ====================================  ===================================================

    GPU paths (``pin_memory``, ``16-mixed``, ``cudnn_benchmark``, ``tf32``, the CUDA
    synchronisation around the timed steps) ran on the CPU only in this project's tests: their
    applicability was tested, not their gains.

    Args:
        knobs: ``"auto"`` (every knob) or a list of knob names.
        steps: timed steps (model) or batches (loader) per trial, at least 2.
        rounds: baseline/candidate alternations per knob, at least 1 (3 by default).
        budget_s: seconds all trials may take; what did not fit is "not tried". Default: 60 s,
            or 5% of the fit when its length is known and that is less (``max_time``, or its
            batches times the slower of the first measured loader batch and model step: a
            short fit gets a short budget; pass ``budget_s`` to try more).
        apply: ``False``, ``True`` (every run-time winner) or a list of knob names.
        min_gain: the gain a candidate must reach in every round to be applied (>= 1).
        tolerance: the largest relative loss difference a candidate may make.
        verbose: (keyword-only) print the table on rank 0.
        collective_timeout: (keyword-only) seconds the ranks may take to agree under DDP.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: an argument is out of range, names an unknown knob, or asks ``apply`` for a
            knob that is never applied at run time.
        WhatIfError: (in ``fit``) the user's own ``training_step`` raised in a trial; every
            state was put back.

    Example:
        >>> import torch
        >>> from pytorch_lightning import Trainer
        >>> from pytorch_lightning.demos.boring_classes import BoringModel
        >>> what_if = WhatIf(knobs=["num_workers", "fused_optimizer"], steps=2, rounds=1,
        ...                  verbose=False)
        >>> trainer = Trainer(accelerator="cpu", max_steps=2, callbacks=[what_if], logger=False,
        ...                   enable_checkpointing=False, enable_progress_bar=False,
        ...                   enable_model_summary=False, limit_val_batches=0)
        >>> trainer.fit(BoringModel())
        >>> [m.knob for m in what_if.measurements]
        ['num_workers', 'fused_optimizer']
    """

    def __init__(
        self,
        knobs: str | Sequence[str] = "auto",
        steps: int = 10,
        rounds: int = 3,
        budget_s: float | None = None,
        apply: bool | Sequence[str] = False,
        min_gain: float = 1.05,
        tolerance: float = 1e-3,
        *,
        verbose: bool = True,
        collective_timeout: float | None = None,
    ) -> None:
        self.knobs = resolve_knobs(knobs)
        self._auto = knobs == "auto"
        _check_types(
            steps=steps,
            rounds=rounds,
            budget_s=budget_s,
            min_gain=min_gain,
            tolerance=tolerance,
            verbose=verbose,
        )
        errors = []
        if steps < 2:
            errors.append(f"`steps` must be an int >= 2, got {steps!r}")
        if rounds < 1:
            errors.append(f"`rounds` must be an int >= 1, got {rounds!r}")
        if budget_s is not None and not (math.isfinite(budget_s) and budget_s > 0):
            errors.append(f"`budget_s` must be a positive number or None, got {budget_s!r}")
        if not (math.isfinite(min_gain) and min_gain >= 1.0):
            errors.append(f"`min_gain` must be a number >= 1.0, got {min_gain!r}")
        if not (math.isfinite(tolerance) and tolerance >= 0):
            errors.append(f"`tolerance` must be a number >= 0, got {tolerance!r}")
        if errors:
            raise ValueError("WhatIf: " + "; ".join(errors))
        self.apply = _check_apply(apply)
        if collective_timeout is not None:
            validate_timeout("collective_timeout", collective_timeout)
        self.steps, self.rounds, self.budget_s = steps, rounds, budget_s
        self.min_gain, self.tolerance = float(min_gain), float(tolerance)
        self.verbose, self.collective_timeout = verbose, collective_timeout
        self.measurements: list[Measurement] = []
        self.applied = Applied()
        self.trial_seconds: float | None = None
        self._resumed: dict[str, Any] | None = None
        self._loader_workers = 0  # the fit's loader's own workers (what the trials started from)
        self._accelerator = False  # the step runs on an accelerator (loading overlaps it)
        self._paces: tuple[float | None, float | None] = (None, None)  # today's, first pass
        self._hook: LoaderHook | None = None
        self._done = False
        self._fit_samples = 0
        self._fit_start: float | None = None
        self._fit_last: float | None = None
        self._findings: list[Finding] | None = None

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(knobs=self.knobs)

    # ------------------------------------------------------------------ hooks

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._done, self._findings = False, None
        self.measurements, self.trial_seconds = [], None
        self._paces = (None, None)
        self._fit_samples, self._fit_start, self._fit_last = 0, None, None
        self.applied = Applied()
        if self._hook is None:  # first among the loader listeners: the X-ray sees our loader
            self._hook = hook_dataloaders(
                trainer.strategy, lambda dl: self._on_loader(trainer, dl), priority=10
            )

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.verbose and trainer.is_global_zero and self.measurements:
            rank_zero_info("WhatIf: measured on this model and data\n" + self.table())

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._fit_start is None:
            self._fit_start = time.perf_counter()

    @override
    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self._fit_samples += samples_in(batch, 1)  # shapes only, no device sync
        self._fit_last = time.perf_counter()

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        log_fit_end(trainer, self)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._release()

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._release()

    def _release(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self.applied.undo()

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"applied": dict(self.applied.settings or (self._resumed or {}))}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        applied = state_dict.get("applied")
        self._resumed = dict(applied) if isinstance(applied, dict) else None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_hook"] = None  # a live hook belongs to this process's strategy
        return state

    # ------------------------------------------------------------------ the trials

    def _on_loader(self, trainer: pl.Trainer, loader: Any) -> Any:
        if not trainer.training or trainer.sanity_checking:
            return loader
        if not self._done:
            self._done = True
            # Named as Lightning names this callback's hooks: the wall-time ledger charges the
            # trials to WhatIf, not to the epoch start they happen in.
            profiler = trainer.profiler  # type: ignore[attr-defined]
            with profiler.profile(f"[Callback]{self.state_key}.on_train_start"):
                self._decide(trainer, loader)
        return self.applied.loader(loader)  # also for loaders reloaded every epoch

    def _decide(self, trainer: pl.Trainer, loader: Any) -> None:
        pl_module = trainer.lightning_module
        resuming = self._resumed is not None and trainer.ckpt_path is not None
        if resuming:
            settings = dict(self._resumed or {})
            self._apply(trainer, pl_module, settings, "resumed from the checkpoint")
            return
        self._loader_workers = int(getattr(loader, "num_workers", 0) or 0)
        self._accelerator = trainer.strategy.root_device.type != "cpu"
        start = time.perf_counter()
        on_cpu = trainer.strategy.root_device.type != "cuda"
        knobs = (
            tuple(k for k in self.knobs if k in CPU_AUTO) if self._auto and on_cpu else self.knobs
        )
        plan = TrialPlan(
            knobs,
            self.steps,
            self.rounds,
            self._budget(trainer),
            self.tolerance,
            cores=max(1, cpu_count() // max(1, int(trainer.num_devices))),
            fit_batches=None if self.budget_s is not None else fit_batches(trainer, loader),
            fit_share=BUDGET_SHARE,
        )
        trials = Trials(trainer, pl_module, loader, plan)
        self.measurements = trials.run()
        self._paces = trials.paces
        if knobs != self.knobs:
            self.measurements.append(
                Measurement.skipped(
                    "compile",
                    "model",
                    "eager",
                    NOT_TRIED,
                    "on a CPU compiling takes tens of seconds before the first trial step: "
                    "name it to try it, WhatIf(knobs=[..., 'compile'])",
                )
            )
        self.trial_seconds = time.perf_counter() - start
        chosen = self._winners() if self.apply else {}
        if self.apply and trainer.world_size > 1:
            chosen = self._agree(trainer, chosen)
        self._apply(trainer, pl_module, chosen, "measured")
        found = results(self.measurements, self.min_gain, self.tolerance, self.applied.settings)
        events.publish(events.WHAT_IF, found)

    def _budget(self, trainer: pl.Trainer) -> float:
        if self.budget_s is not None:
            return float(self.budget_s)
        for callback in trainer.callbacks:  # type: ignore[attr-defined]
            if isinstance(callback, classes("callbacks.Timer")):  # Trainer(max_time=...)
                remaining = callback.time_remaining("train")
                if remaining is not None and remaining > 0:
                    return min(DEFAULT_BUDGET_S, BUDGET_SHARE * float(remaining))
        return DEFAULT_BUDGET_S

    def _winners(self) -> dict[str, Any]:
        wanted = RUN_TIME if self.apply is True else set(self.apply or ())
        chosen: dict[str, Any] = {}
        for m in self.measurements:
            if m.knob in wanted and m.verdict(self.min_gain, self.tolerance) == APPLY:
                chosen[m.knob] = m.value
        # Prefetching and persistent workers were measured with a number of workers: they win
        # only with that number (a worker count not applied leaves them without their workers).
        workers = chosen.get("num_workers", self._loader_workers)
        for knob in ("prefetch_factor", "persistent_workers"):
            found = next((x for x in self.measurements if x.knob == knob), None)
            if knob in chosen and (found is None or found.extra.get("workers") != workers):
                del chosen[knob]
        return chosen

    def _agree(self, trainer: pl.Trainer, chosen: dict[str, Any]) -> dict[str, Any]:
        """Rank 0's settings on every rank: one bounded all-reduce of rank 0's numbers."""
        values = encode(chosen) if trainer.is_global_zero else [0.0] * len(encode({}))
        tensor = torch.tensor(values, dtype=torch.float64, device=trainer.strategy.root_device)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            total = bounded_all_reduce(
                tensor,
                timeout_s=collective_timeout(self.collective_timeout),
                what="WhatIf: every rank applying rank 0's winners",
            )
        else:
            total = trainer.strategy.reduce(tensor, reduce_op="sum")
        return decode(total.tolist())

    def _apply(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, settings: dict[str, Any], why: str
    ) -> None:
        lines = []
        if settings.get("channels_last") and trainer.world_size > 1:
            settings = {k: v for k, v in settings.items() if k != "channels_last"}
            lines.append(
                "WhatIf: channels_last not applied under DDP (its gradient buckets were built for "
                "the old layout): call model.to(memory_format=torch.channels_last) before fit"
            )
        self.applied = Applied(settings=dict(settings))
        self.applied.model(trainer, pl_module)
        for knob, value in settings.items():
            m = next((x for x in self.measurements if x.knob == knob), None)
            if m is not None and m.gain is not None and m.spread is not None:
                low, high = m.spread
                because = f"measured {m.gain:.2f}x ({low:.2f}-{high:.2f}) on this model and data"
                if m.projected and m.ceiling_gain is not None:
                    because = (
                        f"the fit ~{m.gain:.2f}x ({low:.2f}-{high:.2f}; the {m.side} alone "
                        f"{m.ceiling_gain:.2f}x) on this model and data"
                    )
                lines.append(f"WhatIf: {knob} {m.today} -> {value} for this fit: {because}")
            else:
                lines.append(f"WhatIf: {knob} -> {value} for this fit: {why}")
        self.applied.lines = lines
        for line in lines:
            rank_zero_info(line)

    # ------------------------------------------------------------------ reporting

    def table(self) -> str:
        """The what-if table and the projection, as text."""
        text = format_table(self.measurements, self.min_gain, self.tolerance)
        return f"{text}\n{self.projection().message()}"

    def projection(self) -> Projection:
        """End-to-end samples/s today and with the winners, beside the fit's measured rate."""
        return project(
            self.measurements,
            self.min_gain,
            self.tolerance,
            self._fit_rate(),
            self._paces,
            workers=self._loader_workers,
            accelerator=self._accelerator,
        )

    def _fit_rate(self) -> float | None:
        if self._fit_start is None or self._fit_last is None:
            return None
        seconds = self._fit_last - self._fit_start
        return self._fit_samples / seconds if seconds > 0 else None

    def doctor_findings(self) -> list[Finding]:
        """A finding per measured winner (applied: info; not applied: a warning), the projection."""
        if self._findings is None or self._fit_last is None:
            found = findings(
                self.measurements,
                self.min_gain,
                self.tolerance,
                self.applied.settings,
                self.projection(),
            )
            if self._fit_last is None:
                return found
            self._findings = found
        return list(self._findings)

    def doctor_figures(self) -> dict[str, Any]:
        """The table's rows, the applied settings and the trials' seconds."""
        if not self.measurements:
            return {}
        return {
            "what_if": {
                "columns": list(COLUMNS),
                "rows": rows(self.measurements, self.min_gain, self.tolerance),
                "applied": dict(self.applied.settings),
                "trial_seconds": None
                if self.trial_seconds is None
                else round(self.trial_seconds, 2),
            }
        }

    def log_tables(self, trainer: pl.Trainer) -> None:
        """``speedpack/what_if`` and the ``speedpack/what_if/<knob>_gain`` summary fields."""
        if not self.measurements:
            return
        log_table(
            trainer,
            "speedpack/what_if",
            list(COLUMNS),
            rows(self.measurements, self.min_gain, self.tolerance),
        )
        gains = {
            f"speedpack/what_if/{m.knob}_gain": round(m.gain, 3)
            for m in self.measurements
            if m.gain is not None
        }
        if gains:
            log_summary(trainer, gains)


def fit_batches(trainer: pl.Trainer, loader: Any) -> int | None:
    """The training batches the fit will run, when its length is known (else None).

    ``max_steps`` optimizer steps (times the gradient accumulation), or ``max_epochs`` epochs
    of the loader's length under ``limit_train_batches``.

    Example:
        >>> from types import SimpleNamespace
        >>> t = SimpleNamespace(max_steps=-1, max_epochs=3, limit_train_batches=1.0,
        ...                     accumulate_grad_batches=1)
        >>> fit_batches(t, range(40)), fit_batches(t, iter([]))
        (120, None)
    """
    if trainer.max_steps and trainer.max_steps > 0:
        return int(trainer.max_steps) * max(1, int(trainer.accumulate_grad_batches))
    try:
        per_epoch = len(loader)
    except TypeError:
        return None
    limit = trainer.limit_train_batches
    if isinstance(limit, float):
        per_epoch = int(per_epoch * limit)
    elif isinstance(limit, int):
        per_epoch = min(per_epoch, limit)
    epochs = trainer.max_epochs
    if epochs is None or epochs < 0:
        return None
    return per_epoch * epochs


def _check_types(**values: Any) -> None:
    """TypeError for every argument of the wrong type, all at once."""
    ints, numbers = ("steps", "rounds"), ("budget_s", "min_gain", "tolerance")
    errors = []
    for name, value in values.items():
        if name in ints and (isinstance(value, bool) or not isinstance(value, int)):
            errors.append(f"`{name}` must be an int, got {value!r}")
        elif (
            name in numbers
            and not (value is None and name == "budget_s")
            and (isinstance(value, bool) or not isinstance(value, (int, float)))
        ):
            errors.append(f"`{name}` must be a number, got {value!r}")
        elif name == "verbose" and not isinstance(value, bool):
            errors.append(f"`verbose` must be a bool, got {value!r}")
    if errors:
        raise TypeError("WhatIf: " + "; ".join(errors))


def _check_apply(apply: Any) -> bool | tuple[str, ...]:
    if isinstance(apply, bool):
        return apply
    if isinstance(apply, str) or not isinstance(apply, Sequence):
        raise TypeError(f"WhatIf: `apply` must be a bool or a list of knob names, got {apply!r}")
    names = resolve_knobs(list(apply), "apply")
    never = [k for k in names if k not in RUN_TIME]
    if never:
        raise ValueError(
            f"WhatIf: `apply` names {never}, which are never applied at run time (a cache "
            "assumes a deterministic __getitem__, precision and compile change how the model "
            "computes, the batch size changes the optimisation); the report prints the line to "
            f"write. Knobs `apply` can take: {sorted(RUN_TIME)}"
        )
    return names


#: ``speedpack doctor --what-if-budget SECONDS``: the doctor's WhatIf budget (every rank reads it).
BUDGET_ENV = "LIGHTNING_SPEEDPACK_WHAT_IF_BUDGET"


def _doctor_factory(_ctx: Any) -> Callback:
    # Who typed `--what-if` asked for answers: the 5% rule of a `WhatIf()` left on in a job
    # would try nothing on a fit of a few seconds, so the flag gets the whole default budget
    # and says, before the fit, how long the trials may take.
    budget = os.environ.get(BUDGET_ENV)
    seconds = float(budget) if budget else DEFAULT_BUDGET_S
    rank_zero_info(
        f"speedpack doctor --what-if: each remedy is tried on the script's model and data before "
        f"the first step, for up to {seconds:g} s"
        + ("" if budget else " (`--what-if-budget SECONDS` to change it)")
    )
    return WhatIf(verbose=False, budget_s=seconds)


register_diagnostic("what_if", WhatIf, factory=_doctor_factory, order=3, opt_in="--what-if")
