"""Components used together: the observers add no syncs, and the doctor sees every section."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from pytorch_lightning import Trainer

from lightning_speedpack import (
    BatchSizeTuner,
    LossRetentionDetector,
    RetainedGraphWarning,
    SpeedAdvisor,
    SyncPointWarnings,
    ThroughputLogger,
)
from tests.helpers import global_state, namespaces
from tests.helpers.models import TinyCNN, quiet_trainer_kwargs
from tests.helpers.namespaces import Namespace, each_namespace


@pytest.mark.parametrize("include_cpu", [False, True])
def test_throughput_logger_adds_no_sync_under_strict_sync_detection(
    include_cpu: bool, tmp_path: Path
) -> None:
    """No sync from any pack callback is recorded (error mode would raise on a user one)."""
    before = global_state.snapshot()
    sync = SyncPointWarnings(mode="error", include_cpu=include_cpu)
    throughput = ThroughputLogger(window=2, log_every_n_steps=2)
    trainer = Trainer(
        callbacks=[sync, throughput, LossRetentionDetector(mode="error")],
        **quiet_trainer_kwargs(tmp_path, max_steps=8, log_every_n_steps=2),
    )
    trainer.fit(TinyCNN(n=256))  # would raise SyncPointError on a sync in ThroughputLogger
    assert [f for f in sync.report if f.origin == "user"] == []
    assert [f.location for f in sync.report if "lightning_speedpack" in f.filename] == []
    assert throughput.doctor_figures()["samples_per_sec"] > 0
    assert global_state.diff(before, global_state.snapshot()) == {}


# --- each component's main behaviour, once per Lightning namespace --------------------------


@each_namespace
def test_observers_add_no_sync_in_either_namespace(ns: Namespace, tmp_path: Path) -> None:
    before = namespaces.snapshot()
    sync = SyncPointWarnings(mode="error", include_cpu=True)
    throughput = ThroughputLogger(window=2, log_every_n_steps=2)
    trainer = ns.Trainer(
        callbacks=[sync, throughput, LossRetentionDetector(mode="error")],
        **quiet_trainer_kwargs(tmp_path, max_steps=8, log_every_n_steps=2),
    )
    trainer.fit(ns.SizedBoringModel(length=128))
    assert [f for f in sync.report if f.origin == "user"] == []
    assert [f.location for f in sync.report if "lightning_speedpack" in f.filename] == []
    assert throughput.doctor_figures()["samples_per_sec"] > 0
    assert global_state.diff(before, namespaces.snapshot()) == {}


@each_namespace
def test_a_retained_loss_is_named_in_either_namespace(ns: Namespace, tmp_path: Path) -> None:
    class ListLeak(ns.SizedBoringModel):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.losses: list[torch.Tensor] = []

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            out = super().training_step(batch, batch_idx)
            self.losses.append(out["loss"])
            return out

    detector = LossRetentionDetector(mode="warn")
    trainer = ns.Trainer(callbacks=[detector], **quiet_trainer_kwargs(tmp_path, max_steps=6))
    with pytest.warns(RetainedGraphWarning, match="model.losses"):
        trainer.fit(ListLeak())
    assert [f.id for f in detector.doctor_findings()] == ["retained-graph"]


@each_namespace
def test_the_tuner_and_the_advisor_in_either_namespace(ns: Namespace, tmp_path: Path) -> None:
    tuner = BatchSizeTuner(max_val=32, steps_per_trial=1, verbose=False)
    advisor = SpeedAdvisor(measure_steps=2, verbose=False)
    model = ns.SizedBoringModel(batch_size=7, length=64)
    trainer = ns.Trainer(callbacks=[tuner, advisor], **quiet_trainer_kwargs(tmp_path, max_steps=2))
    trainer.fit(model)
    assert model.batch_size == tuner.batch_size == 32  # found through lightning_setattr
    assert [t.batch_size for t in tuner.trials][:1] == [8]  # from init_val, not the 7 it had
    assert "dataloader-workers" in {f.id for f in advisor.doctor_findings()}


@each_namespace
def test_throughput_reaches_the_namespaces_wandb_logger(
    ns: Namespace, tmp_path: Path, wandb_offline: Any
) -> None:
    import wandb

    logger = ns.sub("loggers").WandbLogger(
        project=f"ns-{ns.id}", save_dir=str(wandb_offline.dir), offline=True
    )
    callback = ThroughputLogger(window=2, log_every_n_steps=2, gpu_stats=False)
    trainer = ns.Trainer(
        callbacks=[callback], **quiet_trainer_kwargs(tmp_path, max_steps=4, logger=logger)
    )
    trainer.fit(ns.SizedBoringModel())
    wandb.finish()
    run = wandb_offline.only_run()
    assert run.values("trainer/global_step") == [2, 4]
    # the define_metric / config / summary path, not only log_metrics
    assert run.metrics["throughput/*"]["step_metric"] == "trainer/global_step"
    assert run.config["throughput_logger"]["window"] == 2
    assert run.summary["throughput/mean_samples_per_sec"] > 0
