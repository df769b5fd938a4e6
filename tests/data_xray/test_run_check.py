"""The verdict checked against the run: pure figures first, then real fits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

from lightning_speedpack.cache.cached_dataset import CachedDataset
from lightning_speedpack.cache.stream import CachedStream
from lightning_speedpack.data_xray.ceilings import Verdict, cpu_count
from lightning_speedpack.data_xray.profiler import DataPipelineProfiler
from lightning_speedpack.data_xray.run_check import EpochFigures, check_verdict, loader_cores
from tests.data_xray import pipeline_models as pm
from tests.data_xray.pipeline_models import fit as _fit
from tests.helpers.ddp import run_ddp
from tests.helpers.models import quiet_trainer_kwargs


def epoch(
    k: int,
    rate: float,
    wait: float,
    *,
    per_process: float,
    processes: int = 2,
    hits: float = 0.0,
    misses: float = 0.0,
    cpu_share: float = 1.0,
) -> EpochFigures:
    """An epoch of 1 s training at ``rate``, waiting ``wait`` of it for data."""
    samples = int(rate)
    busy = samples / per_process
    return EpochFigures(
        epoch=k,
        seconds=1.0,
        samples=samples,
        data_wait_seconds=wait,
        busy_seconds=busy,
        loaded_samples=samples,
        processes=processes,
        cpu_seconds=busy * cpu_share,
        hits=hits,
        misses=misses,
    )


def test_the_demo_fast_run_a_cold_probe_refuted_by_warm_epochs_is_model_bound() -> None:
    """Issue 29's case: probe 303 samples/s on the cold cache, the run went at ~1,377."""
    probe = Verdict("data", 303.0, 1226.0, 12, 107.0)
    epochs = [epoch(0, 500, 0.55, per_process=120, misses=1500, hits=500)]
    epochs += [epoch(k, 1377, 0.03, per_process=3000, hits=2000) for k in range(1, 8)]
    checked = check_verdict(probe, epochs, cores=1, workers=2, cached=True)
    assert checked is not None
    v = checked.verdict
    assert v.bound == "model"
    assert v.workers_needed is None
    assert v.model_samples_per_sec == pytest.approx(1377 / 0.97, rel=1e-3)  # not the probe's 1,226
    assert v.loader_samples_per_sec == pytest.approx(6000)  # warm: 3,000 per process x 2
    assert checked.filling_bound == "data"
    msg = checked.message
    assert msg.startswith("epoch 1: data-bound while the cache fills (1.0 s, once); from epoch 2: ")
    assert "model-bound" in msg
    assert "6,000 warm" in msg
    assert "probe at fit start, cold cache: loader 303 samples/s; the run consumed 1,377" in msg
    assert "probe: model 1,226 samples/s; the run's steps went at 1,420" in msg


def test_a_data_bound_run_keeps_its_verdict_and_the_probe_is_not_revised() -> None:
    probe = Verdict("data", 300.0, 2400.0, 8, 300.0)
    epochs = [epoch(k, 310, 0.85, per_process=310, processes=1, cpu_share=0.95) for k in range(3)]
    checked = check_verdict(probe, epochs, cores=7, workers=0, cached=False)
    assert checked is not None
    assert checked.revisions == []
    v = checked.verdict
    assert v.bound == "data"
    assert v.loader_samples_per_sec == 300.0
    # 2,400 / 310 = 8 workers needed > 7 cores and the fetch computes: 7, and what else can
    assert v.workers_needed == 7
    assert v.cores == 7
    assert "CachedDataset" in (v.instead or "")


def test_workers_never_exceed_the_cores_for_a_cpu_bound_fetch_but_may_for_a_waiting_one() -> None:
    epochs = [epoch(k, 100, 0.8, per_process=50, cpu_share=0.97) for k in range(3)]
    cpu_bound = check_verdict(None, epochs, cores=1, workers=2, cached=False)
    assert cpu_bound is not None
    v = cpu_bound.verdict
    assert v.bound == "data"
    assert v.workers_needed is None
    assert v.cores == 1
    assert "CachedDataset" in (v.instead or "")
    assert "12 workers" not in v.message
    assert "cannot close it with workers" in v.message
    sleeping = [epoch(k, 100, 0.8, per_process=50, cpu_share=0.05) for k in range(3)]
    waits = check_verdict(None, sleeping, cores=1, workers=2, cached=False)
    assert waits is not None
    assert waits.verdict.workers_needed is not None
    assert waits.verdict.workers_needed > 1
    assert waits.verdict.more_than_cores
    assert "CPU 5% of its time" in waits.verdict.message


def test_data_bound_with_under_5_percent_data_wait_is_revised_to_model_bound() -> None:
    probe = Verdict("data", 500.0, 900.0, 4, 250.0)
    epochs = [epoch(k, 800, 0.02, per_process=420) for k in range(4)]  # loader 840 from the fit
    checked = check_verdict(probe, epochs, cores=1, workers=2, cached=False)
    assert checked is not None
    assert checked.verdict.bound == "model"
    assert any("waited for data 2%" in r or "the run consumed 800" in r for r in checked.revisions)


def test_a_loader_with_the_workers_it_needs_is_told_the_handover_not_one_worker() -> None:
    """A 2-rank LightningCLI job with one worker: one loading process at 31,000 samples/s could
    feed the model, yet the run waited 19%. Before: "about 1 worker ... would close the gap"."""
    epochs = [epoch(k, 12000, 0.19, per_process=31000, processes=1) for k in range(3)]
    probe = Verdict("data", 11939.0, 22309.0, 2, 19141.0)
    checked = check_verdict(probe, epochs, cores=2, workers=1, cached=False)
    assert checked is not None
    v = checked.verdict
    assert (v.bound, v.workers_needed) == ("data", None)
    assert "about 1 worker" not in v.message
    assert "the workers could load 31,000 samples/s yet the step waited" in v.message


def test_waiting_while_the_workers_idle_is_the_handover_not_more_workers() -> None:
    """Measured in the verdict zoo: cached reads at ~88,000 samples/s per the workers' busy
    time, a 3 ms step, and still 44% of the time waiting for each batch."""
    epochs = [epoch(k, 4700, 0.44, per_process=44000, hits=320) for k in range(1, 3)]
    probe = Verdict("model", 9000.0, 8000.0, None, 4500.0)
    checked = check_verdict(probe, epochs, cores=1, workers=2, cached=True)
    assert checked is not None
    v = checked.verdict
    assert v.bound == "data"
    assert v.workers_needed is None  # more workers would only add handovers
    assert v.loader_samples_per_sec == 4700  # what reached the step, not the workers' pace
    assert "handing batches from the worker processes" in v.message
    assert checked.message.endswith(
        "the run waited for data 44% of its training time: verdict revised]"
    )


def test_no_probe_the_run_alone_gives_the_verdict_with_its_spread() -> None:
    epochs = [epoch(0, 900, 0.01, per_process=2000), epoch(1, 1000, 0.01, per_process=2000)]
    checked = check_verdict(None, epochs, cores=1, workers=2, cached=False)
    assert checked is not None
    v = checked.verdict
    assert v.bound == "model"
    assert v.model_spread is not None
    assert "over epochs" in v.message
    assert not v.message.startswith("unknown")


def test_nothing_to_check_against_without_a_step() -> None:
    assert check_verdict(None, [], cores=1, workers=0, cached=False) is None


@pytest.mark.parametrize(("cpus", "ranks", "cores"), [(2, 1, 1), (16, 2, 7), (4, 8, 1), (64, 8, 7)])
def test_loader_cores_leave_the_training_process_its_core(
    cpus: int, ranks: int, cores: int
) -> None:
    assert loader_cores(cpus, ranks) == cores


# ------------------------------------------------------------------ checked in real fits
def _warnings(profiler: DataPipelineProfiler) -> list[str]:
    return [f.id for f in profiler.doctor_findings() if f.severity != "info"]


@pytest.mark.slow
def test_a_cached_run_is_judged_once_the_cache_is_warm(tmp_path: Path) -> None:
    """Issue 29's second case: a slow cold fetch behind CachedDataset, 2 persistent workers."""
    with CachedDataset(pm.ColdDataset(160, 0.02), max_bytes=1 << 20) as cached:
        loader = DataLoader(
            cached,
            batch_size=8,
            num_workers=2,
            persistent_workers=True,
            multiprocessing_context="fork",
        )
        profiler = DataPipelineProfiler(probe="start", probe_batches=2, model_steps=2)
        _fit(tmp_path, pm.StepModel(loader, step_sleep=0.03), profiler, max_epochs=4)
    assert [e.epoch for e in profiler.epochs] == [0, 1, 2, 3]
    assert profiler.epochs[0].filling
    assert not any(e.filling for e in profiler.epochs[1:])
    check = profiler.run_check
    assert check is not None
    assert check.filling_bound == "data"
    v = profiler.verdict
    assert v is not None
    assert v.bound == "model"
    assert v.loader_samples_per_sec is not None
    assert v.model_samples_per_sec is not None
    assert v.loader_samples_per_sec > 2 * v.model_samples_per_sec  # warm reads are cheap
    message = profiler.verdict_message() or ""
    assert message.startswith("epoch 1: data-bound while the cache fills (")
    assert "; from epoch 2: model-bound" in message
    assert "probe at fit start, cold cache: loader" in message  # the probe read a cold cache
    assert _warnings(profiler) == []
    figures = profiler.doctor_figures()
    assert [e["cache_hit_rate"] for e in figures["run_epochs"][1:]] == [1.0, 1.0, 1.0]
    fix = next(f.fix for f in profiler.doctor_findings() if f.id == "model-bound")
    assert fix is not None
    assert "CachedDataset.fill()" in fix


@pytest.mark.slow
def test_a_cpu_bound_fetch_is_never_given_more_workers_than_cores(tmp_path: Path) -> None:
    loader = DataLoader(pm.ColdDataset(48, 0.01, spin=True), batch_size=8)
    profiler = DataPipelineProfiler(probe="start", probe_batches=2, model_steps=2)
    _fit(tmp_path, pm.StepModel(loader), profiler, max_epochs=2)
    v = profiler.verdict
    assert v is not None
    assert v.bound == "data"  # planted: 10 ms of CPU a sample against a linear layer
    cores = loader_cores(cpu_count(), 1)
    assert v.workers_needed is not None
    assert v.workers_needed <= cores
    assert v.cores == cores
    assert v.cpu_share is None or v.cpu_share > 0.5  # computed or waited for a core
    finding = next(f for f in profiler.doctor_findings() if f.id == "data-bound")
    assert finding.severity == "error"  # the run waited for data more than half its time
    assert "CachedDataset" in (finding.fix or "")
    assert "cannot close it with workers" in finding.message


def test_a_sleeping_fetch_may_use_more_workers_than_cores(tmp_path: Path) -> None:
    loader = DataLoader(pm.ColdDataset(48, 0.01), batch_size=8)
    profiler = DataPipelineProfiler(probe="start", probe_batches=2, model_steps=2)
    _fit(tmp_path, pm.StepModel(loader), profiler, max_epochs=2)
    v = profiler.verdict
    assert v is not None
    assert v.bound == "data"
    assert v.workers_needed is not None
    assert v.workers_needed > loader_cores(cpu_count(), 1)
    assert v.cpu_share is not None
    assert v.cpu_share < 0.5
    assert "the fetch waits" in (profiler.verdict_message() or "")


def test_a_cached_stream_is_judged_on_its_warm_passes(tmp_path: Path) -> None:
    from tests.data_xray.pipeline_models import SlowStream, new_truth

    with CachedStream(SlowStream(new_truth(), n=64), max_bytes=1 << 20) as stream:
        loader = DataLoader(stream, batch_size=8)
        profiler = DataPipelineProfiler(probe="start", probe_batches=2, model_steps=2)
        _fit(tmp_path, pm.StepModel(loader, step_sleep=0.03), profiler, max_epochs=3)
    assert profiler.not_measured is not None  # never read aside from the fit
    assert [e.filling for e in profiler.epochs] == [True, False, False]
    check = profiler.run_check
    assert check is not None
    assert check.filling_bound == "data"  # 6 ms a sample, 0 workers, while it fills
    assert profiler.verdict is not None
    assert profiler.verdict.bound == "model"
    assert (profiler.verdict_message() or "").startswith("epoch 1: data-bound while the cache")


def test_reloaded_loaders_keep_the_data_wait_of_every_epoch(tmp_path: Path) -> None:
    def build() -> DataLoader[Any]:
        return DataLoader(pm.ColdDataset(32, 0.01), batch_size=8)

    model = pm.StepModel(build)
    profiler = DataPipelineProfiler(probe="off")
    _fit(tmp_path, model, profiler, max_epochs=3, reload_dataloaders_every_n_epochs=1)
    assert model.loaders_built == 3
    assert [e.epoch for e in profiler.epochs] == [0, 1, 2]
    for e in profiler.epochs:  # each epoch's own loader, its 4 fetches of 80 ms waited for
        assert e.samples == 32
        assert e.wait_fraction > 0.5
    assert profiler.verdict is not None
    assert profiler.verdict.bound == "data"  # no probe: the run alone says it


def _ddp_rank_figures(tmp_dir: str) -> dict[str, Any]:
    import pytorch_lightning as pl

    loader = DataLoader(pm.ColdDataset(64, 0.0), batch_size=8)
    profiler = DataPipelineProfiler(probe="start", probe_batches=2, model_steps=2)
    trainer = pl.Trainer(
        **quiet_trainer_kwargs(
            Path(tmp_dir),
            max_epochs=2,
            accelerator="cpu",
            devices=2,
            strategy="ddp",
            callbacks=[profiler],
        )
    )
    trainer.fit(pm.StepModel(loader, step_sleep=0.02))
    v = profiler.verdict
    assert v is not None
    return {
        "bound": v.bound,
        "model": v.model_samples_per_sec,
        "loader": v.loader_samples_per_sec,
        "rates": [e.rate for e in profiler.epochs],
        "model_rates": [e.model_rate for e in profiler.epochs],
    }


@pytest.mark.slow
def test_under_ddp_each_ranks_ceilings_agree_with_its_own_rate(tmp_path: Path) -> None:
    ranks = run_ddp(_ddp_rank_figures, str(tmp_path), world_size=2, timeout=300.0)
    for figures in ranks:
        assert figures["bound"] == "model"  # 20 ms a step, the data in memory
        steady = sum(figures["rates"]) / len(figures["rates"])
        assert figures["model"] >= steady  # never below what this rank's steps achieved
        assert figures["model"] <= 1.05 * max(figures["model_rates"])  # nor above its pace
        assert figures["loader"] >= figures["model"]


@pytest.mark.slow
def test_manual_optimization_gets_a_measured_verdict_and_its_fit_is_unchanged(
    tmp_path: Path,
) -> None:
    """Lightning's GAN pattern: the model ceiling is measured, not "unknown", and the trial
    steps leave both optimizers and every parameter as they were."""
    import torch
    from pytorch_lightning import seed_everything

    def fit(profiler: DataPipelineProfiler | None) -> list[torch.Tensor]:
        seed_everything(0)
        model = pm.TwoOptimizerGAN()
        callbacks = [profiler] if profiler is not None else []
        _fit(tmp_path, model, profiler, max_epochs=2, callbacks=callbacks)  # type: ignore[arg-type]
        return [p.detach().clone() for p in model.parameters()]

    profiler = DataPipelineProfiler(probe="start", probe_batches=2, model_steps=2)
    with_profiler = fit(profiler)
    without = fit(None)
    assert all(torch.equal(a, b) for a, b in zip(with_profiler, without, strict=True))
    assert profiler.model_ceiling is not None
    assert profiler.trial_steps == 3
    assert profiler.verdict is not None
    assert profiler.verdict.bound in ("data", "model")
    assert not (profiler.verdict_message() or "").startswith("unknown")


def test_zero_workers_waiting_a_third_of_the_time_are_told_one_worker() -> None:
    """Fetch 3 ms and step 7 ms a batch, in turn: the loader alone outpaces the model, yet the
    step waits 30% of the time; one worker would overlap the two (not a handover problem)."""
    epochs = [epoch(k, 100, 0.3, per_process=333, processes=1, cpu_share=0.9) for k in range(3)]
    checked = check_verdict(None, epochs, cores=1, workers=0, cached=False)
    assert checked is not None
    v = checked.verdict
    assert v.bound == "data"
    assert v.transfer_note is None
    assert v.workers_needed == 1
    assert v.loader_samples_per_sec == 100
    assert "about 1 worker at the measured 333 samples/s" in v.message
