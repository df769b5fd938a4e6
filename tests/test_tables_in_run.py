"""Issue 15's "Done when": a fit with planted problems leaves every table in the run's own files.

One fit per Lightning namespace with a planted ``.item()``, a planted retained loss, a
BatchSizeTuner, the SpeedAdvisor, SyncPointWarnings and LossRetentionDetector, logged to an
offline W&B run and a CSV logger at once; the tables and summary fields are then read back from
what each logger wrote (the ``run-*.wandb`` record log and its table files; the CSV files beside
``metrics.csv``), not from the callbacks.
"""

from __future__ import annotations

import csv
import functools
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from lightning_speedpack.advisor.callback import SpeedAdvisor
from lightning_speedpack.batch_size.callback import BatchSizeTuner
from lightning_speedpack.core.tables import SUMMARY_FILE, TABLES, csv_file_name, log_fit_end
from lightning_speedpack.doctor.runner import DoctorSession
from lightning_speedpack.retention.callback import LossRetentionDetector, RetainedGraphWarning
from lightning_speedpack.sync_points.callback import SyncPointWarnings
from tests.helpers.models import quiet_trainer_kwargs
from tests.helpers.namespaces import NAMESPACE_IDS, Namespace, each_namespace
from tests.helpers.wandb_files import read_table, table_keys

PLANTED = "# planted: a host-device sync"
STEPS = 6

Rows = list[dict[str, str]]


def _planted_line() -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.rstrip().endswith(PLANTED))


@functools.cache
def _leaky_model(name: str) -> type[Any]:
    """A SizedBoringModel of namespace ``name`` that syncs and keeps its losses with graphs."""
    base = Namespace(name, __import__(name, fromlist=["Trainer"])).SizedBoringModel

    class Leaky(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__(batch_size=8, length=64)
            self.losses: list[Any] = []
            self.last_loss = 0.0

        def on_train_start(self) -> None:
            self.losses = []  # the tuner's trials ran training_step before this

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            out = super().training_step(batch, batch_idx)
            self.last_loss = out["loss"].item()  # planted: a host-device sync
            self.losses.append(out["loss"])  # the planted leak: a loss kept with its graph
            self.log("train_loss", out["loss"])  # logging a tensor is not a sync
            return out

    Leaky.__qualname__ = f"Leaky_{NAMESPACE_IDS[name]}"
    return Leaky


def _callbacks() -> tuple[BatchSizeTuner, list[Any]]:
    tuner = BatchSizeTuner(mode="throughput", max_val=32, steps_per_trial=2, verbose=False)
    return tuner, [
        tuner,
        SyncPointWarnings(mode="summary", include_cpu=True),
        LossRetentionDetector(mode="warn"),
        SpeedAdvisor(measure_steps=2, verbose=False),
    ]


def _fit(ns: Namespace, tmp_path: Path, loggers: list[Any], callbacks: list[Any]) -> Any:
    kwargs = quiet_trainer_kwargs(
        tmp_path, max_steps=STEPS, max_epochs=-1, limit_val_batches=0, log_every_n_steps=1
    )
    kwargs["logger"] = loggers
    trainer = ns.Trainer(callbacks=callbacks, **kwargs)
    with pytest.warns(RetainedGraphWarning, match=r"model\.losses"):
        trainer.fit(_leaky_model(ns.name)())
    return trainer


def _text(value: Any) -> str:
    """A cell as the CSV file holds it (W&B keeps JSON types; compare both as text)."""
    return "" if value is None else str(value)


def _wandb_tables(run: Any) -> dict[str, Rows]:
    out: dict[str, Rows] = {}
    for key in table_keys(run):
        table = read_table(run, key)
        if key in TABLES:
            assert table["columns"] == list(TABLES[key]), key
        out[key] = [
            {c: _text(v) for c, v in zip(table["columns"], row, strict=True)}
            for row in table["data"]
        ]
    return out


def _csv_tables(log_dir: Path) -> dict[str, Rows]:
    out: dict[str, Rows] = {}
    for key, columns in TABLES.items():
        path = log_dir / csv_file_name(key)
        if path.exists():
            with path.open(newline="") as fh:
                reader = csv.DictReader(fh)
                assert tuple(reader.fieldnames or ()) == columns, key
                out[key] = list(reader)
    return out


def _check_planted(tables: dict[str, Rows], summary: dict[str, Any], tuner: BatchSizeTuner) -> None:
    """The planted problems are in the rows; the summary fields say the same."""
    where = f"test_tables_in_run.py:{_planted_line()}"
    # sync points: the .item() at its file:line, once per step
    (sync,) = [r for r in tables["speedpack/sync_points"] if r["origin"] == "user"]
    assert sync["kind"] == "item"
    assert sync["location"].endswith(where), sync["location"]
    assert sync["code"] == 'self.last_loss = out["loss"].item()  ' + PLANTED
    assert (sync["function"], sync["per_step"], sync["steps_seen"]) == (
        "training_step",
        "1.0",
        str(STEPS),
    )
    # advisor: the BoringModel's loader has no workers
    advisor = {r["id"]: r for r in tables["speedpack/advisor"]}
    assert advisor["dataloader-workers"]["severity"] == "warning"
    assert advisor["dataloader-workers"]["evidence"] == "train_dataloader: num_workers=0"
    assert advisor["dataloader-workers"]["location"] == "train_dataloader"
    # batch-size trials: every size tried, the chosen one marked
    trials = tables["speedpack/batch_size_trials"]
    assert [int(r["batch_size"]) for r in trials] == [t.batch_size for t in tuner.trials]
    assert [int(r["batch_size"]) for r in trials if r["chosen"] == "True"] == [tuner.batch_size]
    assert all(r["fits"] == "True" and float(r["samples_per_sec"]) > 0 for r in trials)
    # findings: every component's, as the doctor prints them
    findings = {(r["component"], r["id"]): r for r in tables["speedpack/findings"]}
    assert findings["sync_points", "sync-item"]["location"].endswith(where)
    assert findings["loss_retention", "retained-graph"]["location"] == "model.losses"
    assert findings["advisor", "dataloader-workers"]["severity"] == "warning"
    assert findings["batch_size", "batch-size-trials"]["severity"] == "info"
    # summary fields
    assert summary["speedpack/syncs_per_step"] == 1.0
    assert summary["speedpack/tuned_batch_size"] == tuner.batch_size
    assert summary["speedpack/batch_size"] == tuner.batch_size
    assert summary["speedpack/retained_graphs/count"] >= 2
    assert summary["speedpack/advisor/warning"] == sum(
        r["severity"] == "warning" for r in tables["speedpack/advisor"]
    )
    for severity in ("error", "warning", "info"):
        assert summary[f"speedpack/findings/{severity}"] == sum(
            r["severity"] == severity for r in tables["speedpack/findings"]
        )
    # retained graphs: the planted holder, one row
    (held,) = tables["speedpack/retained_graphs"]
    _check_holder(held)
    assert int(held["count"]) <= summary["speedpack/retained_graphs/count"]


def _check_holder(held: dict[str, str]) -> None:
    """The planted ``self.losses.append(loss)``: back-propagated graphs, one per earlier step."""
    assert held["path"] == "model.losses"
    assert held["backpropagated"] == "True"
    assert 2 <= int(held["count"]) < STEPS
    assert 0 <= int(held["step_first_seen"]) < STEPS
    assert int(held["est_bytes"]) >= 0
    assert held["example_grad_fn"] == "MseLossBackward0"


@each_namespace
def test_wandb_and_csv_runs_hold_every_table_with_the_planted_problems(
    ns: Namespace, tmp_path: Path, wandb_offline: Any
) -> None:
    import wandb

    loggers = ns.sub("loggers")
    csv_logger = loggers.CSVLogger(tmp_path / "csv")
    wandb_logger = loggers.WandbLogger(offline=True, save_dir=str(wandb_offline.dir))
    tuner, callbacks = _callbacks()
    _fit(ns, tmp_path, [wandb_logger, csv_logger], callbacks)
    wandb.finish()

    run = wandb_offline.only_run()
    expected = {
        "speedpack/sync_points",
        "speedpack/advisor",
        "speedpack/batch_size_trials",
        "speedpack/findings",
        "speedpack/batch_size_trials_chart_table",
        "speedpack/retained_graphs",
    }
    assert expected <= table_keys(run)
    for key in expected:  # the summary still points at each table (no field overwrote it)
        assert run.summary[f"{key}/_type"] == "table-file", key
    _check_planted(_wandb_tables(run), run.summary, tuner)
    chart = read_table(run, "speedpack/batch_size_trials_chart_table")
    assert chart["columns"] == ["batch_size", "samples_per_sec"]
    assert [x for x, _ in chart["data"]] == sorted({t.batch_size for t in tuner.trials})
    panel = run.config["_wandb/visualize/speedpack/batch_size_trials_chart"]
    fields = panel["panel_config"]["fieldSettings"]
    assert (fields["x"], fields["y"]) == ("batch_size", "samples_per_sec")

    log_dir = Path(csv_logger.log_dir)
    assert (log_dir / "metrics.csv").is_file()  # the tables sit beside it
    tables = _csv_tables(log_dir)
    assert set(tables) >= expected - {"speedpack/batch_size_trials_chart_table"}
    _check_planted(tables, json.loads((log_dir / SUMMARY_FILE).read_text()), tuner)


@each_namespace
def test_retained_graphs_table_names_the_holder(ns: Namespace, tmp_path: Path) -> None:
    csv_logger = ns.sub("loggers").CSVLogger(tmp_path / "csv")
    _fit(ns, tmp_path, [csv_logger], [LossRetentionDetector(mode="warn")])
    log_dir = Path(csv_logger.log_dir)
    (held,) = _csv_tables(log_dir)["speedpack/retained_graphs"]
    _check_holder(held)
    summary = json.loads((log_dir / SUMMARY_FILE).read_text())
    assert summary["speedpack/retained_graphs/count"] >= int(held["count"])
    # the only pack callback on the Trainer: it also logs the run's findings
    (finding,) = _csv_tables(log_dir)["speedpack/findings"]
    assert (finding["id"], finding["location"]) == ("retained-graph", "model.losses")
    assert summary["speedpack/findings/warning"] == 1


@each_namespace
def test_under_the_doctor_the_findings_table_is_what_the_report_prints(
    ns: Namespace, tmp_path: Path, wandb_offline: Any
) -> None:
    import wandb

    session = DoctorSession()
    with session.installed():
        logger = ns.sub("loggers").WandbLogger(offline=True, save_dir=str(wandb_offline.dir))
        _fit(ns, tmp_path, [logger], [])
    wandb.finish()
    run = wandb_offline.only_run()
    tables = _wandb_tables(run)  # read_table: each logged once, by the doctor's recorder
    report = session.report()
    assert sorted(
        (r["component"], r["id"], r["location"]) for r in tables["speedpack/findings"]
    ) == (sorted((f.component, f.id, _text(f.location)) for f in report.findings))
    assert {"speedpack/sync_points", "speedpack/advisor"} <= set(tables)
    (user_sync,) = [r for r in tables["speedpack/sync_points"] if r["origin"] == "user"]
    assert user_sync["location"].endswith(f"test_tables_in_run.py:{_planted_line()}")
    assert run.summary["speedpack/syncs_per_step"] == 1.0
    assert run.summary["speedpack/wall_s"] > 0
    assert run.summary["speedpack/samples_per_sec"] > 0  # ThroughputLogger's figure
    assert run.summary["speedpack/findings/warning"] == sum(
        f.severity == "warning" for f in report.findings
    )


class _Source:
    def __init__(self, fail: bool = False) -> None:
        self.calls = 0
        self.fail = fail

    def log_tables(self, trainer: Any) -> None:
        self.calls += 1
        if self.fail:
            raise RuntimeError("the logger is gone")


def test_only_rank_zero_logs_and_a_failing_logger_does_not_fail_the_fit() -> None:
    source = _Source()
    other_rank = SimpleNamespace(is_global_zero=False, loggers=[], callbacks=[source])
    log_fit_end(other_rank, source)  # type: ignore[arg-type]
    assert source.calls == 0
    broken = _Source(fail=True)
    rank0 = SimpleNamespace(is_global_zero=True, loggers=[], callbacks=[broken])
    with pytest.warns(UserWarning, match=r"_Source could not log its tables .*the logger is gone"):
        log_fit_end(rank0, broken)  # type: ignore[arg-type]
