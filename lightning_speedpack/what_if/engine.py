"""Run the trials of every knob on the fit's own loader, model and optimizer, within a budget.

:class:`TrialPlan` says what to try and how long; :class:`Trials` runs it on one rank and
returns one :class:`~lightning_speedpack.what_if.measure.Measurement` per knob (the best
candidate when a knob has several). Loader knobs come first: their baseline draws the batch the
model knobs then run on. Within a knob the variants alternate round by round (the order
rotates), so a machine that slows down slows every variant alike.
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

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
from lightning_speedpack.data_xray.ceilings import loader_ceiling
from lightning_speedpack.what_if import loader_trials as lt
from lightning_speedpack.what_if.knobs import GPU_ONLY, LOADER_KNOBS
from lightning_speedpack.what_if.measure import (
    NOT_APPLICABLE,
    NOT_TRIED,
    Measurement,
    best_of,
    relative_difference,
)
from lightning_speedpack.what_if.model_trials import MODEL_VARIANTS, ModelVariant, Setup

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = ["TrialPlan", "Trials", "WhatIfError"]


class WhatIfError(RuntimeError):
    """A trial could not run the user's own training step (the state was put back)."""


class _OverBudget(Exception):
    """The budget ran out before a knob's first round."""


@dataclass(frozen=True)
class TrialPlan:
    """What to try, and how long: the knobs, steps per trial, rounds, budget, numerics."""

    knobs: tuple[str, ...]
    steps: int = 10
    rounds: int = 3
    budget_s: float = 60.0
    tolerance: float = 1e-3
    cores: int = 1  # this rank's share of the cores: the largest worker count tried
    #: The fit's training batches when known: then the trials also stay within ``fit_share``
    #: of the fit's length, projected from the first measured batch (``budget_s`` given by the
    #: user: None).
    fit_batches: int | None = None
    fit_share: float = 0.05


class Trials:
    """The trials of one fit on one rank.

    Args:
        trainer: the trainer (its strategy, precision and first optimizer are used).
        pl_module: the LightningModule.
        loader: the fit's training loader, as Lightning built it.
        plan: what to try.
    """

    def __init__(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loader: Any, plan: TrialPlan
    ) -> None:
        self.trainer, self.module, self.loader, self.plan = trainer, pl_module, loader, plan
        self.started = time.perf_counter()
        self.batch: Any = None
        self.loader_batches: int | None = None  # batches per loader trial (calibrated)
        self.model_steps: int | None = None  # steps per model trial (calibrated)
        self.cut_short = False  # a knob ran fewer rounds than planned (the budget ran out)
        self.loader_batch_s: float | None = None  # today's loader: seconds per batch
        self.model_step_s: float | None = None  # today's model: seconds per step
        self.settings: dict[str, Any] = {}  # the loader winners so far (for later loader knobs)
        self.today_settings: dict[str, Any] = {}

    # ------------------------------------------------------------------ the whole run

    def run(self) -> list[Measurement]:
        """Measure every knob of the plan; the loader's first.

        The RNG states are put back at the end (and by each trial): the fit's first iterator
        draws its shuffle after this, exactly as it would have without the trials.
        """
        with rng_kept():
            return self._run()

    def _run(self) -> list[Measurement]:
        loader_side = self._loader_side()
        if self.batch is None:
            self._draw_batch_main(self.loader)
        found = [*loader_side, *self._model_side()]
        for m in found:
            if m.status is None and 0 < len(m.gains) < self.plan.rounds:
                m.extra["rounds"] = (
                    f"{len(m.gains)} of {self.plan.rounds} rounds (the budget ran out)"
                )
        order = {k: i for i, k in enumerate(self.plan.knobs)}
        return sorted(found, key=lambda m: order.get(m.knob, len(order)))

    @property
    def budget_s(self) -> float:
        """``budget_s``, or ``fit_share`` of the fit's projected length when that is less."""
        fit = self.fit_seconds()
        if fit is None:
            return self.plan.budget_s
        return min(self.plan.budget_s, self.plan.fit_share * fit)

    @property
    def paces(self) -> tuple[float | None, float | None]:
        """Today's loader and model samples/s from their first passes (None: not measured)."""
        samples = self.batch_samples() if self.batch is not None else None
        if not samples:
            return None, None
        loader = samples / self.loader_batch_s if self.loader_batch_s else None
        model = samples / self.model_step_s if self.model_step_s else None
        return loader, model

    def fit_seconds(self) -> float | None:
        """The fit's length projected from its batches and the slower measured ceiling."""
        per_batch = max(self.loader_batch_s or 0.0, self.model_step_s or 0.0)
        if self.plan.fit_batches is None or per_batch <= 0:
            return None
        return self.plan.fit_batches * per_batch

    def _rounds(self) -> Iterator[int]:
        """Each round of the plan; fewer when the budget ran out.

        Raises:
            _OverBudget: before the first round (the calibration spent the budget).
        """
        for r in range(self.plan.rounds):
            if not self._left():
                if r == 0:
                    raise _OverBudget
                self.cut_short = True
                return
            yield r

    def _left(self) -> bool:
        return time.perf_counter() - self.started < self.budget_s

    def _over_budget(self, knob: str, side: str, today: str) -> Measurement:
        fit = self.fit_seconds()
        why = f"the budget of {self.budget_s:.3g} s ran out"
        if fit is not None and self.budget_s < self.plan.budget_s:
            why += (
                f" ({self.plan.fit_share:.0%} of this fit's projected {fit:.3g} s; "
                "WhatIf(budget_s=...) sets it)"
            )
        return Measurement.skipped(knob, side, today, NOT_TRIED, why)

    # ------------------------------------------------------------------ loader side

    def _loader_side(self) -> list[Measurement]:
        knobs = [k for k in self.plan.knobs if k in LOADER_KNOBS]
        if not knobs:
            return []
        loader = self.loader
        reason = self._loader_reason(loader)
        if reason is not None:
            self._draw_batch_main(loader)
            return [
                Measurement.skipped(k, "loader", _today(loader, k), NOT_APPLICABLE, reason)
                for k in knobs
            ]
        self.settings = {name: getattr(loader, name) for name in lt.SETTINGS}
        self.today_settings = dict(self.settings)
        self._loader_batches()  # today's pace first: the fit's projected length, the budget
        found = []
        for knob in knobs:
            today = _today(loader, knob)
            if knob == "pin_memory" and self.trainer.strategy.root_device.type != "cuda":
                found.append(Measurement.skipped(knob, "loader", today, NOT_APPLICABLE, GPU_ONLY))
                continue
            if not self._left():
                found.append(self._over_budget(knob, "loader", today))
                continue
            try:
                found.append(getattr(self, f"_knob_{knob}")(loader, today))
            except _OverBudget:  # the fit's pace, measured first, left no time for the rounds
                found.append(self._over_budget(knob, "loader", today))
        if self.batch is None:
            self._draw_batch_main(loader)
        return found

    def _loader_reason(self, loader: Any) -> str | None:
        if not isinstance(loader, DataLoader):
            return f"the train loader is a {type(loader).__name__}, not a torch DataLoader"
        if lt.is_library_stream(loader.dataset):
            return (
                f"{type(loader.dataset).__name__} is a library stream: it is never read aside "
                "from the fit (a second reader would change its state)"
            )
        return None

    def _draw_batch_main(self, loader: Any) -> None:
        """One batch for the model trials when no loader trial drew one (never a library stream)."""
        dataset = getattr(loader, "dataset", None)
        if self.batch is not None or lt.is_library_stream(dataset):
            return
        if isinstance(loader, DataLoader):
            with lt.variant(loader, num_workers=0) as side:
                _, self.batch = lt.rate(side, batches=1)

    def _loader_batches(self) -> int:
        """Batches per loader trial: ``steps``, or more, so that a trial times ``MIN_TRIAL_S``."""
        if self.loader_batches is None:
            # Two timed batches tell the pace: a slow loader's ten would spend the budget.
            with lt.variant(self.loader) as side:
                result = loader_ceiling(side, batches=2)
            self.batch = result.batch
            per_batch = result.seconds / result.batches if result.batches else 0.0
            self.loader_batch_s = per_batch or None
            # A slow loader's batch is a long sample already: a few of them time MIN_TRIAL_S.
            self.loader_batches = _calibrated(lt.MIN_TIMED_BATCHES, per_batch, MAX_LOADER_BATCHES)
        return self.loader_batches

    def _rates(self, variants: Sequence[dict[str, Any]]) -> list[list[float]]:
        """Loader ceilings of each variant, per round (variant 0 is the baseline)."""
        rates: list[list[float]] = [[] for _ in variants]
        n = len(variants)
        batches = self._loader_batches()
        for r in self._rounds():
            for i in [(r + j) % n for j in range(n)]:  # the order rotates every round
                with lt.variant(self.loader, **variants[i]) as side:
                    value, batch = lt.rate(side, batches=batches)
                if value is not None:
                    rates[i].append(value)
                if batch is not None and i == 0:
                    self.batch = batch
        return rates

    def _compare(
        self, knob: str, today: str, candidates: list[tuple[str, Any, dict[str, Any]]]
    ) -> Measurement:
        """Measure ``candidates`` (text, value, settings) against today's settings."""
        on_top = self.settings != self.today_settings
        rates = self._rates([dict(self.settings), *[c[2] for c in candidates]])
        found = []
        for (text, value, _), after in zip(candidates, rates[1:], strict=True):
            m = Measurement(knob, "loader", today, text, value)
            m.before, m.after = _paired(rates[0], after)
            if on_top:
                m.extra["on_top"] = True
            found.append(m)
        best = best_of(found)
        return (
            best
            if best is not None
            else Measurement.skipped(
                knob,
                "loader",
                today,
                NOT_TRIED,
                "too few batches to time after the warm-up (the workers' prefetch, plus one)",
            )
        )

    def _knob_num_workers(self, loader: DataLoader[Any], today: str) -> Measurement:
        current = loader.num_workers
        counts = [n for n in range(0, self.plan.cores + 1) if n != current]
        stream = isinstance(loader.dataset, IterableDataset)
        if stream and any(n > 1 for n in counts) and lt.stream_duplicates(loader):
            return Measurement.skipped(
                "num_workers",
                "loader",
                today,
                NOT_APPLICABLE,
                "the stream does not shard by get_worker_info(): 2 workers yielded the "
                "same items (more workers would duplicate samples)",
            )
        memory = self._worker_memory(loader) if any(counts) else None
        notes = []
        if memory is not None:
            prefetch = loader.prefetch_factor or 2
            for n in [n for n in counts if n > 0]:
                why = lt.fits_in_memory(memory, n, prefetch)
                if why is not None:
                    counts.remove(n)
                    notes.append(f"num_workers={n} not tried: {why}")
        if not counts:
            return Measurement.skipped(
                "num_workers", "loader", today, NOT_APPLICABLE, "; ".join(notes) or "no other count"
            )
        candidates = [
            (str(n), n, {**self.settings, **_worker_settings(self.settings, n)}) for n in counts
        ]
        best = self._compare("num_workers", today, candidates)
        if notes:
            best.reason = "; ".join(notes)
        if memory is not None:
            best.extra["worker_bytes"] = memory.per_worker_bytes
        if best.gain is not None and best.gain >= 1.0:
            self.settings.update(_worker_settings(self.settings, int(best.value)))
        return best

    def _worker_memory(self, loader: DataLoader[Any]) -> lt.WorkerMemory | None:
        before = lt.children()
        with lt.variant(loader, num_workers=1, persistent_workers=False) as side:
            iterator = iter(side)
            batch = next(iterator, None)
            memory = lt.worker_memory(side, batch, before) if batch is not None else None
            del iterator
        return memory

    def _knob_prefetch_factor(self, loader: DataLoader[Any], today: str) -> Measurement:
        workers = self.settings.get("num_workers", 0)
        if not workers:
            return Measurement.skipped(
                "prefetch_factor", "loader", today, NOT_APPLICABLE, "no worker processes"
            )
        current = self.settings.get("prefetch_factor") or 2
        value = current * 2
        m = self._compare(
            "prefetch_factor",
            today,
            [(str(value), value, {**self.settings, "prefetch_factor": value})],
        )
        m.extra["with_num_workers"] = workers
        m.extra["workers"] = workers
        return m

    def _knob_persistent_workers(self, loader: DataLoader[Any], today: str) -> Measurement:
        workers = self.settings.get("num_workers", 0)
        skip = None
        if not workers:
            skip = "no worker processes"
        elif self.settings.get("persistent_workers"):
            skip = "on already"
        elif self.trainer.max_epochs == 1:
            skip = "one epoch: the workers start once anyway"
        else:
            try:
                length = len(loader)
            except TypeError:
                length = 0
            if not length:
                skip = "a stream has no epoch length to weigh the start-up against"
        if skip is not None:
            return Measurement.skipped("persistent_workers", "loader", today, NOT_APPLICABLE, skip)
        m = Measurement("persistent_workers", "loader", today, "True", True)
        ceiling = statistics_median(self._rates([dict(self.settings)])[0])
        if not ceiling:
            return Measurement.skipped(
                "persistent_workers", "loader", today, NOT_TRIED, "the loader delivered no batch"
            )
        samples = len(loader) * (loader.batch_size or 1)
        starts: dict[bool, list[float]] = {False: [], True: []}
        batches = 2 * int(workers)
        for r in self._rounds():
            for persistent in (False, True) if r % 2 == 0 else (True, False):
                settings = {**self.settings, "persistent_workers": persistent}
                with lt.variant(loader, **settings) as side:
                    seconds = lt.epoch_start_seconds(side, batches)
                if seconds is not None:
                    starts[persistent].append(seconds)
        if not starts[False] or not starts[True]:
            return Measurement.skipped(
                "persistent_workers", "loader", today, NOT_APPLICABLE, "a custom batch sampler"
            )
        epoch = samples / ceiling
        m.before = [samples / (epoch + s) for s in starts[False]]
        m.after = [samples / (epoch + s) for s in starts[True]]
        m.extra["epoch_start_s"] = (
            statistics_median(starts[False]),
            statistics_median(starts[True]),
        )
        m.extra["on_top"] = True
        m.extra["workers"] = workers
        return m

    def _knob_pin_memory(self, loader: DataLoader[Any], today: str) -> Measurement:
        if self.trainer.strategy.root_device.type != "cuda":
            return Measurement.skipped("pin_memory", "loader", today, NOT_APPLICABLE, GPU_ONLY)
        if loader.pin_memory:
            return Measurement.skipped("pin_memory", "loader", today, NOT_APPLICABLE, "on already")
        return self._compare(
            "pin_memory", today, [("True", True, {**self.settings, "pin_memory": True})]
        )

    def _knob_cache(self, loader: DataLoader[Any], today: str) -> Measurement:
        dataset = loader.dataset
        skip = None
        if isinstance(dataset, IterableDataset):
            skip = "a stream (CachedDataset caches map-style datasets; see CachedStream)"
        elif any(
            k.__module__.startswith("lightning_speedpack.cache") for k in type(dataset).__mro__
        ):
            skip = "cached already"
        elif not loader.batch_size:
            skip = "a custom batch sampler: no batch size to build the warm subset with"
        if skip is not None:
            return Measurement.skipped("cache", "loader", today, NOT_APPLICABLE, skip)
        size = loader.batch_size or 1
        warmup = loader.num_workers * (loader.prefetch_factor or 2) + 1
        samples = min(len(dataset), size * (self.plan.steps + warmup + 1))  # type: ignore[arg-type]
        m = Measurement("cache", "loader", today, "CachedDataset", "CachedDataset")
        key = f"speedpack-what-if-{os.getpid()}"
        with lt.cache_pair(loader, samples, key) as (plain, warm):
            for r in self._rounds():
                pair = [(plain, m.before), (warm, m.after)]
                for each, into in pair if r % 2 == 0 else pair[::-1]:
                    value, _ = lt.rate(each, batches=self._loader_batches())
                    if value is not None:
                        into.append(value)
        m.before, m.after = _paired(m.before, m.after)
        m.reason = (
            f"measured on a warm subset of {samples:,} samples; assumes a deterministic __getitem__"
        )
        return m

    # ------------------------------------------------------------------ model side

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
            except _OverBudget:
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
        self.model_steps = _calibrated(self.plan.steps, per_step, MAX_MODEL_STEPS)

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
        except (WhatIfError, _OverBudget):
            raise
        except Exception as err:  # the candidate does not work with this model: not applicable
            if is_oom_error(err):
                free_memory()
                why = f"{v.candidate} ran out of memory in the trial"
            else:
                why = (
                    f"{v.candidate} failed on this model ({type(err).__name__}: {_first_line(err)})"
                )
            return Measurement.skipped(knob, "model", today, NOT_APPLICABLE, why)
        m.numerics = max(diffs) if diffs else None
        if knob == "compile" and first is not None and m.after:
            step = (self.batch_samples() or 1) / statistics_median(m.after)
            base_step = (self.batch_samples() or 1) / statistics_median(m.before)
            compile_s = max(0.0, first - step)
            m.extra["compile_s"] = round(compile_s, 2)
            saved = base_step - step
            m.extra["break_even_steps"] = int(compile_s / saved) + 1 if saved > 0 else None
        return m

    def batch_samples(self) -> int | None:
        """Samples in the trials' batch."""
        from lightning_speedpack.core.trials import samples_in

        return samples_in(self.batch, 0) or None

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


# ---------------------------------------------------------------------- helpers


@contextmanager
def rng_kept() -> Iterator[None]:
    """Put the torch (CUDA), numpy and Python RNG states back after the block."""
    saved = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    cuda = (
        torch.cuda.get_rng_state_all()
        if torch.cuda.is_available() and torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
        else None
    )
    try:
        yield
    finally:
        torch.set_rng_state(saved[0])
        np.random.set_state(saved[1])
        random.setstate(saved[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


#: A trial times at least this long (more steps or batches than ``steps`` when they are quick):
#: a few milliseconds of timing on a busy machine is noise.
MIN_TRIAL_S = 0.25
MAX_LOADER_BATCHES = 400
MAX_MODEL_STEPS = 200


def _calibrated(steps: int, per_item_s: float, most: int) -> int:
    """``steps``, raised so that the items take :data:`MIN_TRIAL_S`, at most ``most``.

    Example:
        >>> _calibrated(10, 0.001, 200), _calibrated(10, 0.5, 200), _calibrated(10, 0.0, 200)
        (200, 10, 10)
    """
    if per_item_s <= 0:
        return steps
    return max(steps, min(most, math.ceil(MIN_TRIAL_S / per_item_s)))


def statistics_median(values: Sequence[float]) -> float:
    import statistics

    return statistics.median(values) if values else 0.0


def _paired(before: list[float], after: list[float]) -> tuple[list[float], list[float]]:
    n = min(len(before), len(after))
    return before[:n], after[:n]


def _worker_settings(settings: dict[str, Any], workers: int) -> dict[str, Any]:
    if workers == 0:
        return {"num_workers": 0, "prefetch_factor": None, "persistent_workers": False}
    return {"num_workers": workers, "prefetch_factor": settings.get("prefetch_factor") or 2}


def _today(loader: Any, knob: str) -> str:
    if knob == "cache":
        return type(getattr(loader, "dataset", None)).__name__
    return str(getattr(loader, knob, "-"))


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


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:200] if text else ""
