"""The model side of the trials: each model knob on the user's own training step, in memory.

``channels_last``, ``precision``, ``fused_optimizer``, ``cudnn_benchmark``, ``tf32`` and
``compile`` (the variants of :mod:`~lightning_speedpack.what_if.model_trials`) and
``batch_size`` (the two multiples of 8 around today's): today's step and the candidate's
alternate on the batch the loader side drew, every state put back
(:func:`~lightning_speedpack.core.trials.run_training_steps`); the losses of the same batches
from the same state give the numerics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from lightning_speedpack.core.lightning import (
    lightning_getattr,
    lightning_hasattr,
    lightning_setattr,
)
from lightning_speedpack.core.memory import free_memory, is_oom_error
from lightning_speedpack.core.trials import (
    StepTiming,
    dataloader_source,
    iterate_batches,
    main_process_loading,
    run_training_steps,
)
from lightning_speedpack.what_if.knobs import LOADER_KNOBS
from lightning_speedpack.what_if.measure import (
    NOT_APPLICABLE,
    Measurement,
    best_of,
    relative_difference,
)
from lightning_speedpack.what_if.model_trials import MODEL_VARIANTS, ModelVariant, Setup
from lightning_speedpack.what_if.trial_base import (
    MAX_MODEL_STEPS,
    OverBudget,
    TrialBase,
    WhatIfError,
    calibrated,
    first_line,
    median,
)

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = ["ModelSide"]


class ModelSide(TrialBase):
    """The model knobs' trials (see the module's docstring)."""

    def _model_side(self) -> list[Measurement]:
        knobs = [k for k in self.plan.knobs if k not in LOADER_KNOBS]
        if not knobs:
            return []
        if self.batch is None:
            why = (
                "no batch could be drawn aside from the fit (a library stream, or an empty loader)"
            )
            return [
                Measurement.skipped(k, "model", _model_today(self.trainer, k), NOT_APPLICABLE, why)
                for k in knobs
            ]
        found = []
        if any(k in knobs for k in ("batch_size", *(v.knob for v in MODEL_VARIANTS))):
            try:
                self._calibrate_model()  # the model's pace first (a failing step says so here)
            except Exception as err:
                if not is_oom_error(err):
                    raise
                free_memory()
                why = "today's step ran out of memory in the trial"
                return [
                    Measurement.skipped(
                        k, "model", _model_today(self.trainer, k), NOT_APPLICABLE, why
                    )
                    for k in knobs
                ]
        for knob in knobs:
            today = _model_today(self.trainer, knob)
            variants = [v for v in MODEL_VARIANTS if v.knob == knob]
            reasons = [v.why_not(self.trainer, self.module, self.batch) for v in variants]
            if variants and all(r is not None for r in reasons):  # said without a trial
                why = "; ".join(dict.fromkeys(r for r in reasons if r))
                found.append(Measurement.skipped(knob, "model", today, NOT_APPLICABLE, why))
                continue
            if not self._left():
                found.append(self._over_budget(knob, "model", today))
                continue
            try:
                if knob == "batch_size":
                    found.append(self._batch_size(today))
                else:
                    found.append(self._model_knob(knob, today, variants))
            except OverBudget:
                found.append(self._over_budget(knob, "model", today))
        return found

    def _calibrate_model(self) -> None:
        """Once, on today's step: the model's pace, and how many steps time ``MIN_TRIAL_S``."""
        if self.model_steps is not None:
            return
        self.model_steps = self.plan.steps
        first = self._baseline()
        per_step = first.seconds / first.steps if first.steps else 0.0
        self.model_step_s = per_step or None
        self.model_steps = calibrated(self.plan.steps, per_step, MAX_MODEL_STEPS)

    def _steps(self, setup: Setup | None, batch: Any = None) -> StepTiming:
        setup = setup or Setup()
        self._calibrate_model()
        return run_training_steps(
            self.trainer,
            self.module,
            self.batch if batch is None else batch,
            self.model_steps or self.plan.steps,
            optimizer=setup.optimizer,
            context=setup.context,
            prepare=setup.prepare,
        )

    def _baseline(self, batch: Any = None) -> StepTiming:
        try:
            return self._steps(None, batch)
        except WhatIfError:
            raise
        except Exception as err:
            if is_oom_error(err):
                free_memory()
                raise
            raise WhatIfError(
                f"WhatIf: the user's training_step raised in a trial on a batch of the train "
                f"loader ({type(err).__name__}: {err}). Every state was put back; the fit would "
                "raise the same at its first step."
            ) from err

    def _model_knob(self, knob: str, today: str, variants: list[ModelVariant]) -> Measurement:
        found, reasons = [], []
        for v in variants:
            why = v.why_not(self.trainer, self.module, self.batch)
            if why is not None:
                reasons.append(why)
                continue
            found.append(self._model_variant(knob, today, v))
        tried = [m for m in found if m.status is None]
        best = best_of(tried)
        if best is not None:
            return best
        if found:
            return found[0]
        return Measurement.skipped(
            knob, "model", today, NOT_APPLICABLE, "; ".join(dict.fromkeys(reasons))
        )

    def _model_variant(self, knob: str, today: str, v: ModelVariant) -> Measurement:
        m = Measurement(knob, "model", today, v.candidate, v.value)
        m.extra["applied_by"] = v.applied_by
        diffs: list[float] = []
        first: float | None = None
        try:
            for r in self._rounds():
                base = cand = None
                for is_candidate in (False, True) if r % 2 == 0 else (True, False):
                    if is_candidate:
                        with v.enter(self.trainer, self.module) as setup:
                            cand = self._steps(setup)
                    else:
                        try:
                            base = self._baseline()
                        except Exception as err:
                            if is_oom_error(err):
                                return Measurement.skipped(
                                    knob,
                                    "model",
                                    today,
                                    NOT_APPLICABLE,
                                    "today's step ran out of memory in the trial",
                                )
                            raise
                if base is None or cand is None:  # pragma: no cover - both always ran
                    continue
                if base.samples_per_sec and cand.samples_per_sec:
                    m.before.append(base.samples_per_sec)
                    m.after.append(cand.samples_per_sec)
                d = relative_difference(base.losses, cand.losses)
                if d is not None:
                    diffs.append(d)
                if first is None:
                    first = cand.first_seconds
        except (WhatIfError, OverBudget):
            raise
        except Exception as err:  # the candidate does not work with this model: not applicable
            if is_oom_error(err):
                free_memory()
                why = f"{v.candidate} ran out of memory in the trial"
            else:
                why = (
                    f"{v.candidate} failed on this model ({type(err).__name__}: {first_line(err)})"
                )
            return Measurement.skipped(knob, "model", today, NOT_APPLICABLE, why)
        m.numerics = max(diffs) if diffs else None
        if knob == "compile" and first is not None and m.after:
            step = (self.batch_samples() or 1) / median(m.after)
            base_step = (self.batch_samples() or 1) / median(m.before)
            compile_s = max(0.0, first - step)
            m.extra["compile_s"] = round(compile_s, 2)
            saved = base_step - step
            m.extra["break_even_steps"] = int(compile_s / saved) + 1 if saved > 0 else None
        return m

    def _batch_size(self, today: str) -> Measurement:
        from lightning_speedpack.batch_size.search import nearest_multiples

        module, trainer = self.module, self.trainer
        skip = None
        source = None
        if not lightning_hasattr(module, "batch_size"):
            skip = "no `batch_size` attribute on the model, its hparams or the datamodule"
        else:
            try:
                source = dataloader_source(trainer, module, "WhatIf", WhatIfError)
            except WhatIfError:
                skip = "the train loader was passed to fit(): it cannot be rebuilt at another size"
        if skip is not None or source is None:
            return Measurement.skipped("batch_size", "model", today, NOT_APPLICABLE, skip or "")
        size = int(lightning_getattr(module, "batch_size"))  # type: ignore[arg-type]
        sizes = [s for s in nearest_multiples(size, 8) if s != size]
        if not sizes:
            return Measurement.skipped(
                "batch_size", "model", today, NOT_APPLICABLE, f"{size} is a multiple of 8 already"
            )
        batches = {}
        try:
            for s in [size, *sizes]:
                lightning_setattr(module, "batch_size", s)
                with main_process_loading(source.train_dataloader()) as loaders:
                    batches[s] = next(iterate_batches(loaders), None)
        finally:
            lightning_setattr(module, "batch_size", size)
        found = []
        for s in sizes:
            m = Measurement("batch_size", "model", today, str(s), s)
            m.extra["applied_by"] = f"BatchSizeTuner(mode='nearest') or batch_size={s}"
            for r in self._rounds():
                order = (size, s) if r % 2 == 0 else (s, size)
                rates = {}
                for each in order:
                    if batches.get(each) is None:
                        continue
                    try:
                        rates[each] = self._steps(None, batches[each]).samples_per_sec
                    except Exception as err:
                        if not is_oom_error(err):
                            raise
                        free_memory()
                        rates[each] = None
                if rates.get(size) and rates.get(s):
                    m.before.append(rates[size])  # type: ignore[arg-type]
                    m.after.append(rates[s])  # type: ignore[arg-type]
            found.append(m)
        best = best_of(found)
        if best is None:
            return Measurement.skipped(
                "batch_size", "model", today, NOT_APPLICABLE, "no candidate size fit"
            )
        best.reason = "changes the optimisation (steps per epoch): never applied at run time"
        return best


def _model_today(trainer: pl.Trainer, knob: str) -> str:
    if knob == "precision":
        return str(trainer.precision)
    if knob == "cudnn_benchmark":
        return str(bool(torch.backends.cudnn.benchmark))
    if knob == "tf32":
        return str(bool(torch.backends.cuda.matmul.allow_tf32))
    if knob == "fused_optimizer":
        opt = trainer.optimizers[0] if trainer.optimizers else None
        fused = bool(opt and any(g.get("fused") for g in opt.param_groups))
        return f"{type(opt).__name__}{' fused' if fused else ''}" if opt is not None else "-"
    if knob == "batch_size":
        module = trainer.lightning_module
        return (
            str(lightning_getattr(module, "batch_size"))
            if lightning_hasattr(module, "batch_size")
            else "-"
        )
    if knob == "channels_last":
        return "contiguous"
    if knob == "compile":
        return "eager"
    return "-"
