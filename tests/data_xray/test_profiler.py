"""DataPipelineProfiler: per-stage accounting against what the workers really spent."""

from __future__ import annotations

import csv
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from pytorch_lightning import Callback, Trainer

from lightning_speedpack.core import stages
from lightning_speedpack.core.registry import registered_diagnostics
from lightning_speedpack.data_xray.profiler import DataPipelineProfiler
from tests.data_xray import pipeline_models as pm
from tests.data_xray.pipeline_models import fit as _fit
from tests.helpers.loggers import MemoryLogger
from tests.helpers.models import quiet_trainer_kwargs
from tests.helpers.namespaces import Namespace, each_namespace

TOLERANCE = 0.15

# Lightning's hint for spawn workers that are not persistent (the test wants both kinds).
pytestmark = pytest.mark.filterwarnings("ignore:.*Consider setting `persistent_workers=True`")


def _truth_ms(truth: torch.Tensor, total: int, count: int) -> float:
    return 1000.0 * float(truth[:, total].sum()) / float(truth[:, count].sum())


@pytest.mark.parametrize(
    ("workers", "context", "persistent"),
    [(0, None, False), (2, "fork", False), (2, "spawn", False), (2, "fork", True)],
    ids=["0-workers", "fork", "spawn", "fork-persistent"],
)
@pytest.mark.slow
def test_stages_are_reported_as_measured_inside_the_workers(
    tmp_path: Path, workers: int, context: str | None, persistent: bool
) -> None:
    truth = pm.new_truth()
    model = pm.PipelineModel(truth, workers, context, persistent)
    profiler = DataPipelineProfiler(probe="off")
    _fit(tmp_path, model, profiler, max_epochs=2)
    figures = profiler.doctor_figures()
    assert figures["batches"] == 12
    expected = {
        "fetch_ms": _truth_ms(truth, pm.FETCH, pm.FETCH_N),
        "stage_decode_ms": _truth_ms(truth, pm.STAGE, pm.STAGE_N),
        "collate_ms": _truth_ms(truth, pm.COLLATE, pm.COLLATE_N),
    }
    for key, want in expected.items():
        assert figures[key] == pytest.approx(want, rel=TOLERANCE), key
    assert profiler.totals.samples == 96
    assert 0.0 < figures["worker_busy_fraction"] <= 1.0
    if workers:
        assert figures["queue_wait_ms"] >= 0.0
    assert not stages.active()


def test_a_stream_is_timed_per_next(tmp_path: Path) -> None:
    truth = pm.new_truth()
    model = pm.PipelineModel(truth, workers=2, context="fork", stream=True)
    profiler = DataPipelineProfiler(probe="off")
    _fit(tmp_path, model, profiler)
    figures = profiler.doctor_figures()
    assert profiler.totals.samples == 48
    assert figures["fetch_ms"] == pytest.approx(
        _truth_ms(truth, pm.FETCH, pm.FETCH_N), rel=TOLERANCE
    )


@pytest.mark.slow
def test_batches_are_unchanged_and_the_loader_is_given_back(tmp_path: Path) -> None:
    plain = pm.PipelineModel(pm.new_truth(), workers=2, context="fork")
    _fit(tmp_path, plain, DataPipelineProfiler(probe="off"), callbacks=[])
    profiled = pm.PipelineModel(pm.new_truth(), workers=2, context="fork")
    trainer = _fit(tmp_path, profiled, DataPipelineProfiler(probe="start", probe_batches=2))
    seen = profiled.seen[-len(plain.seen) :]  # the model ceiling's steps come first
    assert seen == plain.seen
    loader = trainer.train_dataloader
    assert isinstance(loader.collate_fn, pm.SlowCollate)
    assert loader.worker_init_fn is None
    assert type(loader.dataset) is pm.SlowDataset
    assert "process_dataloader" not in vars(trainer.strategy)


def test_keys_are_logged_at_the_global_step(tmp_path: Path) -> None:
    logger = MemoryLogger()
    model = pm.PipelineModel(pm.new_truth(), workers=0)
    profiler = DataPipelineProfiler(
        probe="start", probe_batches=2, model_steps=2, log_every_n_steps=2
    )
    _fit(tmp_path, model, profiler, logger=logger)
    steps = [step for step, m in logger.rows if "data/fetch_ms" in m]
    assert steps == [2, 4, 6]
    keys = set().union(*(m for _, m in logger.rows))
    assert {
        "data/fetch_ms",
        "data/collate_ms",
        "data/stage/decode_ms",
        "data/worker_busy_fraction",
        "data/loader_ceiling_samples_per_sec",
        "data/model_ceiling_samples_per_sec",
    } <= keys
    ceiling_steps = [s for s, m in logger.rows if "data/loader_ceiling_samples_per_sec" in m]
    assert ceiling_steps == [0]


def test_probes_leave_state_bit_identical(tmp_path: Path) -> None:
    class Watch(Callback):
        def __init__(self) -> None:
            self.states: list[Any] = []

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self.states.append(
                (
                    [p.detach().clone() for p in pl_module.parameters()],
                    pickle.dumps(trainer.optimizers[0].state_dict()),
                    torch.get_rng_state().clone(),
                )
            )

    before, after = Watch(), Watch()
    profiler = DataPipelineProfiler(probe="start", probe_batches=2, model_steps=3)
    model = pm.PipelineModel(pm.new_truth(), workers=0)
    _fit(tmp_path, model, profiler, max_steps=1, callbacks=[before, profiler, after])
    (p0, o0, r0), (p1, o1, r1) = before.states[0], after.states[0]
    assert all(torch.equal(a, b) for a, b in zip(p0, p1, strict=True))
    assert o0 == o1
    assert torch.equal(r0, r1)
    assert profiler.model_ceiling is not None


def test_verdict_and_findings(tmp_path: Path) -> None:
    model = pm.PipelineModel(pm.new_truth(), workers=0)
    profiler = DataPipelineProfiler(probe="start", probe_batches=2, model_steps=2)
    _fit(tmp_path, model, profiler)
    findings = {f.id: f for f in profiler.doctor_findings()}
    assert "decode" in findings["data-pipeline"].message
    bound = findings["data-bound"]
    assert bound.message.startswith("data-bound: the loader delivers")
    assert bound.figures["workers_needed"] >= 2
    assert profiler.doctor_figures()["verdict"] == bound.message


def test_verdict_reaches_the_wandb_summary(tmp_path: Path, wandb_offline: Any) -> None:
    import wandb
    from pytorch_lightning.loggers import WandbLogger

    logger = WandbLogger(project="data", save_dir=str(wandb_offline.dir), offline=True)
    profiler = DataPipelineProfiler(probe="start", probe_batches=2, model_steps=2)
    _fit(tmp_path, pm.PipelineModel(pm.new_truth()), profiler, logger=logger)
    wandb.finish()
    run = wandb_offline.only_run()
    assert run.summary["data/verdict"].startswith("data-bound")
    assert run.summary["data/loader_ceiling_samples_per_sec"] == pytest.approx(
        profiler.loader_ceiling
    )
    assert "data/model_ceiling_samples_per_sec" in run.summary
    assert "data/fetch_ms" in set(run.keys())


def test_registered_with_the_doctor_and_picklable() -> None:
    names = {d.name: d for d in registered_diagnostics()}
    assert names["data"].callback_type is DataPipelineProfiler
    profiler = pickle.loads(pickle.dumps(DataPipelineProfiler()))
    assert profiler.probe == "start"


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"probe": "end"}, ValueError),
        ({"probe_batches": 0}, ValueError),
        ({"model_steps": True}, ValueError),
        ({"log_every_n_steps": -1}, ValueError),
        ({"prefix": 3}, TypeError),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        DataPipelineProfiler(**kwargs)


@each_namespace
def test_workers_are_timed_and_logged_in_either_namespace(ns: Namespace, tmp_path: Path) -> None:
    truth = pm.new_truth()

    class Model(ns.LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return (self.layer(x).squeeze(-1) - y).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self) -> torch.utils.data.DataLoader[Any]:
            return torch.utils.data.DataLoader(
                pm.SlowDataset(truth, 48),
                batch_size=8,
                num_workers=2,
                multiprocessing_context="fork",
                collate_fn=pm.SlowCollate(truth),
            )

    logger = ns.sub("loggers").CSVLogger(tmp_path / "logs")
    profiler = DataPipelineProfiler(probe="start", probe_batches=2, model_steps=1)
    kwargs = quiet_trainer_kwargs(tmp_path, max_steps=6, callbacks=[profiler], logger=logger)
    trainer = ns.Trainer(**{**kwargs, "log_every_n_steps": 3})
    trainer.fit(Model())
    with open(Path(logger.log_dir) / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("data/fetch_ms")]
    assert [int(r["step"]) for r in rows] == [3, 6]
    assert all(float(r["data/stage/decode_ms"]) > 0 for r in rows)
    assert profiler.verdict is not None
    assert profiler.verdict.bound == "data"  # 14 ms a sample against a linear layer
    assert profiler.doctor_figures()["fetch_ms"] == pytest.approx(
        _truth_ms(truth, pm.FETCH, pm.FETCH_N), rel=TOLERANCE
    )
    assert type(trainer.train_dataloader.dataset) is pm.SlowDataset  # given back


class MetricModel(pm.PipelineModel):
    """Accumulates a torchmetrics metric in the step and logs it once per epoch."""

    def __init__(self, truth: torch.Tensor, stream: bool) -> None:
        super().__init__(truth, stream=stream)
        import torchmetrics

        self.mean_y = torchmetrics.MeanMetric()
        self.calls = 0

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.calls += 1
        _x, y = batch
        self.mean_y(y)
        self.log("mean_y", self.mean_y, on_step=False, on_epoch=True)
        self.log("step_y", y.sum(), on_step=True)
        return super().training_step(batch, batch_idx)


def _csv_rows(tmp_path: Path, name: str, stream: bool, probe: str) -> tuple[list[dict], Any]:
    from pytorch_lightning.loggers import CSVLogger

    model = MetricModel(pm.new_truth(), stream=stream)
    profiler = DataPipelineProfiler(probe=probe, probe_batches=2, model_steps=2)  # type: ignore[arg-type]
    kwargs = quiet_trainer_kwargs(tmp_path, max_epochs=2, log_every_n_steps=1)
    kwargs.update(callbacks=[profiler], logger=CSVLogger(tmp_path, name=name))
    Trainer(**kwargs).fit(model)
    path = next((tmp_path / name).rglob("metrics.csv"))
    with path.open() as f:
        rows = [
            {k: v for k, v in r.items() if v and not k.startswith("data/")}
            for r in csv.DictReader(f)
        ]
    return [r for r in rows if set(r) - {"step", "epoch"}], (model, profiler)


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True], ids=["map-style", "stream"])
def test_no_value_from_a_trial_step_reaches_the_loggers(tmp_path: Path, stream: bool) -> None:
    """The model-ceiling probe runs the user's training_step: what the fit logs (per step and
    the epoch's torchmetrics value) is the same as without it, and the report says so."""
    plain, (plain_model, _) = _csv_rows(tmp_path, "plain", stream, "off")
    probed, (model, profiler) = _csv_rows(tmp_path, "probed", stream, "start")
    assert probed == plain
    assert profiler.trial_steps == 3  # one warm-up and two timed steps
    assert model.calls == plain_model.calls + profiler.trial_steps
    # The trial steps ran first (on a probe batch, or on the fit's first batch for a stream);
    # the fit's own steps then saw the same batches, in the same order.
    assert model.seen[profiler.trial_steps :] == plain_model.seen
    ids = {f.id for f in profiler.doctor_findings()}
    assert "trial-steps" in ids
    assert ("loader-ceiling-from-the-fit" in ids) is stream
    assert profiler.doctor_figures()["bound"] in ("data", "model")
