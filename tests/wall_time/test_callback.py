"""WallTimeLedger on real fits: planted slow parts land in their own part and get their finding.

Each planted cause is a ``time.sleep`` of known length, so "charged to X" is checked as "X got
at least the planted seconds, and the part it used to be blamed on got far less": lower bounds
that load on the machine cannot break.
"""

from __future__ import annotations

import csv
import functools
import re
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from lightning_speedpack import WallTimeLedger
from lightning_speedpack.core.tables import TABLES, csv_file_name
from lightning_speedpack.wall_time.ledger import PARTS
from tests.helpers.models import quiet_trainer_kwargs
from tests.helpers.namespaces import NAMESPACE_IDS, Namespace, each_namespace, load

NAP = 0.02  # seconds each planted sleep lasts


@functools.cache
def _model(name: str) -> type[Any]:
    """A SizedBoringModel whose checkpoint saves and validation steps take known time."""
    base = load(name).SizedBoringModel

    class Planted(base):  # type: ignore[misc, valid-type]
        def __init__(
            self, save_nap: float = 0.0, val_nap: float = 0.0, batch_size: int = 8, **kw: Any
        ) -> None:
            super().__init__(batch_size=batch_size, **kw)
            self.save_nap, self.val_nap = save_nap, val_nap

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            out = super().training_step(batch, batch_idx)
            self.log("train_loss", out["loss"])  # what the loggers write
            return out

        def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            time.sleep(self.save_nap)

        def validation_step(self, batch: Any, batch_idx: int) -> Any:
            time.sleep(self.val_nap)
            return super().validation_step(batch, batch_idx)

    Planted.__qualname__ = f"Planted_{NAMESPACE_IDS[name]}"
    return Planted


def _slow_callback(ns: Namespace) -> Any:
    class SlowCallback(ns.Callback):  # type: ignore[misc, name-defined]
        def on_train_batch_end(self, *args: Any) -> None:
            time.sleep(NAP)

    return SlowCallback()


def _fit(ns: Namespace, tmp_path: Path, model: Any, callbacks: list[Any], **kw: Any) -> Any:
    ledger = WallTimeLedger()
    trainer = ns.Trainer(callbacks=[ledger, *callbacks], **quiet_trainer_kwargs(tmp_path, **kw))
    start = time.perf_counter()
    ledger.fit_entered(start)  # as the doctor does
    try:
        trainer.fit(model)
    finally:
        end = time.perf_counter()
        ledger.fit_returned(end)  # as the doctor does
    return ledger, trainer, end - start


def _ids(ledger: WallTimeLedger) -> list[str]:
    return [f.id for f in ledger.doctor_findings() if f.severity == "warning"]


@each_namespace
def test_a_slow_callback_and_slow_checkpoints_are_charged_to_themselves(
    ns: Namespace, tmp_path: Path
) -> None:
    checkpoint = ns.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_top_k=-1)
    ledger, _, wall = _fit(
        ns,
        tmp_path,
        _model(ns.name)(save_nap=NAP),
        [_slow_callback(ns), checkpoint],
        max_steps=8,
        limit_val_batches=0,
        enable_checkpointing=True,
    )
    seconds = ledger.seconds()
    assert ledger.saves == 8
    assert seconds["checkpoint"] >= 8 * NAP
    assert ledger.callback_seconds()["SlowCallback"] >= 8 * NAP
    assert seconds["data_wait"] < 8 * NAP / 4  # neither is blamed on the loader
    assert sum(seconds.values()) == pytest.approx(ledger.total_s)
    assert abs(ledger.total_s - wall) <= 0.02 * wall  # the whole fit, within 2%
    # ... because it ran exactly from `fit` entered to `fit` returned, as the doctor tells it
    assert ledger.ledger.ended is not None
    assert ledger.ledger.started is not None
    assert ledger.ledger.ended - ledger.ledger.started == pytest.approx(wall)
    findings = {f.id: f for f in ledger.doctor_findings()}
    assert findings["callback-time"].figures["callback"] == "SlowCallback"
    assert "on_train_batch_end" in findings["callback-time"].message
    assert "every_n_train_steps=1" in (findings["checkpoint-time"].fix or "")
    # A save of ~20 ms reads in ms, not "0.02 s" (and a total under 0.1 s not "0.0 s").
    assert re.search(r", 8 saves, \d+\.\d ms each\)$", findings["checkpoint-time"].message)
    shares = [f.figures["wall_fraction"] for f in ledger.doctor_findings()]
    assert shares == sorted(shares, reverse=True)  # largest share first


@each_namespace
def test_validation_is_charged_with_its_runs_batches_and_samples(
    ns: Namespace, tmp_path: Path
) -> None:
    ledger, _, _ = _fit(
        ns,
        tmp_path,
        _model(ns.name)(val_nap=NAP, batch_size=4, length=32),
        [],
        max_epochs=1,
        val_check_interval=2,
        limit_val_batches=3,
        num_sanity_val_steps=0,
    )
    runs = ledger.validation_runs
    assert len(runs) == 4  # 8 training batches, validation every 2
    assert [(r.batches, r.samples) for r in runs] == [(3, 12)] * 4
    assert ledger.seconds()["validation"] >= 12 * NAP
    (finding,) = [f for f in ledger.doctor_findings() if f.id == "validation-time"]
    assert finding.figures["runs"] == 4
    assert finding.figures["samples"] == 48
    assert "val_check_interval" in (finding.fix or "")
    assert "now 2" in (finding.fix or "")


def test_the_sanity_check_is_its_own_part(tmp_path: Path) -> None:
    ns = load("pytorch_lightning")
    ledger, _, _ = _fit(
        ns,
        tmp_path,
        _model(ns.name)(val_nap=NAP),
        [],
        limit_train_batches=2,
        limit_val_batches=2,
        num_sanity_val_steps=2,
    )
    assert ledger.seconds()["sanity_check"] >= 2 * NAP
    assert ledger.validation_runs[0].batches > 0  # the end-of-epoch validation, not the check


@each_namespace
def test_a_slow_logger_is_charged_to_logging(ns: Namespace, tmp_path: Path) -> None:
    class SlowLogger(ns.sub("loggers").Logger):  # type: ignore[misc, name-defined]
        name, version = "slow", 0

        @property
        def experiment(self) -> None:
            return None

        def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
            pass

        def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
            time.sleep(NAP)

    class LogsThroughTheLogger(ns.Callback):  # type: ignore[misc, name-defined]
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            trainer.logger.log_metrics({"mine": 1.0}, step=trainer.global_step)

    ledger, _, _ = _fit(
        ns,
        tmp_path,
        _model(ns.name)(),
        [LogsThroughTheLogger()],
        max_steps=8,
        limit_val_batches=0,
        log_every_n_steps=1,
        logger=SlowLogger(),
    )
    # Lightning's 8 writes and the callback's 8 are all logging, none the callback's own time.
    assert ledger.seconds()["logging"] >= 16 * NAP
    assert ledger.callback_seconds().get("LogsThroughTheLogger", 0.0) < 8 * NAP / 4
    (finding,) = [f for f in ledger.doctor_findings() if f.id == "logging-time"]
    assert finding.figures["loggers_s"] >= 16 * NAP
    assert "log_every_n_steps" in (finding.fix or "")


def _sleepy_worker(_: int) -> None:
    time.sleep(0.3)


def _worker_model(ns: Namespace, persistent: bool) -> Any:
    class WorkerModel(_model(ns.name)):  # type: ignore[misc]
        def train_dataloader(self) -> DataLoader[Any]:
            return DataLoader(
                ns.RandomDataset(32, 16),
                batch_size=8,
                num_workers=1,
                persistent_workers=persistent,
                worker_init_fn=_sleepy_worker,
            )

    return WorkerModel()


@each_namespace
@pytest.mark.parametrize("persistent", [False, True], ids=["restarted", "persistent"])
def test_workers_started_again_at_every_epoch_get_the_persistent_workers_fix(
    ns: Namespace, tmp_path: Path, persistent: bool
) -> None:
    ledger, _, _ = _fit(
        ns, tmp_path, _worker_model(ns, persistent), [], max_epochs=3, limit_val_batches=0
    )
    assert len(ledger.epoch_starts) == 3
    starts = ledger.seconds()["epoch_start"]
    if persistent:  # one start only: paid once
        assert "epoch-start-time" not in _ids(ledger)
        return
    assert starts >= 3 * 0.3
    (finding,) = [f for f in ledger.doctor_findings() if f.id == "epoch-start-time"]
    assert finding.severity == "warning"
    assert "persistent_workers=True" in (finding.fix or "")


@pytest.fixture
def many_threads() -> Any:
    saved = torch.get_num_threads()
    torch.set_num_threads(64)
    yield 64
    torch.set_num_threads(saved)


@each_namespace
def test_more_threads_than_cores_is_found(ns: Namespace, tmp_path: Path, many_threads: int) -> None:
    ledger, _, _ = _fit(ns, tmp_path, _model(ns.name)(), [], max_steps=2, limit_val_batches=0)
    (finding,) = [f for f in ledger.doctor_findings() if f.id == "cpu-threads"]
    assert finding.figures["threads"] == many_threads
    assert f"torch.set_num_threads({finding.figures['cores']})" in (finding.fix or "")


@each_namespace
def test_anomaly_detection_a_heavy_profiler_and_a_tiny_batch_are_named(
    ns: Namespace, tmp_path: Path
) -> None:
    ledger, _trainer, _ = _fit(
        ns,
        tmp_path,
        _model(ns.name)(batch_size=2),
        [],
        max_steps=3,
        limit_val_batches=0,
        detect_anomaly=True,
        profiler="advanced",
    )
    findings = {f.id: f for f in ledger.doctor_findings()}
    assert findings["anomaly-detection"].severity == "warning"
    assert findings["profiler-on"].figures["profiler"] == "AdvancedProfiler"
    assert findings["profiler-on"].severity == "warning"
    assert findings["small-batch"].figures == pytest.approx(
        {**findings["small-batch"].figures, "batch_size": 2, "measured": False}
    )
    assert "not measured" in findings["small-batch"].message


def test_a_clean_run_gets_no_warning(tmp_path: Path) -> None:
    ns = load("pytorch_lightning")
    ledger, _, _ = _fit(
        ns,
        tmp_path,
        _model(ns.name)(batch_size=16, length=512),
        [],
        max_epochs=2,
        limit_val_batches=0.125,
    )
    # 4 validation batches an epoch against 32 training ones: with 16 (and 4) the validation
    # loop's own start made it 25% of a 2-core machine's loaded run now and then, and the
    # validation-time finding was then the truth
    assert _ids(ledger) == [], ledger.fractions()


@each_namespace
def test_the_users_profiler_still_records_everything(ns: Namespace, tmp_path: Path) -> None:
    ledger, trainer, _ = _fit(
        ns, tmp_path, _model(ns.name)(), [], max_steps=3, limit_val_batches=0, profiler="simple"
    )
    recorded = trainer.profiler.recorded_durations
    assert len(recorded["run_training_batch"]) == 3
    assert any(k.endswith("].train_dataloader_next") for k in recorded)
    assert ledger.seconds()["training_step"] > 0
    assert {f.id: f.severity for f in ledger.doctor_findings()}["profiler-on"] == "info"


def _left_behind(trainer: Any) -> list[str]:
    owners = {
        "profiler": trainer.profiler,
        "fit_loop": trainer.fit_loop,
        "val_loop": trainer.fit_loop.epoch_loop.val_loop,
        "logger_connector": trainer._logger_connector,
    }
    names = ("start", "stop", "setup_data", "on_advance_start", "on_run_end", "run", "log_metrics")
    return [f"{o}.{n}" for o, obj in owners.items() for n in names if n in vars(obj)]


@each_namespace
def test_nothing_is_left_on_the_trainer_after_fit_or_an_exception(
    ns: Namespace, tmp_path: Path
) -> None:
    logger = ns.sub("loggers").CSVLogger(tmp_path, name="run")
    ledger, trainer, _ = _fit(ns, tmp_path, _model(ns.name)(), [], max_steps=2, logger=logger)
    assert _left_behind(trainer) == []
    assert not {"log_metrics", "save", "finalize", "log_hyperparams"} & set(vars(logger))

    class Boom(_model(ns.name)):  # type: ignore[misc]
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            raise RuntimeError("boom")

    ledger = WallTimeLedger()
    trainer = ns.Trainer(callbacks=[ledger], **quiet_trainer_kwargs(tmp_path, max_steps=2))
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Boom())
    assert _left_behind(trainer) == []
    assert not ledger.ledger.is_open
    assert ledger.total_s > 0


def test_the_table_and_summary_fields_reach_the_csv_logger(tmp_path: Path) -> None:
    ns = load("pytorch_lightning")
    logger = ns.sub("loggers").CSVLogger(tmp_path, name="run")
    _ledger, _trainer, _ = _fit(
        ns, tmp_path, _model(ns.name)(), [], max_steps=4, limit_val_batches=0, logger=logger
    )
    path = Path(logger.log_dir) / csv_file_name("speedpack/wall_time")
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames or ()) == TABLES["speedpack/wall_time"]
        rows = list(reader)
    parts = [r["part"] for r in rows]
    assert [p for p in PARTS if p != "callbacks"] == [p for p in parts if p != "callbacks"]
    assert any(r["part"] == "callbacks" and r["detail"] == "WallTimeLedger" for r in rows)
    steps = next(r for r in rows if r["part"] == "training_step")
    assert steps["detail"] == "4 batches"
    assert float(steps["seconds"]) > 0


def test_the_wandb_run_gets_the_table_and_fractions(tmp_path: Path, wandb_offline: Any) -> None:
    from pytorch_lightning.loggers import WandbLogger

    from tests.helpers.wandb_files import read_table

    ns = load("pytorch_lightning")
    logger = WandbLogger(project="wall", save_dir=str(wandb_offline.dir))
    _ledger, _, _ = _fit(
        ns, tmp_path, _model(ns.name)(), [], max_steps=4, limit_val_batches=0, logger=logger
    )
    import wandb

    wandb.finish()
    run = wandb_offline.only_run()
    table = read_table(run, "speedpack/wall_time")
    assert table["columns"] == list(TABLES["speedpack/wall_time"])
    assert {row[0] for row in table["data"]} >= {"setup", "training_step", "unaccounted"}
    fractions = {k: v for k, v in run.summary.items() if k.startswith("speedpack/wall/")}
    assert fractions["speedpack/wall/training_step_fraction"] > 0
    assert sum(v for k, v in fractions.items() if k.endswith("_fraction")) == pytest.approx(
        1.0, abs=0.01
    )


def _ddp_fit(tmp: str) -> dict[str, Any]:
    from pytorch_lightning import Trainer

    from tests.helpers.models import SizedBoringModel

    ledger = WallTimeLedger()
    trainer = Trainer(
        callbacks=[ledger],
        **quiet_trainer_kwargs(tmp, devices=2, strategy="ddp", max_epochs=2, limit_val_batches=2),
    )
    start = time.perf_counter()
    ledger.fit_entered(start)  # as the doctor does on every rank
    trainer.fit(SizedBoringModel())
    end = time.perf_counter()
    # Without this the ledger stops at `teardown`, and what DDP's strategy does after it (a few
    # ms on a loaded machine) would be measured against a fit of ~0.1 s (CI, stop 53).
    ledger.fit_returned(end)
    return {
        "wall": end - start,
        "total": ledger.total_s,
        "parts": ledger.seconds(),
        "runs": len(ledger.validation_runs),
    }


@pytest.mark.ddp
@pytest.mark.timeout(240)
def test_under_ddp_each_ranks_ledger_sums_to_its_wall_time(tmp_path: Path) -> None:
    from tests.helpers.ddp import run_ddp

    for rank in run_ddp(_ddp_fit, str(tmp_path), timeout=200):
        assert abs(rank["total"] - rank["wall"]) <= 0.02 * rank["wall"]
        assert sum(rank["parts"].values()) == pytest.approx(rank["total"])
        assert rank["parts"]["end_of_fit"] > 0  # DDP's own teardown, charged
        assert rank["runs"] == 2
        assert rank["parts"]["training_step"] > 0


def test_the_xrays_probe_asked_for_is_info_not_a_slow_callback(tmp_path: Path) -> None:
    # `--deep` turns the X-ray's ceilings probe on: once per fit, asked for, like WhatIf's trials
    # (issue 38: it was a `callback-time` warning, "hooks of DataPipelineProfiler took 10%").
    from pytorch_lightning.demos.boring_classes import BoringModel

    from lightning_speedpack import DataPipelineProfiler

    ns = load("pytorch_lightning")
    probe = DataPipelineProfiler(probe="start")
    ledger, _, _ = _fit(ns, tmp_path, BoringModel(), [probe], max_steps=4)
    share = ledger.ledger.details[("callback:DataPipelineProfiler", "on_train_start")] / (
        ledger.total_s
    )
    assert share > 0.025  # the probe is a visible part of this short fit
    name = type(probe).__name__
    mine = [f for f in ledger.doctor_findings() if f.figures.get("callback") == name]
    [info] = [f for f in mine if f.severity == "info"]
    assert "probe took" in info.message
    assert "--deep" in info.message
    # Its other hooks may still be judged (on a loaded machine, a 4-step fit), the probe never.
    assert all("on_train_start" not in f.message for f in mine if f.severity == "warning")


def test_a_callback_the_doctor_attached_is_its_measuring_cost_not_the_jobs(
    tmp_path: Path,
) -> None:
    # A short fit under the doctor (the 2-rank `ddp_fork` job of tests/doctor/test_spawned.py)
    # read "the hooks of callback SyncPointWarnings took 6% of the wall time (0.0 s: ...)" as a
    # warning: the doctor blaming its own start and end of training on the job.
    from lightning_speedpack.core.hook_hub import HookHub

    ns = load("pytorch_lightning")

    class EndsSlowly(ns.Callback):  # type: ignore[misc, name-defined]
        def on_train_start(self, *args: Any) -> None:
            time.sleep(NAP)

        def on_train_end(self, *args: Any) -> None:
            time.sleep(5 * NAP)

    kw = {"max_steps": 4, "limit_val_batches": 0}
    attached = HookHub([EndsSlowly()], owns=True)  # as the doctor attaches its own
    ledger, _, _ = _fit(ns, tmp_path / "doctor", _model(ns.name)(), [attached], **kw)
    (own,) = [f for f in ledger.doctor_findings() if f.id == "callback-time"]
    assert own.severity == "info"
    assert own.message.startswith("the doctor's own EndsSlowly took ")
    assert re.search(r"on_train_start \d+ ms", own.message)  # not "0.0 s"
    ledger, _, _ = _fit(ns, tmp_path / "user", _model(ns.name)(), [EndsSlowly()], **kw)
    (users,) = [f for f in ledger.doctor_findings() if f.id == "callback-time"]
    assert users.severity == "warning"  # the user's own callback stays the job's
    assert users.message.startswith("the hooks of callback EndsSlowly took ")


@each_namespace
def test_lightnings_batch_size_search_is_an_info_with_what_it_found(
    ns: Namespace, tmp_path: Path
) -> None:
    # BatchSizeFinder's trials at fit start were told "make its hooks cheaper (run its work
    # every N steps, or off the training thread)", a warning: they are a search, run once.
    finder = ns.sub("callbacks").BatchSizeFinder(init_val=2, max_trials=3, steps_per_trial=2)
    ledger, _, _ = _fit(
        ns, tmp_path, _model(ns.name)(batch_size=2), [finder], max_epochs=1, limit_train_batches=2
    )
    (finding,) = [
        f for f in ledger.doctor_findings() if f.figures.get("callback") == "BatchSizeFinder"
    ]
    assert finding.severity == "info"
    assert finding.message.startswith("BatchSizeFinder's search took ")
    assert finding.message.endswith(f"; it found batch size {finder.optimal_batch_size}")
    assert "cheaper" not in (finding.fix or "")
    assert "put it in your code" in (finding.fix or "")


@each_namespace
def test_a_hubs_batch_hooks_and_a_default_transfer_hook_open_no_bracket(
    ns: Namespace, tmp_path: Path
) -> None:
    # Under the doctor every training batch opened six brackets in the ledger, three of them
    # for nothing to measure: the hub's `on_train_batch_start`/`_end` (the hub times each of
    # its members itself) and Lightning's empty `on_before_batch_transfer`. Each costs the
    # profiler tap, the ledger's enter and leave: ~25 Python lines a batch on every rank.
    from lightning_speedpack.core.hook_hub import HookHub

    class StartsAndEndsSlowly(ns.Callback):  # type: ignore[misc, name-defined]
        def on_train_batch_start(self, *args: Any) -> None:
            time.sleep(NAP)

        def on_train_batch_end(self, *args: Any) -> None:
            time.sleep(NAP)

    steps = 4
    hub = HookHub([StartsAndEndsSlowly()], owns=True)  # as the doctor attaches its own
    ledger = WallTimeLedger()
    opened: list[str] = []
    trainer = ns.Trainer(callbacks=[ledger, hub], **quiet_trainer_kwargs(tmp_path, max_steps=steps))

    class Counting(type(ledger.ledger)):  # type: ignore[misc]
        def enter(self, now: float, key: str, *, token: str, detail: str = "") -> None:
            opened.append(token)
            super().enter(now, key, token=token, detail=detail)

    real_reset = ledger._reset

    def reset() -> None:  # the ledger is made anew at setup: count that one's brackets
        real_reset()
        ledger.ledger.__class__ = Counting

    ledger._reset = reset  # type: ignore[method-assign]
    trainer.fit(_model(ns.name)())
    per_batch = [t for t in opened if "batch" in t]
    assert not [t for t in per_batch if "HookHub" in t or "before_batch_transfer" in t]
    assert per_batch.count("run_training_batch") == steps
    # ... and the member's time is still its own, all of it, taken from Lightning's loop.
    seconds = ledger.seconds()
    assert ledger.callback_seconds()["StartsAndEndsSlowly"] >= 2 * steps * NAP
    assert seconds["unaccounted"] >= 0.0
    assert sum(seconds.values()) == pytest.approx(ledger.total_s)
    by_hook = {d: s for (k, d), s in ledger.details().items() if k.endswith("AndEndsSlowly")}
    assert by_hook["on_train_batch_start"] >= steps * NAP
    assert by_hook["on_train_batch_end"] >= steps * NAP


@each_namespace
def test_a_transfer_hook_of_the_users_is_still_the_batch_transfer(
    ns: Namespace, tmp_path: Path
) -> None:
    # Guards the condition above: only Lightning's empty default goes unbracketed, whether
    # the module or the datamodule overrides the hook (Lightning then names the datamodule).
    class Augments(_model(ns.name)):  # type: ignore[misc]
        def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            time.sleep(NAP)
            return batch

    steps = 4
    ledger, _, _ = _fit(ns, tmp_path / "module", Augments(), [], max_steps=steps)
    assert ledger.seconds()["batch_transfer"] >= steps * NAP

    class Data(ns.module.LightningDataModule):  # type: ignore[misc, name-defined]
        def train_dataloader(self) -> Any:
            return _model(ns.name)().train_dataloader()

        def val_dataloader(self) -> Any:
            return _model(ns.name)().val_dataloader()

        def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            time.sleep(NAP)
            return batch

    ledger = WallTimeLedger()
    trainer = ns.Trainer(
        callbacks=[ledger],
        **quiet_trainer_kwargs(tmp_path / "data", max_steps=steps, limit_val_batches=0),
    )
    trainer.fit(_model(ns.name)(), datamodule=Data())
    assert ledger.seconds()["batch_transfer"] >= steps * NAP


@each_namespace
def test_an_owning_hubs_epoch_hooks_open_one_bracket_and_each_member_keeps_its_time(
    ns: Namespace, tmp_path: Path
) -> None:
    # The hub used to enter the profiler for each member's once-a-fit hook, and the ledger
    # bracketed each (~300 Python lines an epoch under the doctor). Now Lightning's one action
    # for the hub's hook is bracketed and shared out by the hub's own clock.
    from lightning_speedpack.core.hook_hub import HookHub

    class EndsEpochsSlowly(ns.Callback):  # type: ignore[misc, name-defined]
        def on_train_epoch_end(self, *args: Any) -> None:
            time.sleep(2 * NAP)

    class StartsEpochsSlowly(ns.Callback):  # type: ignore[misc, name-defined]
        def on_train_epoch_start(self, *args: Any) -> None:
            time.sleep(NAP)

        def on_train_epoch_end(self, *args: Any) -> None:
            time.sleep(NAP)

    epochs = 3
    hub = HookHub([EndsEpochsSlowly(), StartsEpochsSlowly()], owns=True)
    ledger = WallTimeLedger()
    opened: list[str] = []
    trainer = ns.Trainer(
        callbacks=[ledger, hub],
        **quiet_trainer_kwargs(tmp_path, max_epochs=epochs, limit_train_batches=2),
    )

    class Counting(type(ledger.ledger)):  # type: ignore[misc]
        def enter(self, now: float, key: str, *, token: str, detail: str = "") -> None:
            opened.append(token)
            super().enter(now, key, token=token, detail=detail)

    real_reset = ledger._reset

    def reset() -> None:
        real_reset()
        ledger.ledger.__class__ = Counting

    ledger._reset = reset  # type: ignore[method-assign]
    trainer.fit(_model(ns.name)())
    epoch_ends = [t for t in opened if t.endswith(".on_train_epoch_end")]
    assert epoch_ends == ["[Callback]HookHub.on_train_epoch_end"] * epochs  # one, not one a member
    mine = ledger.callback_seconds()
    assert "HookHub" not in mine
    details = ledger.details()
    assert details[("callback:EndsEpochsSlowly", "on_train_epoch_end")] >= epochs * 2 * NAP
    assert details[("callback:StartsEpochsSlowly", "on_train_epoch_end")] >= epochs * NAP
    assert details[("callback:StartsEpochsSlowly", "on_train_epoch_start")] >= epochs * NAP
    assert sum(ledger.seconds().values()) == pytest.approx(ledger.total_s)
