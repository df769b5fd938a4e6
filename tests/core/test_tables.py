"""Tables and summary fields reach W&B, CSV and TensorBoard, read back from what each wrote."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from lightning_speedpack.core.findings import Finding
from lightning_speedpack.core.lightning import Callback
from lightning_speedpack.core.tables import (
    SUMMARY_FILE,
    TABLES,
    csv_file_name,
    finding_counts,
    finding_rows,
    log_line_chart,
    log_summary,
    log_table,
)
from tests.helpers.models import quiet_trainer_kwargs
from tests.helpers.namespaces import Namespace, each_namespace

SYNC_ROWS: list[list[Any]] = [
    ["user", "item", "train.py:12", "loss.item()", "training_step", 1.0, 4, 0],
    ["user", "cpu", "train.py:15", "x.cpu()", "training_step", 0.5, 4, 1],
]
TRIALS = [(32, 410.0), (64, 730.5), (128, 901.25)]
FINDINGS = [
    Finding("sync_points", "sync-item", "loss.item() syncs", location="train.py:12"),
    Finding("timeline", "step-phases", "forward 60%", severity="info"),
]


class Tables(Callback):
    """What a component does at the end of fit: its table, its summary fields, a chart."""

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        log_table(trainer, "speedpack/sync_points", TABLES["speedpack/sync_points"], SYNC_ROWS)
        log_table(
            trainer, "speedpack/findings", TABLES["speedpack/findings"], finding_rows(FINDINGS)
        )
        log_summary(trainer, {"speedpack/syncs_per_step": 1.5, "speedpack/verdict": "data"})
        log_summary(trainer, finding_counts(FINDINGS))
        log_line_chart(
            trainer, "speedpack/batch_size_trials_chart", TRIALS, "batch_size", "samples_per_sec"
        )


def _fit(ns: Namespace, tmp_path: Path, logger: Any) -> None:
    kwargs = quiet_trainer_kwargs(tmp_path, max_steps=2)
    kwargs["logger"] = logger
    trainer = ns.Trainer(callbacks=[Tables()], **kwargs)
    trainer.fit(ns.SizedBoringModel())


def _wandb_table(run: Any, key: str) -> dict[str, Any]:
    """The table logged under ``key``, from the run's own ``files/`` (what W&B uploads)."""
    (row,) = [r for r in run.history if r.get(f"{key}/_type") == "table-file"]
    return dict(json.loads((run.path.parent / "files" / row[f"{key}/path"]).read_text()))


@pytest.mark.slow
@each_namespace
def test_wandb_run_holds_the_tables_summary_and_chart(
    ns: Namespace, tmp_path: Path, wandb_offline: Any
) -> None:
    import wandb

    logger = ns.sub("loggers").WandbLogger(offline=True, save_dir=str(wandb_offline.dir))
    _fit(ns, tmp_path, logger)
    wandb.finish()
    run = wandb_offline.only_run()
    sync = _wandb_table(run, "speedpack/sync_points")
    assert sync["columns"] == list(TABLES["speedpack/sync_points"])
    assert sync["data"] == SYNC_ROWS
    findings = _wandb_table(run, "speedpack/findings")
    assert [r[:3] for r in findings["data"]] == [
        ["warning", "sync_points", "sync-item"],
        ["info", "timeline", "step-phases"],
    ]
    assert run.summary["speedpack/syncs_per_step"] == 1.5
    assert run.summary["speedpack/verdict"] == "data"
    assert run.summary["speedpack/findings/warning"] == 1
    assert run.summary["speedpack/findings/info"] == 1
    assert run.summary["speedpack/findings/error"] == 0
    chart = _wandb_table(run, "speedpack/batch_size_trials_chart_table")
    assert chart == {
        "columns": ["batch_size", "samples_per_sec"],
        "data": [list(p) for p in TRIALS],
    }
    panel = run.config["_wandb/visualize/speedpack/batch_size_trials_chart"]
    assert panel["panel_config"]["fieldSettings"]["x"] == "batch_size"
    assert panel["panel_config"]["fieldSettings"]["y"] == "samples_per_sec"


@each_namespace
def test_csv_logger_gets_a_csv_per_table_and_the_summary_beside_metrics_csv(
    ns: Namespace, tmp_path: Path
) -> None:
    logger = ns.sub("loggers").CSVLogger(tmp_path / "logs")
    _fit(ns, tmp_path, logger)
    log_dir = Path(logger.log_dir)
    assert Path(logger.experiment.metrics_file_path).parent == log_dir  # beside metrics.csv
    with (log_dir / "speedpack_sync_points.csv").open(newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == list(TABLES["speedpack/sync_points"])
    assert rows[1:] == [[str(c) for c in row] for row in SYNC_ROWS]
    with (log_dir / "speedpack_findings.csv").open(newline="") as fh:
        findings = list(csv.DictReader(fh))
    assert findings[0]["location"] == "train.py:12"
    assert findings[1]["location"] == ""  # None is an empty cell
    summary = json.loads((log_dir / SUMMARY_FILE).read_text())
    assert summary == {  # two calls, merged
        "speedpack/syncs_per_step": 1.5,
        "speedpack/verdict": "data",
        "speedpack/findings/error": 0,
        "speedpack/findings/warning": 1,
        "speedpack/findings/info": 1,
    }
    assert not (log_dir / "speedpack_batch_size_trials_chart.csv").exists()  # charts: W&B/TB


def _tensorboard_installed() -> bool:
    return any(importlib.util.find_spec(m) for m in ("tensorboard", "tensorboardX"))


@pytest.mark.skipif(
    not _tensorboard_installed(),
    reason="neither tensorboard nor tensorboardX is installed, so TensorBoardLogger cannot run",
)
@each_namespace
def test_tensorboard_gets_markdown_tables_and_scalar_summary(
    ns: Namespace, tmp_path: Path
) -> None:  # pragma: no cover - needs tensorboard
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = ns.sub("loggers").TensorBoardLogger(tmp_path / "tb")
    _fit(ns, tmp_path, logger)
    events = EventAccumulator(str(logger.log_dir), size_guidance={"tensors": 0, "scalars": 0})
    events.Reload()
    text = events.Tensors("speedpack/sync_points/text_summary")[-1].tensor_proto.string_val[0]
    assert b"| train.py:12 | loss.item() |" in text
    assert events.Scalars("speedpack/syncs_per_step")[-1].value == 1.5
    chart = events.Scalars("speedpack/batch_size_trials_chart")
    assert [(e.step, e.value) for e in chart] == [(x, pytest.approx(y)) for x, y in TRIALS]


class _Writer:
    """Records SummaryWriter calls (tensorboard is not installed on every machine)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, Any, int]] = []

    def add_text(self, tag: str, text: str, global_step: int) -> None:
        self.calls.append(("text", tag, text, global_step))

    def add_scalar(self, tag: str, value: float, global_step: int) -> None:
        self.calls.append(("scalar", tag, value, global_step))

    def flush(self) -> None:
        pass


@each_namespace
def test_tensorboard_logger_receives_markdown_and_scalars(ns: Namespace) -> None:
    # A TensorBoardLogger needs tensorboard to construct; build one around a recording writer.
    cls = ns.sub("loggers").TensorBoardLogger
    logger = cls.__new__(cls)
    logger._experiment = writer = _Writer()
    trainer = SimpleNamespace(is_global_zero=True, loggers=[logger], global_step=7)
    log_table(trainer, "speedpack/sync_points", TABLES["speedpack/sync_points"], SYNC_ROWS)  # type: ignore[arg-type]
    log_summary(trainer, {"speedpack/syncs_per_step": 1.5, "speedpack/verdict": "data"})  # type: ignore[arg-type]
    log_line_chart(trainer, "speedpack/bs", TRIALS, "batch_size", "samples_per_sec")  # type: ignore[arg-type]
    kind, tag, text, step = writer.calls[0]
    assert (kind, tag, step) == ("text", "speedpack/sync_points", 7)
    assert text.splitlines()[2] == (
        "| user | item | train.py:12 | loss.item() | training_step | 1.0 | 4 | 0 |"
    )
    assert writer.calls[1:] == [
        ("scalar", "speedpack/syncs_per_step", 1.5, 7),
        ("text", "speedpack/verdict", "data", 7),
        *[("scalar", "speedpack/bs", y, x) for x, y in TRIALS],
    ]


@each_namespace
def test_no_logger_and_other_ranks_write_nothing(ns: Namespace, tmp_path: Path) -> None:
    _fit(ns, tmp_path, False)
    csv_logger = ns.sub("loggers").CSVLogger(tmp_path / "logs")
    rank1 = SimpleNamespace(is_global_zero=False, loggers=[csv_logger], global_step=0)
    log_table(rank1, "speedpack/sync_points", TABLES["speedpack/sync_points"], SYNC_ROWS)  # type: ignore[arg-type]
    log_summary(rank1, {"speedpack/syncs_per_step": 1.0})  # type: ignore[arg-type]
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith("speedpack")]


def test_a_tensor_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    from pytorch_lightning.loggers import CSVLogger

    logger = CSVLogger(tmp_path)
    trainer = SimpleNamespace(is_global_zero=True, loggers=[logger], global_step=0)
    rows = [["user", "item", "a.py:1", "x.item()", "f", torch.tensor(1.0), 1, 0]]
    with pytest.raises(TypeError, match=r"row 0, column 'per_step' holds a torch.Tensor"):
        log_table(trainer, "speedpack/sync_points", TABLES["speedpack/sync_points"], rows)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"field 'speedpack/x' holds a torch.Tensor"):
        log_summary(trainer, {"speedpack/x": torch.tensor(2)})  # type: ignore[arg-type, dict-item]
    assert not list(tmp_path.rglob("speedpack*"))


def test_the_pack_tables_keep_their_columns() -> None:
    trainer = SimpleNamespace(is_global_zero=True, loggers=[])
    with pytest.raises(ValueError, match=r"the columns of this table are \['id', 'severity'"):
        log_table(trainer, "speedpack/advisor", ["id", "severity"], [])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty str"):
        log_table(trainer, "", ["x"], [])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="coordinates must be plain int or float"):
        log_line_chart(trainer, "c", [(1, "fast")], "x", "y")  # type: ignore[arg-type, list-item]
    assert csv_file_name("speedpack/batch_size_trials") == "speedpack_batch_size_trials.csv"
