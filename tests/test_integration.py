"""Components used together: the observers add no syncs, and the doctor sees every section."""

from __future__ import annotations

from pathlib import Path

import pytest
from pytorch_lightning import Trainer

from lightning_speedpack import LossRetentionDetector, SyncPointWarnings, ThroughputLogger
from tests.helpers import global_state
from tests.helpers.models import TinyCNN, quiet_trainer_kwargs


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
