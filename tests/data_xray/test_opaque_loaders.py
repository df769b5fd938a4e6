"""DataPipelineProfiler on loaders it cannot see into: the wait at the fetch decides the bound.

A torchdata.nodes pipeline, a generator, an iterable class: no stage is timed, no loader
ceiling is made up from the run's own pace, and the run's measured wait at the fetch decides
data-bound vs model-bound. The plants are unambiguous on a loaded machine: 20 ms of loading
a batch against an instant step, or the reverse.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import SequentialSampler, default_collate

from lightning_speedpack.core import events
from lightning_speedpack.core.findings import Finding
from lightning_speedpack.data_xray.ceilings import Verdict
from lightning_speedpack.data_xray.loaders import (
    loader_fix,
    loader_location,
    loader_name,
    nodes_pipeline,
    not_timed_reason,
)
from lightning_speedpack.data_xray.profiler import DataPipelineProfiler
from lightning_speedpack.data_xray.run_check import EpochFigures, check_verdict
from tests.data_xray import pipeline_models as pm

BATCH = 4
BATCHES = 12
SLOW = 0.02  # s: loading a batch (the data-bound plants) or a training step (the model-bound)
NOT_TIMED = "not a torch DataLoader: torchdata.nodes.Loader"


def nodes_loader(per_sample: float) -> Any:
    """SamplerWrapper -> ParallelMapper (1 thread) -> Batcher -> Mapper(collate) -> Prefetcher."""
    nodes = pytest.importorskip("torchdata.nodes")
    data = pm.ColdDataset(BATCH * BATCHES, per_sample)
    node = nodes.SamplerWrapper(SequentialSampler(data))
    node = nodes.ParallelMapper(node, map_fn=data.__getitem__, num_workers=1, method="thread")
    node = nodes.Batcher(node, batch_size=BATCH)
    node = nodes.Mapper(node, default_collate)
    return nodes.Loader(nodes.Prefetcher(node, prefetch_factor=2))


def _batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.full((BATCH, 4), float(i)), torch.full((BATCH,), float(i))


def slow_batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """A plain generator that takes SLOW to produce each batch."""
    for i in range(BATCHES):
        time.sleep(SLOW)
        yield _batch(i)


class Batches:
    """An iterable class of ready batches (re-iterable, one pass per epoch)."""

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return (_batch(i) for i in range(BATCHES))


def _fit(tmp_path: Path, loader: Any, step_sleep: float, **kw: Any) -> DataPipelineProfiler:
    profiler = DataPipelineProfiler(probe=kw.pop("probe", "off"), model_steps=2)
    pm.fit(tmp_path, pm.StepModel(loader, step_sleep=step_sleep), profiler, **kw)
    return profiler


def _data_warnings(found: list[Finding]) -> list[Finding]:
    return [f for f in found if f.component == "data" and f.severity != "info"]


@pytest.fixture
def published() -> Iterator[list[events.DataVerdict]]:
    seen: list[events.DataVerdict] = []
    subscription = events.subscribe(events.DATA_VERDICT, seen.append)
    yield seen
    subscription.close()


def test_a_data_bound_nodes_pipeline_is_called_data_bound_with_its_measured_wait(
    tmp_path: Path, published: list[events.DataVerdict]
) -> None:
    profiler = _fit(tmp_path, nodes_loader(SLOW / BATCH), step_sleep=0.0, max_epochs=2)
    check = profiler.run_check
    assert check is not None
    assert check.steady is not None
    wait = check.steady.wait_fraction
    assert profiler.verdict is not None
    assert profiler.verdict.bound == "data"
    (warning,) = _data_warnings(profiler.doctor_findings())
    assert warning.id == "data-bound"
    assert f"the run waited for data {wait:.0%} of its training time" in warning.message
    assert warning.figures["data_wait_fraction"] == round(wait, 4)
    assert warning.figures["loader_ceiling_samples_per_sec"] is None  # never the run's pace
    assert warning.fix is not None
    assert "ParallelMapper" in warning.fix
    assert "method='process'" in warning.fix
    assert "Prefetcher" in warning.fix
    assert (
        warning.location
        == f"pipeline_models.py:{pm.ColdDataset.__getitem__.__code__.co_firstlineno}"
    )
    figures = profiler.doctor_figures()
    assert figures["loader_ceiling_samples_per_sec"] is None
    assert figures["bound"] == "data"
    assert figures["verdict"] == warning.message
    # The advisor and the throughput logger hear the same: data-bound, with the wait.
    assert published[-1].bound == "data"
    assert published[-1].loader_samples_per_sec is None
    assert published[-1].data_wait_fraction == wait


def test_a_model_bound_nodes_pipeline_gets_no_data_warning(tmp_path: Path) -> None:
    profiler = _fit(tmp_path, nodes_loader(0.0), step_sleep=SLOW, max_epochs=2)
    assert profiler.verdict is not None
    assert profiler.verdict.bound == "model"
    found = profiler.doctor_findings()
    assert _data_warnings(found) == []
    (bound,) = [f for f in found if f.id == "model-bound"]
    assert "the loader's own ceiling was not measured" in bound.message
    assert profiler.doctor_figures()["loader_ceiling_samples_per_sec"] is None


def test_what_was_not_timed_is_said_once(tmp_path: Path) -> None:
    profiler = _fit(tmp_path, nodes_loader(0.0), step_sleep=0.0, max_epochs=3)
    found = profiler.doctor_findings()
    notes = [f for f in found if "not timed" in f.message]
    assert [f.id for f in notes] == ["stages-not-timed"]
    assert notes[0].message.startswith(f"not timed: {NOT_TIMED} (")
    assert "\n" not in notes[0].message
    assert sum(NOT_TIMED in f.message for f in found) == 1
    assert profiler.doctor_figures()["not_timed"] == NOT_TIMED
    assert not any(f.id == "data-pipeline" for f in found)  # no stage table of nothing


def test_deep_times_the_model_on_the_fits_first_batch(tmp_path: Path) -> None:
    profiler = _fit(tmp_path, nodes_loader(SLOW / BATCH), step_sleep=0.0, probe="start")
    assert profiler.trial_steps == 3  # one warm-up and model_steps
    assert profiler.model_ceiling is not None
    assert profiler.loader_ceiling is None
    assert profiler.verdict is not None
    assert profiler.verdict.bound == "data"
    revised = profiler.doctor_figures().get("verdict_revisions", [])
    if not revised:
        assert profiler.verdict.model_samples_per_sec == profiler.model_ceiling
    else:  # a loaded machine slowed the probe, and the run's own steps refuted its figure
        assert any("the run's steps went at" in line for line in revised)
        assert profiler.verdict.model_samples_per_sec > profiler.model_ceiling


@pytest.mark.parametrize(
    ("loader", "step_sleep", "bound", "name"),
    [(slow_batches, 0.0, "data", "generator"), (Batches, SLOW, "model", f"{__name__}.Batches")],
    ids=["data-bound-generator", "model-bound-iterable"],
)
def test_a_plain_iterable_is_judged_by_its_wait(
    tmp_path: Path, loader: Any, step_sleep: float, bound: str, name: str
) -> None:
    profiler = _fit(tmp_path, loader(), step_sleep=step_sleep)
    assert profiler.verdict is not None
    assert profiler.verdict.bound == bound
    figures = profiler.doctor_figures()
    assert figures["not_timed"] == f"not a torch DataLoader: {name}"
    assert figures["loader_ceiling_samples_per_sec"] is None
    warnings = _data_warnings(profiler.doctor_findings())
    if bound == "model":
        assert warnings == []
        return
    (warning,) = warnings
    wait = profiler.run_check.steady.wait_fraction  # type: ignore[union-attr]
    assert f"the run waited for data {wait:.0%}" in warning.message
    assert warning.fix is not None
    assert warning.fix.startswith("make the generator produce")
    assert warning.location == f"test_opaque_loaders.py:{slow_batches.__code__.co_firstlineno}"


def test_the_wait_decides_when_no_loader_figure_was_measured() -> None:
    waited = EpochFigures(epoch=0, seconds=1.0, samples=400, data_wait_seconds=0.72)
    brisk = EpochFigures(epoch=0, seconds=1.0, samples=400, data_wait_seconds=0.03)
    data = check_verdict(None, [waited], cores=1, workers=0, cached=False, loader_seen=False)
    model = check_verdict(None, [brisk], cores=1, workers=0, cached=False, loader_seen=False)
    assert data is not None
    assert model is not None
    assert (data.verdict.bound, data.verdict.loader_samples_per_sec) == ("data", None)
    assert data.message == (
        "data-bound: the run waited for data 72% of its training time; the steps got 400 "
        "samples/s, the model could consume 1,429 (the loader's own ceiling was not measured)"
    )
    assert (model.verdict.bound, model.verdict.loader_samples_per_sec) == ("model", None)
    assert model.message == (
        "model-bound: the model consumes 412 samples/s; the run waited for data 3% of its "
        "training time (the loader's own ceiling was not measured)"
    )


def test_a_probe_loader_figure_is_ignored_when_the_fit_has_another_loader() -> None:
    epoch = EpochFigures(epoch=0, seconds=1.0, samples=400, data_wait_seconds=0.5)
    probe = Verdict("model", 9000.0, 1000.0)  # e.g. a DataLoader beside a generator
    checked = check_verdict(probe, [epoch], cores=1, workers=0, cached=False, loader_seen=False)
    assert checked is not None
    assert (checked.verdict.bound, checked.verdict.loader_samples_per_sec) == ("data", None)
    assert checked.revisions == ["the run waited for data 50% of its training time"]


def test_a_nodes_pipeline_is_named_and_located() -> None:
    loader = nodes_loader(0.0)
    assert loader_name(loader) == "torchdata.nodes.Loader"
    assert not_timed_reason([loader, loader]) == NOT_TIMED
    assert nodes_pipeline(loader) == (
        "SamplerWrapper -> ParallelMapper(num_workers=1, method='thread') -> Batcher -> Mapper "
        "-> Prefetcher(prefetch_factor=2)"
    )
    line = pm.ColdDataset.__getitem__.__code__.co_firstlineno
    assert loader_location(loader) == f"pipeline_models.py:{line}"
    assert loader_fix(loader).startswith(
        f"feed the torchdata.nodes pipeline faster ({nodes_pipeline(loader)})"
    )
    assert (
        loader_location(Batches())
        == f"test_opaque_loaders.py:{Batches.__iter__.__code__.co_firstlineno}"
    )
