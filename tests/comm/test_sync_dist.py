"""The sync_dist recorder: which lines passed ``sync_dist=True`` in training batches, timed.

On one process Lightning reduces nothing, but the recorder reads the arguments, not the world
size: these fits install it by hand to check what it records, line by line.
"""

from __future__ import annotations

import inspect
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from pytorch_lightning import Callback, Trainer
from torchmetrics import MeanMetric

from lightning_speedpack.comm.sync_dist import SyncDistRecorder, install, uninstall
from lightning_speedpack.core import logged_batch_size
from tests.helpers.models import SizedBoringModel, quiet_trainer_kwargs


class Installs(Callback):
    """Installs the recorder for the fit and moves it along, as CommMonitor does."""

    def __init__(self, recorder: SyncDistRecorder) -> None:
        self.recorder = recorder

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        install(pl_module, self.recorder)

    def on_train_batch_start(self, *args: Any) -> None:
        self.recorder.batch_start()

    def on_validation_start(self, *args: Any) -> None:
        self.recorder.pause()

    def on_train_epoch_end(self, *args: Any) -> None:
        self.recorder.pause()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        uninstall(pl_module)


LINES: dict[str, int] = {}


class Logs(SizedBoringModel):
    """Logs with and without sync_dist in the ways a step can; LINES says where."""

    def __init__(self) -> None:
        super().__init__(length=32)  # 4 training batches of 8
        self.metric = MeanMetric()

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        out: Any = super().training_step(batch, batch_idx)
        loss = out["loss"]
        self.log("plain", loss)
        self.log("synced", loss, sync_dist=True)
        LINES["synced"] = inspect.currentframe().f_lineno - 1  # type: ignore[union-attr]
        self.log_dict({"a": loss, "b": 2.0}, sync_dist=True)
        LINES["log_dict"] = inspect.currentframe().f_lineno - 1  # type: ignore[union-attr]
        self.log("per_epoch", loss, sync_dist=True, on_step=False, on_epoch=True)
        self.log("rank0", loss, sync_dist=True, rank_zero_only=True)
        self.metric.update(loss.detach())
        self.log("metric", self.metric, sync_dist=True)
        if batch_idx == 0:
            self.log("once", loss, sync_dist=True)
            LINES["once"] = inspect.currentframe().f_lineno - 1  # type: ignore[union-attr]
        return out

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        out: Any = super().validation_step(batch, batch_idx)
        self.log("val", out["x"], sync_dist=True, on_step=True)
        return out


def _fit(tmp_path: Path, model: Any, *callbacks: Any) -> SyncDistRecorder:
    recorder = SyncDistRecorder()
    trainer = Trainer(
        callbacks=[Installs(recorder), *callbacks],
        **quiet_trainer_kwargs(tmp_path, max_epochs=1, limit_val_batches=2),
    )
    trainer.fit(model)
    return recorder


def test_records_per_step_sync_dist_values_by_the_calling_line(tmp_path: Path) -> None:
    model = Logs()
    recorder = _fit(tmp_path, model)
    here = str(Path(__file__))
    sites = {(Path(f).name, line): (s.calls, s.steps) for (f, line), s in recorder.sites.items()}
    assert {f for f, _ in recorder.sites} == {here}
    assert sites == {
        ("test_sync_dist.py", LINES["synced"]): (4, 4),  # one value in each of 4 steps
        ("test_sync_dist.py", LINES["log_dict"]): (8, 4),  # two values, at log_dict's caller
        ("test_sync_dist.py", LINES["once"]): (1, 1),
    }  # not: on_step=False, rank_zero_only, a Metric object, plain logs, validation
    assert recorder.steps == 4
    assert all(s.seconds > 0 for s in recorder.sites.values())
    site = recorder.sites[(here, LINES["synced"])]
    assert site.location == f"tests/comm/test_sync_dist.py:{LINES['synced']}"
    assert site.code() == 'self.log("synced", loss, sync_dist=True)'
    # The wrappers are gone and the module works (and pickles) as before.
    assert "log" not in vars(model)
    assert "log_dict" not in vars(model)
    pickle.loads(pickle.dumps(model))


def test_positional_sync_dist_is_seen_too() -> None:
    recorder = SyncDistRecorder()
    calls: list[tuple[Any, ...]] = []

    class Module:
        def log(
            self,
            name: str,
            value: Any,
            prog_bar: bool = False,
            logger: Any = None,
            on_step: Any = None,
            on_epoch: Any = None,
            reduce_fx: str = "mean",
            enable_graph: bool = False,
            sync_dist: bool = False,
        ) -> None:
            calls.append((name, sync_dist))

    module = Module()
    install(module, recorder)
    recorder.batch_start()
    module.log("x", 1.0, False, None, None, None, "mean", False, True)
    module.log("y", 1.0)
    uninstall(module)
    assert calls == [("x", True), ("y", False)]
    assert [s.calls for s in recorder.sites.values()] == [1]
    assert vars(module) == {}


def test_outside_training_batches_nothing_is_recorded() -> None:
    recorder = SyncDistRecorder()
    model = SizedBoringModel()
    seen: list[Any] = []
    object.__setattr__(model, "log", lambda *a, **k: seen.append(k))
    install(model, recorder)
    model.log("x", torch.tensor(1.0), sync_dist=True)  # no batch started: not recorded
    recorder.batch_start()
    recorder.pause()
    model.log("x", torch.tensor(1.0), sync_dist=True)
    uninstall(model)
    assert recorder.sites == {}
    assert len(seen) == 2  # both reached the real method
    assert callable(vars(model)["log"])  # what was there before is put back


class ReadsBatchSize(Callback):
    """Uses the batch-size reader the way ThroughputLogger does, around the recorder."""

    def __init__(self) -> None:
        self.sizes: list[int | None] = []
        self.logged: Any = None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.logged = logged_batch_size.watch(pl_module)

    def on_train_batch_end(self, *args: Any) -> None:
        self.sizes.append(self.logged())

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        logged_batch_size.unwatch(pl_module)


class LogsBatchSize(SizedBoringModel):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        out: Any = super().training_step(batch, batch_idx)
        self.log("loss", out["loss"], sync_dist=True, batch_size=5)
        return out


@pytest.mark.parametrize("reader_first", [True, False])
def test_the_batch_size_reader_still_reads_and_both_let_go(
    tmp_path: Path, reader_first: bool
) -> None:
    reader = ReadsBatchSize()
    recorder = SyncDistRecorder()
    callbacks = [reader, Installs(recorder)] if reader_first else [Installs(recorder), reader]
    model = LogsBatchSize(length=16)
    trainer = Trainer(callbacks=callbacks, **quiet_trainer_kwargs(tmp_path, limit_val_batches=0))
    trainer.fit(model)
    assert reader.sizes == [5, 5]
    assert [s.calls for s in recorder.sites.values()] == [2]
    assert "log" not in vars(model)
    assert "log_dict" not in vars(model)
    assert model not in logged_batch_size._WATCHED


def test_installing_twice_wraps_once() -> None:
    model = SizedBoringModel()
    recorder = SyncDistRecorder()
    install(model, recorder)
    inner = vars(model)["log"].inner
    install(model, recorder)
    assert vars(model)["log"].inner is inner
    uninstall(model)
    uninstall(model)  # idempotent
    assert "log" not in vars(model)
    assert model not in logged_batch_size._WATCHED
