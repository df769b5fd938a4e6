"""Run the trials of every knob on the fit's own loader, model and optimizer, within a budget.

:class:`TrialPlan` says what to try and how long; :class:`Trials` runs it on one rank and
returns one :class:`~lightning_speedpack.what_if.measure.Measurement` per knob (the best
candidate when a knob has several). Loader knobs come first
(:mod:`~lightning_speedpack.what_if.loader_side`): their baseline draws the batch the model
knobs (:mod:`~lightning_speedpack.what_if.model_side`) then run on. Within a knob the variants
alternate round by round (the order rotates), so a machine that slows down slows every variant
alike. The budget, the rounds and the state they share live in
:mod:`~lightning_speedpack.what_if.trial_base`.
"""

from __future__ import annotations

import statistics

import torch

from lightning_speedpack.what_if.fit_gain import Machine, project_fit, side_rates
from lightning_speedpack.what_if.loader_side import LoaderSide
from lightning_speedpack.what_if.measure import Measurement
from lightning_speedpack.what_if.model_side import ModelSide
from lightning_speedpack.what_if.trial_base import MIN_TRIAL_S, TrialPlan, WhatIfError, rng_kept

__all__ = ["MIN_TRIAL_S", "TrialPlan", "Trials", "WhatIfError", "rng_kept"]


class Trials(LoaderSide, ModelSide):
    """The trials of one fit on one rank: the loader side, then the model side.

    Args:
        trainer: the trainer (its strategy, precision and first optimizer are used).
        pl_module: the LightningModule.
        loader: the fit's training loader, as Lightning built it.
        plan: what to try.
    """

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
        self._project(found)
        for m in found:
            if m.status is None and 0 < len(m.gains) < self.plan.rounds:
                m.extra["rounds"] = (
                    f"{len(m.gains)} of {self.plan.rounds} rounds (the budget ran out)"
                )
        order = {k: i for i, k in enumerate(self.plan.knobs)}
        return sorted(found, key=lambda m: order.get(m.knob, len(order)))

    def _project(self, found: list[Measurement]) -> None:
        """Each knob's gain as the fit will see it: its side's trial with the other side's pace.

        The pace a side's knobs did not measure is measured here, once: the model's step
        (``steps`` steps on the trials' batch, a few seconds at most, even past the budget:
        without it a loader knob's gain is a promise the fit may not keep) for the loader
        knobs, the loader's first batches (within the budget) for the model knobs. A pace
        that cannot be measured (a step that fails, a library stream, no budget left) leaves
        that side's gains the trial's own, with a note.
        """
        sides = {m.side for m in found if m.status is None and m.before}
        if "loader" in sides and self.model_step_s is None and self.batch is not None:
            try:
                self._calibrate_model()
            except Exception:  # the model side says why, when it is tried; here: no projection
                self.model_steps = self.model_step_s = None
        if (
            "model" in sides
            and self.loader_batch_s is None
            and self._loader_reason(self.loader) is None
            and self._left()
        ):
            self._loader_batches()
        loader, model = side_rates(found, self.paces)
        workers = int(getattr(self.loader, "num_workers", 0) or 0)
        shares = self.loader_cpu_shares
        machine = Machine(
            accelerator=self.trainer.strategy.root_device.type != "cpu",
            cpu_share=statistics.median(shares) if shares else None,
            cores=self.plan.cores,
            step_threads=torch.get_num_threads(),
        )
        project_fit(found, loader, model, workers, machine)
        for m in found:
            if m.status is None and m.before and not m.projected:
                other = "model's step" if m.side == "loader" else "loader"
                note = f"the {m.side} alone: the {other} was not measured, the fit may gain less"
                m.reason = f"{m.reason}; {note}" if m.reason else note
