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
        for m in found:
            if m.status is None and 0 < len(m.gains) < self.plan.rounds:
                m.extra["rounds"] = (
                    f"{len(m.gains)} of {self.plan.rounds} rounds (the budget ran out)"
                )
        order = {k: i for i, k in enumerate(self.plan.knobs)}
        return sorted(found, key=lambda m: order.get(m.knob, len(order)))
