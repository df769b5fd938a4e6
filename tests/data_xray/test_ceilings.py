"""The loader and model ceilings against independent timings; the verdict."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from pytorch_lightning import Callback, Trainer

from lightning_speedpack.core.trials import time_training_steps
from lightning_speedpack.data_xray.ceilings import loader_ceiling, verdict
from tests.data_xray import pipeline_models as pm
from tests.helpers.models import quiet_trainer_kwargs

TOLERANCE = 0.15


def _independent_rate(loader: Any, skip: int) -> float:
    iterator = iter(loader)
    for _ in range(skip):
        next(iterator)
    start = last = time.perf_counter()
    samples = 0
    for x, _ in iterator:
        samples += len(x)
        last = time.perf_counter()
    return samples / (last - start)


@pytest.mark.slow
def test_loader_ceiling_matches_an_independent_timing() -> None:
    model = pm.PipelineModel(pm.new_truth(), workers=0, n=64)
    loader = model.make_loader()
    ours = loader_ceiling(loader, batches=7, warmup=1)
    theirs = _independent_rate(loader, skip=1)
    assert ours.batches == 7
    assert ours.samples_per_sec == pytest.approx(theirs, rel=TOLERANCE)


def test_loader_ceiling_puts_the_rng_back() -> None:
    loader = torch.utils.data.DataLoader(range(32), batch_size=4, shuffle=True)
    state = torch.get_rng_state()
    loader_ceiling(loader, batches=2, warmup=1)
    assert torch.equal(state, torch.get_rng_state())


def test_model_ceiling_matches_timing_steps_on_an_in_memory_batch(tmp_path: Path) -> None:
    class Measure(Callback):
        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            # The best of three alternating rounds each: a loaded machine only ever slows a
            # round down, so the fastest round of each is the one to compare.
            batch = next(iter(pl_module.make_loader()))
            self.ours = self.theirs = 0.0
            for _ in range(3):
                seconds, samples = time_training_steps(trainer, pl_module, batch, steps=5)
                self.ours = max(self.ours, samples / seconds)
                start = time.perf_counter()
                for i in range(5):
                    loss = pl_module.training_step(batch, i)
                    loss.backward()
                self.theirs = max(self.theirs, 5 * len(batch[0]) / (time.perf_counter() - start))

    measure = Measure()
    model = pm.PipelineModel(pm.new_truth(), step_sleep=0.01, n=16)
    Trainer(**quiet_trainer_kwargs(tmp_path, max_steps=1, callbacks=[measure])).fit(model)
    assert measure.ours == pytest.approx(measure.theirs, rel=TOLERANCE)


def test_verdict_names_the_bound_and_the_workers() -> None:
    data = verdict(310.0, 2400.0, per_worker_sps=100.0)
    assert data.bound == "data"
    assert data.workers_needed == 24
    assert data.message.startswith(
        "data-bound: the loader delivers 310 samples/s, the model could consume 2,400"
    )
    model = verdict(5000.0, 2400.0)
    assert model.bound == "model"
    assert model.message.startswith("model-bound")
    assert verdict(None, 10.0).bound == "unknown"


def test_a_loader_with_the_workers_it_needs_is_not_told_to_add_workers() -> None:
    """A 2-rank LightningCLI job, one worker (28,459 samples/s) for a model of 26,546: the
    loader delivered 11,328. Before, the verdict read "about 1 worker ... would close the gap"."""
    data = verdict(11328.0, 26546.0, per_worker_sps=28459.0, workers=1)
    assert (data.bound, data.workers_needed) == ("data", None)
    assert data.message == (
        "data-bound: the loader delivers 11,328 samples/s, the model could consume 26,546; "
        "the 1 worker could load 28,459 samples/s, yet the loader delivered 11,328: more workers "
        "would not close the gap, which lies in handing batches from the worker process to the "
        "training process (or in their start); larger batches, or num_workers=0 when a sample "
        "is cheap to read (e.g. from a cache), remove that handover"
    )
    more = verdict(11328.0, 26546.0, per_worker_sps=20000.0, workers=1)  # 2 needed: add one
    assert more.workers_needed == 2
    assert "about 2 workers at the measured 20,000 samples/s each" in more.message
