"""``throughput/data_wait_ms`` is the time inside the DataLoader's fetch and nothing else (#26).

The wait used to be the gap between two of the logger's own batch hooks, so whatever ran in
that gap (another callback's slow ``on_train_batch_end``, a checkpoint saved every step) read as
"waits for data". These tests plant known delays and compare the figures with the delays, never
with a fixed wall-clock limit: a sleep lasts at least what it asks for, so a figure that must
hold a delay is at least that delay, and a figure that must not hold it stays far below it.
Every Trainer test runs in both Lightning namespaces (``each_namespace``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from lightning_speedpack import ThroughputLogger
from lightning_speedpack.core import profiler_tap
from lightning_speedpack.core.profiler_tap import TRAIN_FETCH as FETCH_ACTION_SUFFIX
from lightning_speedpack.core.profiler_tap import FetchTimer
from lightning_speedpack.throughput.rates import StepClock, StepRecord
from tests.helpers.models import quiet_trainer_kwargs
from tests.helpers.namespaces import Namespace, each_namespace
from tests.throughput.test_callback import SleepyDataset as Items  # a slow decode

P = "throughput/"
STEPS = 6
BATCH = 4
PLANTED_S = 0.03  # each planted delay: a slow user hook, a slow checkpoint save
ITEM_S = 0.005  # a slow dataset's __getitem__
FETCH_MS = 1000.0 * BATCH * ITEM_S  # the least one fetch of a slow dataset takes


class Stream(IterableDataset[torch.Tensor]):
    """The same vectors with no length: Lightning prefetches one batch ahead."""

    def __init__(self, n: int = 64, delay: float = 0.0) -> None:
        self.items = Items(n, delay)

    def __iter__(self) -> Any:
        return (self.items[i] for i in range(len(self.items)))


def _model(
    ns: Namespace,
    train: Dataset[torch.Tensor],
    val: Dataset[torch.Tensor] | None = None,
    save_delay: float = 0.0,
    fail_at: int | None = None,
) -> Any:
    """A BoringModel of ``ns`` on ``train``, a slow checkpoint save, and a planted failure."""

    class Model(ns.BoringModel):  # type: ignore[name-defined,misc]
        def train_dataloader(self) -> DataLoader[torch.Tensor]:
            return DataLoader(train, batch_size=BATCH)

        def val_dataloader(self) -> DataLoader[torch.Tensor]:
            return DataLoader(val if val is not None else Items(8), batch_size=BATCH)

        def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            time.sleep(save_delay)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if batch_idx == fail_at:
                raise RuntimeError("planted failure")
            return super().training_step(batch, batch_idx)

    return Model()


def _slow_batch_end(ns: Namespace, delay: float) -> Any:
    """A user callback whose ``on_train_batch_end`` sleeps ``delay`` seconds."""

    class SlowBatchEnd(ns.Callback):  # type: ignore[name-defined,misc]
        def on_train_batch_end(self, *args: Any) -> None:
            time.sleep(delay)

    return SlowBatchEnd()


def _hook_gaps(ns: Namespace) -> Any:
    """The former measure: the gaps from a batch's end hook to the next batch's start hook."""

    class HookGaps(ns.Callback):  # type: ignore[name-defined,misc]
        def __init__(self) -> None:
            self.ended: float | None = None
            self.gaps_ms: list[float] = []

        def on_train_batch_start(self, *args: Any) -> None:
            if self.ended is not None:
                self.gaps_ms.append(1000.0 * (time.perf_counter() - self.ended))

        def on_train_batch_end(self, *args: Any) -> None:
            self.ended = time.perf_counter()

    return HookGaps()


def _logger() -> ThroughputLogger:
    # One window over the whole run, logged once at its last step.
    return ThroughputLogger(window=STEPS, log_every_n_steps=STEPS, gpu_stats=False)


def _fit(ns: Namespace, tmp_path: Path, model: Any, callbacks: list[Any], **kwargs: Any) -> Any:
    kwargs = {"max_steps": STEPS, "limit_val_batches": 0, **kwargs}
    trainer = ns.Trainer(callbacks=callbacks, **quiet_trainer_kwargs(tmp_path, **kwargs))
    trainer.fit(model)
    return trainer


# ---- the planted test of issue #26 ----------------------------------------------------------


@each_namespace
def test_other_callbacks_and_checkpoints_do_not_move_data_wait(
    ns: Namespace, tmp_path: Path
) -> None:
    plain = _logger()
    _fit(ns, tmp_path / "plain", _model(ns, Items()), [plain])

    planted, gaps = _logger(), _hook_gaps(ns)
    checkpoint = ns.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_top_k=-1)
    # The slow callback comes after the logger, and Lightning runs ModelCheckpoint last: both
    # run after the logger's batch end, in what used to be measured as the wait.
    callbacks = [gaps, planted, _slow_batch_end(ns, PLANTED_S), checkpoint]
    model = _model(ns, Items(), save_delay=PLANTED_S)
    _fit(ns, tmp_path / "planted", model, callbacks, enable_checkpointing=True)

    planted_ms = 2 * 1000.0 * PLANTED_S
    assert len(list((tmp_path / "ckpt").glob("*.ckpt"))) == STEPS  # saved every step
    # What the gap between two batch hooks read: every gap holds both planted delays.
    assert len(gaps.gaps_ms) == STEPS - 1
    assert min(gaps.gaps_ms) >= planted_ms
    # Every step but the first (timed from the epoch's start) holds them in its step time...
    metrics, before = planted.last_metrics, plain.last_metrics
    assert metrics[f"{P}step_time_ms"] >= planted_ms * (STEPS - 1) / STEPS
    # ... and none of it is data wait.
    assert metrics[f"{P}data_wait_ms"] < 0.25 * planted_ms
    assert abs(metrics[f"{P}data_wait_ms"] - before[f"{P}data_wait_ms"]) < 0.25 * planted_ms
    assert metrics[f"{P}data_wait_fraction"] < 0.25
    assert planted.doctor_findings() == []


# ---- a slow loader still shows -------------------------------------------------------------


@each_namespace
@pytest.mark.parametrize("dataset", [Items, Stream], ids=["sized", "iterable"])
def test_a_slow_dataloader_still_shows_its_wait(
    ns: Namespace, tmp_path: Path, dataset: type[Dataset[torch.Tensor]]
) -> None:
    callback = _logger()
    _fit(ns, tmp_path, _model(ns, dataset(64, ITEM_S)), [callback])
    metrics = callback.last_metrics
    # Every step fetched one batch of BATCH sleeping items (with a stream, the next step's
    # batch, prefetched inside this step's fetch).
    assert metrics[f"{P}data_wait_ms"] >= FETCH_MS
    assert metrics[f"{P}data_wait_ms"] <= metrics[f"{P}step_time_ms"]
    assert callback.doctor_figures()["data_wait_fraction"] == pytest.approx(
        metrics[f"{P}data_wait_fraction"]
    )
    assert [f.id for f in callback.doctor_findings()] == ["data-wait"]


@each_namespace
def test_validation_fetches_are_not_training_data_wait(ns: Namespace, tmp_path: Path) -> None:
    callback = _logger()
    slow_val = Items(2 * BATCH, ITEM_S)  # two batches, each FETCH_MS at least
    model = _model(ns, Items(), val=slow_val)
    trainer = _fit(
        ns,
        tmp_path,
        model,
        [callback],
        val_check_interval=STEPS // 2,
        limit_val_batches=2,
        num_sanity_val_steps=2,
    )
    assert trainer.fit_loop.epoch_loop.val_loop.batch_progress.total.completed >= 2
    assert callback.last_metrics[f"{P}data_wait_ms"] < 0.25 * FETCH_MS


# ---- the tap: there during the fit, gone after it, the user's profiler intact ---------------


def _tap_probe(ns: Namespace) -> Any:
    class TapProbe(ns.Callback):  # type: ignore[name-defined,misc]
        def __init__(self) -> None:
            self.tapped: list[bool] = []

        def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
            self.tapped.append("start" in vars(trainer.profiler))

    return TapProbe()


@each_namespace
def test_the_tap_is_removed_after_fit(ns: Namespace, tmp_path: Path) -> None:
    probe = _tap_probe(ns)
    trainer = _fit(ns, tmp_path, _model(ns, Items()), [_logger(), probe])
    assert probe.tapped == [True] * STEPS
    assert "start" not in vars(trainer.profiler)
    assert "stop" not in vars(trainer.profiler)
    assert id(trainer.profiler) not in profiler_tap._TAPS


@each_namespace
def test_the_tap_is_removed_after_an_exception(ns: Namespace, tmp_path: Path) -> None:
    probe = _tap_probe(ns)
    trainer = ns.Trainer(
        callbacks=[_logger(), probe],
        **quiet_trainer_kwargs(tmp_path, max_steps=STEPS, limit_val_batches=0),
    )
    with pytest.raises(RuntimeError, match="planted failure"):
        trainer.fit(_model(ns, Items(), fail_at=2))
    assert probe.tapped == [True] * 3
    assert "start" not in vars(trainer.profiler)
    assert "stop" not in vars(trainer.profiler)
    assert id(trainer.profiler) not in profiler_tap._TAPS


@each_namespace
def test_a_users_simple_profiler_still_records_and_the_wait_is_timed(
    ns: Namespace, tmp_path: Path
) -> None:
    callback = _logger()
    trainer = _fit(ns, tmp_path, _model(ns, Items(64, ITEM_S)), [callback], profiler="simple")
    assert type(trainer.profiler).__name__ == "SimpleProfiler"
    fetches = {
        name: durations
        for name, durations in trainer.profiler.recorded_durations.items()
        if name.endswith(FETCH_ACTION_SUFFIX)
    }
    assert list(fetches) == ["[_TrainingEpochLoop].train_dataloader_next"]
    durations = fetches["[_TrainingEpochLoop].train_dataloader_next"]
    assert len(durations) == STEPS
    assert min(durations) >= BATCH * ITEM_S
    # Its own hooks are recorded too, and nothing of the tap is left on it.
    assert any(name.startswith("[Callback]") for name in trainer.profiler.recorded_durations)
    assert "start" not in vars(trainer.profiler)
    assert callback.last_metrics[f"{P}data_wait_ms"] >= FETCH_MS


# ---- the listener alone -------------------------------------------------------------------


def test_fetch_timer_times_training_fetches_only() -> None:
    clock = StepClock(window=4)
    clock.epoch_start(0.0)
    timer = FetchTimer(clock.add_wait)
    timer.on_action("[MyLoop].train_dataloader_next", False, 0.5)  # its start came before the tap
    timer.on_action("[_TrainingEpochLoop].train_dataloader_next", True, 1.0)
    timer.on_action("[Callback]ModelCheckpoint.on_train_batch_end", True, 1.25)
    timer.on_action("[Callback]ModelCheckpoint.on_train_batch_end", False, 1.5)
    timer.on_action("[_TrainingEpochLoop].train_dataloader_next", False, 2.0)
    timer.on_action("[_EvaluationLoop].val_next", True, 2.0)
    timer.on_action("[_EvaluationLoop].val_next", False, 3.0)
    timer.on_action("[MyLoop].train_dataloader_next", True, 3.0)  # another loop class name
    timer.on_action("[MyLoop].train_dataloader_next", False, 3.5)
    clock.batch_start()
    assert clock.batch_end(4.0, samples=1) == StepRecord(seconds=4.0, samples=1, data_wait=1.5)
