"""What every side of the trials shares: the plan, the budget, the rounds, the RNG kept.

:class:`TrialBase` holds one fit's trial state on one rank (the batch the model trials run on,
today's paces, the loader settings found so far) and the budget: ``budget_s``, or a share of
the fit's projected length, spent round by round (:meth:`TrialBase._rounds`). The loader side
(:mod:`~lightning_speedpack.what_if.loader_side`) and the model side
(:mod:`~lightning_speedpack.what_if.model_side`) build on it;
:class:`~lightning_speedpack.what_if.engine.Trials` runs both.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lightning_speedpack.what_if.measure import NOT_TRIED, Measurement

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = [
    "MIN_TRIAL_S",
    "TrialBase",
    "TrialPlan",
    "WhatIfError",
    "calibrated",
    "first_line",
    "median",
    "paired",
    "rng_kept",
]


class WhatIfError(RuntimeError):
    """A trial could not run the user's own training step (the state was put back)."""


class OverBudget(Exception):
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


class TrialBase:
    """One fit's trial state on one rank, and its budget.

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
        self.loader_cpu_shares: list[float] = []  # CPU share of the passes without workers
        self.settings: dict[str, Any] = {}  # the loader winners so far (for later loader knobs)
        self.today_settings: dict[str, Any] = {}

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
            OverBudget: before the first round (the calibration spent the budget).
        """
        for r in range(self.plan.rounds):
            if not self._left():
                if r == 0:
                    raise OverBudget
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

    def batch_samples(self) -> int | None:
        """Samples in the trials' batch."""
        from lightning_speedpack.core.trials import samples_in

        return samples_in(self.batch, 0) or None


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


def calibrated(steps: int, per_item_s: float, most: int) -> int:
    """``steps``, raised so that the items take :data:`MIN_TRIAL_S`, at most ``most``.

    Example:
        >>> calibrated(10, 0.001, 200), calibrated(10, 0.5, 200), calibrated(10, 0.0, 200)
        (200, 10, 10)
    """
    if per_item_s <= 0:
        return steps
    return max(steps, min(most, math.ceil(MIN_TRIAL_S / per_item_s)))


def median(values: Sequence[float]) -> float:
    """The median of ``values``; 0.0 when there are none."""
    return statistics.median(values) if values else 0.0


def paired(before: list[float], after: list[float]) -> tuple[list[float], list[float]]:
    """Both lists cut to the rounds they both have (a round one side missed is dropped)."""
    n = min(len(before), len(after))
    return before[:n], after[:n]


def first_line(err: BaseException) -> str:
    """The first line of an error's message, at most 200 characters (for a table cell)."""
    text = str(err).strip().splitlines()
    return text[0][:200] if text else ""
