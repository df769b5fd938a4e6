"""Under ``speedpack doctor``: the issue's planted runs get their cause first, and no data-wait."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from lightning_speedpack.doctor.runner import DoctorSession
from tests.helpers.models import quiet_trainer_kwargs
from tests.helpers.namespaces import Namespace, each_namespace
from tests.wall_time.test_callback import NAP, _model

DATA_FINDINGS = {"data-wait", "data-bound", "dataloader-workers"}


def _warnings(report: Any) -> list[str]:
    return [f.id for f in report.findings if f.severity in ("warning", "error")]


@pytest.mark.slow
@each_namespace
def test_a_checkpoint_saved_every_step_is_the_first_warning_and_not_data_wait(
    ns: Namespace, tmp_path: Path
) -> None:
    session = DoctorSession()
    with session.installed():
        checkpoint = ns.ModelCheckpoint(
            dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_top_k=-1
        )
        trainer = ns.Trainer(
            callbacks=[checkpoint],
            **quiet_trainer_kwargs(
                tmp_path,
                max_epochs=2,
                limit_val_batches=0,
                enable_checkpointing=True,
            ),
        )
        start = time.perf_counter()
        trainer.fit(_model(ns.name)(save_nap=3 * NAP, batch_size=16, length=256))
        wall = time.perf_counter() - start
    report = session.report()
    warnings = _warnings(report)
    assert warnings[0] == "checkpoint-time", warnings
    assert not DATA_FINDINGS & set(warnings), warnings
    ledger = report.runs[-1].figures["wall_time"]
    assert abs(ledger["total_s"] - wall) <= 0.02 * wall
    assert ledger["parts"]["checkpoint"] >= 32 * 3 * NAP


@each_namespace
def test_only_the_ledger_is_told_when_fit_starts_and_returns(ns: Namespace, tmp_path: Path) -> None:
    class HasTheSameNames(ns.Callback):  # type: ignore[misc, name-defined]
        def fit_entered(self) -> None:  # another meaning, another signature: never called
            raise AssertionError("the doctor called a user's method")

        fit_returned = fit_entered

    session = DoctorSession()
    with session.installed():
        trainer = ns.Trainer(
            callbacks=[HasTheSameNames()], **quiet_trainer_kwargs(tmp_path, max_steps=2)
        )
        trainer.fit(_model(ns.name)())
    assert session.report().runs[-1].figures["wall_time"]["total_s"] > 0
