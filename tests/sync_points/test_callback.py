"""SyncPointWarnings on real Trainers: kinds and lines in a training step, modes, restore, DDP."""

from __future__ import annotations

import doctest
import inspect
import pickle
import textwrap
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pytorch_lightning import Trainer
from pytorch_lightning.demos.boring_classes import BoringModel

import lightning_speedpack
from lightning_speedpack.core import sampling
from lightning_speedpack.core.hook_hub import HookHub
from lightning_speedpack.doctor.runner import run_script
from lightning_speedpack.sync_points import callback as sync_points
from lightning_speedpack.sync_points import patching
from lightning_speedpack.sync_points.callback import (
    SyncPointError,
    SyncPointWarnings,
    SyncWarning,
)
from tests.helpers import global_state
from tests.helpers.ddp import run_ddp
from tests.helpers.models import quiet_trainer_kwargs
from tests.helpers.namespaces import Namespace, each_namespace

STEPS = 3


CUDA_MSG = "called a synchronizing CUDA operation"  # what set_sync_debug_mode warns


def marked_lines(fn: Any) -> dict[str, int]:
    """``{marker: line}`` for every ``# sync: <marker>`` comment in ``fn``'s source."""
    lines, start = inspect.getsourcelines(fn)
    return {
        line.split("# sync: ")[1].split()[0]: start + offset
        for offset, line in enumerate(lines)
        if "# sync: " in line
    }


def syncing_code(loss: torch.Tensor, x: torch.Tensor) -> None:
    """Every kind, one per line; ``item`` twice per step."""
    for _ in range(2):
        loss.item()  # sync: item
    float(loss)  # sync: float
    int(loss)  # sync: int
    if (x != 0).all():  # sync: bool
        pass
    [0, 1, 2][x.argmax() % 3]  # sync: index
    x.tolist()  # sync: tolist
    x.detach().numpy()  # sync: numpy
    np.asarray(x.detach())  # sync: asarray
    x.cpu()  # sync: cpu
    x.to("cpu")  # sync: to-cpu
    x.to(device="cpu")  # sync: to-device-cpu
    print(loss)  # sync: print
    f"{loss:.3f}"  # sync: format
    x.nonzero()  # sync: nonzero
    torch.nonzero(x)  # sync: torch.nonzero
    torch.where(x > 0)  # sync: where
    x.masked_select(x > 0)  # sync: masked_select
    torch.unique(x)  # sync: unique
    x[x > 0]  # sync: getitem
    x.clone()[x > 0] = 0.0  # sync: setitem
    torch.cuda.empty_cache()  # sync: empty_cache


KINDS = {
    "item": "item",
    "float": "float",
    "int": "int",
    "bool": "bool",
    "index": "index",
    "tolist": "tolist",
    "numpy": "numpy",
    "asarray": "numpy",
    "cpu": "cpu copy",
    "to-cpu": "cpu copy",
    "to-device-cpu": "cpu copy",
    "print": "repr",
    "format": "repr",
    "nonzero": "nonzero",
    "torch.nonzero": "nonzero",
    "where": "where",
    "masked_select": "masked select",
    "unique": "unique",
    "getitem": "masked index",
    "setitem": "masked index",
    "empty_cache": "empty cache",
}


class HelperModel(BoringModel):
    """Syncs in a helper function called from training_step."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        out = super().training_step(batch, batch_idx)
        syncing_code(out["loss"].detach(), batch)
        self.log("loss", out["loss"])  # not a sync
        return out


class InlineModel(BoringModel):
    """Syncs written in training_step itself."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        out = super().training_step(batch, batch_idx)
        loss = out["loss"].detach()
        loss.item()  # sync: item
        if (batch != 0).all():  # sync: bool
            pass
        print(loss)  # sync: print
        batch.cpu()  # sync: cpu
        batch[batch > 0]  # sync: getitem
        self.log("loss", loss)  # not a sync
        return out


def fit(callback: SyncPointWarnings, model: Any, tmp_path: Path, **kwargs: Any) -> Trainer:
    kwargs.setdefault("max_steps", STEPS)
    trainer = Trainer(callbacks=[callback], **quiet_trainer_kwargs(tmp_path, **kwargs))
    trainer.fit(model)
    return trainer


def test_every_kind_in_a_helper_is_reported_once_with_line_and_per_step(
    tmp_path: Path, capsys: Any
) -> None:
    before = global_state.snapshot()
    cb = SyncPointWarnings(mode="summary", include_cpu=True)
    fit(cb, HelperModel(), tmp_path)
    lines = marked_lines(syncing_code)
    user = cb.user_findings
    assert {(f.kind, f.lineno) for f in user} == {(KINDS[k], ln) for k, ln in lines.items()}
    assert all(f.filename == __file__ and f.function == "syncing_code" for f in user)
    per_step = {f.lineno: f.per_step for f in user}
    assert per_step[lines["item"]] == 2.0
    assert all(v == 1.0 for line, v in per_step.items() if line != lines["item"])
    assert all(f.steps_seen == STEPS and f.first_step == 0 for f in user)
    assert cb.syncs_per_step == len(lines) + 1
    assert global_state.diff(before, global_state.snapshot()) == {}
    assert "Host-device syncs" in capsys.readouterr().err  # the summary table


def test_record_mode_keeps_the_sites_and_prints_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The doctor's mode: its report shows the call sites, so the callback prints no table of
    # its own (a repeat, and ~8 ms inside the fit's last hook) and warns of none.
    cb = SyncPointWarnings(mode="record", include_cpu=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(cb, InlineModel(), tmp_path)
    assert not [w for w in caught if "sync" in type(w.message).__name__.lower()]
    lines = marked_lines(InlineModel.training_step)
    assert {(f.kind, f.lineno) for f in cb.user_findings} == {
        (KINDS[k], ln) for k, ln in lines.items()
    }
    assert cb.doctor_findings()
    out = capsys.readouterr()
    assert "Host-device syncs" not in out.err + out.out
    assert "SyncPointWarnings" not in out.err + out.out


def test_the_doctor_records_the_sync_points_without_a_table_of_their_own() -> None:
    from lightning_speedpack.core.registry import DoctorContext, registered_diagnostics

    [spec] = [d for d in registered_diagnostics() if d.name == "sync_points"]
    assert spec.factory(DoctorContext()).mode == "record"
    assert spec.factory(DoctorContext(deep=True)).mode == "record"


def test_kinds_written_in_training_step(tmp_path: Path, capsys: Any) -> None:
    cb = SyncPointWarnings(mode="summary", include_cpu=True)
    fit(cb, InlineModel(), tmp_path)
    lines = marked_lines(InlineModel.training_step)
    assert {(f.kind, f.lineno, f.count) for f in cb.user_findings} == {
        (KINDS[k], ln, STEPS) for k, ln in lines.items()
    }
    assert {f.function for f in cb.user_findings} == {"training_step"}
    # self.log(loss) moves the tensor to its own device inside Lightning: not reported.
    assert [f for f in cb.report if f.origin == "framework" and f.kind == "cpu copy"] == []


def test_clean_boring_model_has_no_user_findings(tmp_path: Path) -> None:
    cb = SyncPointWarnings(mode="error", include_cpu=True)
    fit(cb, BoringModel(), tmp_path)
    assert cb.user_findings == []
    assert cb.doctor_figures() == {"syncs_per_step": 0.0}


def test_cpu_tensors_do_not_count_by_default(tmp_path: Path, capsys: Any) -> None:
    cb = SyncPointWarnings(mode="error")  # only the CUDA call would count: it is not made here
    fit(cb, InlineModel(), tmp_path)
    assert cb.report == []


class OneItem(BoringModel):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        out = super().training_step(batch, batch_idx)
        for _ in range(2):
            out["loss"].item()  # sync: item
        out["loss"].sum().tolist()  # sync: tolist
        return out


def test_warn_mode_warns_once_per_call_site_at_the_users_line(tmp_path: Path) -> None:
    lines = marked_lines(OneItem.training_step)
    with pytest.warns(SyncWarning) as record:
        fit(SyncPointWarnings(include_cpu=True), OneItem(), tmp_path)
    ours = [w for w in record if issubclass(w.category, SyncWarning)]
    assert sorted((w.filename, w.lineno) for w in ours) == sorted(
        (__file__, ln) for ln in lines.values()
    )
    assert any("item synchronises" in str(w.message) and "self.log" in str(w.message) for w in ours)


def test_error_mode_raises_at_the_right_line_and_restores(tmp_path: Path) -> None:
    before = global_state.snapshot()
    cb = SyncPointWarnings(mode="error", include_cpu=True)
    line = marked_lines(OneItem.training_step)["item"]
    with pytest.raises(
        SyncPointError, match=rf"item at .*sync_points/test_callback.py:{line}.*\.item\(\)"
    ):
        fit(cb, OneItem(), tmp_path)
    assert [(f.kind, f.lineno, f.count) for f in cb.report] == [("item", line, 1)]
    assert global_state.diff(before, global_state.snapshot()) == {}


class ProgressBarLogging(BoringModel):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        out = super().training_step(batch, batch_idx)
        self.log("loss", out["loss"], prog_bar=True)
        return out


def test_framework_syncs_are_labelled_and_never_raise(tmp_path: Path, capsys: Any) -> None:
    cb = SyncPointWarnings(mode="error", include_cpu=True)
    fit(cb, ProgressBarLogging(), tmp_path, enable_progress_bar=True, max_steps=4)
    assert cb.user_findings == []
    framework = [f for f in cb.report if f.origin == "framework"]
    assert framework
    assert all("pytorch_lightning" in f.filename for f in framework)
    findings = cb.doctor_findings()
    assert findings
    assert all(f.severity == "info" for f in findings)
    assert any("progress bar" in (f.fix or "") for f in findings)


class Boom(OneItem):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if batch_idx == 1:
            raise RuntimeError("boom")
        return super().training_step(batch, batch_idx)


def test_restored_after_an_exception_mid_step_and_between_trainers(tmp_path: Path) -> None:
    before = global_state.snapshot()
    cb = SyncPointWarnings(mode="summary", include_cpu=True)
    with pytest.raises(RuntimeError, match="boom"):
        fit(cb, Boom(), tmp_path / "a")
    assert global_state.diff(before, global_state.snapshot()) == {}
    assert {f.kind for f in cb.report} == {"item", "tolist"}
    fit(cb, BoringModel(), tmp_path / "b")  # the same callback, a second Trainer
    assert cb.user_findings == []  # each fit reports its own
    assert global_state.diff(before, global_state.snapshot()) == {}
    pickle.loads(pickle.dumps(cb))


class ValidationItem(BoringModel):
    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        out = super().validation_step(batch, batch_idx)
        out["x"].item()  # sync: val-item
        return out


@pytest.mark.parametrize("validation", [False, True])
def test_validation_is_watched_only_when_asked(
    tmp_path: Path, validation: bool, capsys: Any
) -> None:
    cb = SyncPointWarnings(mode="summary", include_cpu=True, validation=validation)
    fit(cb, ValidationItem(), tmp_path, max_steps=2, limit_val_batches=2, val_check_interval=2)
    line = marked_lines(ValidationItem.validation_step)["val-item"]
    expected = [("item", line, 2)] if validation else []  # not the sanity check's
    assert [(f.kind, f.lineno, f.count) for f in cb.user_findings] == expected


def test_allow_ignores_a_call_site(tmp_path: Path, capsys: Any) -> None:
    line = marked_lines(OneItem.training_step)["item"]
    cb = SyncPointWarnings(
        mode="summary", include_cpu=True, allow=f"sync_points/test_callback.py:{line}"
    )
    fit(cb, OneItem(), tmp_path)
    assert [f.kind for f in cb.user_findings] == ["tolist"]


class DebugWarning(BoringModel):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        import warnings

        warnings.warn(CUDA_MSG, UserWarning, stacklevel=1)  # sync: dbg
        return super().training_step(batch, batch_idx)


def test_cuda_sync_debug_mode_through_injection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On CUDA the callback arms set_sync_debug_mode("warn"); here a fake API and warning."""
    modes: list[Any] = ["default"]
    monkeypatch.setattr(
        sync_points, "_sync_debug_api", lambda trainer: (lambda: modes[-1], modes.append)
    )
    before = global_state.snapshot()
    cb = SyncPointWarnings(mode="summary")
    fit(cb, DebugWarning(), tmp_path, max_steps=2)
    line = marked_lines(DebugWarning.training_step)["dbg"]
    assert [(f.kind, f.lineno, f.count) for f in cb.report] == [("cuda sync (debug mode)", line, 2)]
    assert modes[0] == modes[-1] == "default"
    assert "warn" in modes
    assert global_state.diff(before, global_state.snapshot()) == {}


class ItemEachStep(BoringModel):
    """``.item()`` every step; notes whether the step was watched."""

    def __init__(self) -> None:
        super().__init__()
        self.watched: list[bool] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.watched.append(patching.armed() is not None)
        out = super().training_step(batch, batch_idx)
        out["loss"].item()  # sync: item
        return out


@pytest.mark.parametrize("hub", [False, True], ids=["alone", "under-a-hub"])
def test_a_sampled_detector_watches_one_step_in_n_and_leaves_the_others_alone(
    tmp_path: Path, hub: bool
) -> None:
    before = global_state.snapshot()
    cb = SyncPointWarnings(mode="summary", include_cpu=True, sample_every_n_steps=8)
    model = ItemEachStep()
    starts: list[int] = []
    if hub:  # the doctor's: between samples the detector sleeps, its hooks not called at all
        start = cb.on_train_batch_start
        cb.on_train_batch_start = lambda t, *a: (starts.append(t.global_step), start(t, *a))  # type: ignore[method-assign]
        callbacks: list[Any] = [cb, HookHub([cb])]
        trainer = Trainer(callbacks=callbacks, **quiet_trainer_kwargs(tmp_path, max_steps=40))
        trainer.fit(model)
    else:
        fit(cb, model, tmp_path, max_steps=40)
    watched = [step for step, armed in enumerate(model.watched) if armed]
    assert watched == [*range(16), 16, 24, 32]  # every step at first, then one in 8
    if hub:  # called on the watched steps, and on the first step of each stretch it sleeps
        assert starts == sorted({*watched, 17, 25, 33})
    line = marked_lines(ItemEachStep.training_step)["item"]
    [finding] = cb.user_findings
    assert (finding.kind, finding.lineno, finding.count) == ("item", line, len(watched))
    assert finding.per_step == 1.0  # per watched step
    assert global_state.diff(before, global_state.snapshot()) == {}


class IndexingSeen(ItemEachStep):
    """Notes, each step, whether tensor indexing goes through the detector's wrapper."""

    def __init__(self) -> None:
        super().__init__()
        self.indexing_wrapped: list[bool] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.indexing_wrapped.append(hasattr(torch.Tensor.__getitem__, "__wrapped__"))
        return super().training_step(batch, batch_idx)


def test_a_long_stretch_between_samples_takes_the_indexing_wrappers_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # From SPARSE_FROM_STEP (64; 32 here) one step in 64 is watched: before such a stretch the
    # indexing wrappers, which a dataset's per-sample indexing calls, come out until the next
    # watched step; before a stretch of `every` steps they stay (a swap costs more).
    monkeypatch.setattr(sampling, "SPARSE_FROM_STEP", 32)
    before = global_state.snapshot()
    cb = SyncPointWarnings(mode="summary", include_cpu=True, sample_every_n_steps=8)
    model = IndexingSeen()
    trainer = Trainer(
        callbacks=[cb, HookHub([cb])],
        **quiet_trainer_kwargs(tmp_path, max_steps=70, max_epochs=2),
    )
    trainer.fit(model)
    watched = [step for step, armed in enumerate(model.watched) if armed]
    assert watched == [*range(16), 16, 24, 64]  # 32 is not a multiple of 8 * SPARSER
    wrapped = model.indexing_wrapped
    assert all(wrapped[s] for s in (*watched, *range(17, 24)))  # watched, or a short stretch
    assert not any(wrapped[s] for s in (*range(25, 64), *range(65, 70)))
    [finding] = cb.user_findings
    assert finding.count == len(watched)
    assert global_state.diff(before, global_state.snapshot()) == {}


def test_the_doctor_samples_the_sync_points_and_deep_watches_every_step() -> None:
    from lightning_speedpack.core.registry import DoctorContext, registered_diagnostics

    [spec] = [d for d in registered_diagnostics() if d.name == "sync_points"]
    assert spec.factory(DoctorContext()).sample_every_n_steps == 8
    assert spec.factory(DoctorContext(deep=True)).sample_every_n_steps == 1


def test_arguments_are_validated_at_once() -> None:
    with pytest.raises(
        ValueError, match="`mode` must be one of 'warn', 'error', 'summary', 'record', got 'x'"
    ):
        SyncPointWarnings(mode="x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`include_cpu` must be a bool, got 1"):
        SyncPointWarnings(include_cpu=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`allow` must be"):
        SyncPointWarnings(allow=[3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"`sample_every_n_steps` must be an int, got 2\.0"):
        SyncPointWarnings(sample_every_n_steps=2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`sample_every_n_steps` must be >= 1"):
        SyncPointWarnings(sample_every_n_steps=0)


def test_exported() -> None:
    assert lightning_speedpack.SyncPointWarnings is SyncPointWarnings
    assert lightning_speedpack.SyncPointError is SyncPointError


def test_docstring_example_runs(capsys: Any) -> None:
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    tests = finder.find(
        SyncPointWarnings, "SyncPointWarnings", globs={"SyncPointWarnings": SyncPointWarnings}
    )
    for test in tests:
        runner.run(test)
    assert runner.summarize(verbose=False).failed == 0
    assert runner.summarize(verbose=False).attempted > 0


def _ddp_rank(tmp: str) -> tuple[int, list[tuple[str, int, str, int]]]:
    cb = SyncPointWarnings(mode="summary", include_cpu=True)
    trainer = Trainer(
        callbacks=[cb], **quiet_trainer_kwargs(tmp, devices=2, strategy="ddp", max_steps=STEPS)
    )
    trainer.fit(OneItem())
    return trainer.global_rank, [(f.kind, f.lineno, f.origin, f.count) for f in cb.report]


@pytest.mark.ddp
@pytest.mark.timeout(240)
def test_real_ddp_records_on_every_rank(tmp_path: Path) -> None:
    results = run_ddp(_ddp_rank, str(tmp_path), timeout=200)
    line = marked_lines(OneItem.training_step)["item"]
    for rank, (got_rank, report) in enumerate(results):
        assert got_rank == rank
        assert ("item", line, "user", 2 * STEPS) in report
        # Lightning's per-step SIGTERM broadcast .item() (issues 21487/21640): framework.
        assert any(origin == "framework" and kind == "item" for kind, _, origin, _ in report)


def test_doctor_report_has_a_sync_section(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent("""
        from pytorch_lightning import Trainer
        from pytorch_lightning.demos.boring_classes import BoringModel

        class Model(BoringModel):
            def training_step(self, batch, batch_idx):
                out = super().training_step(batch, batch_idx)
                self.seen = out["loss"].item()  # LINE
                return out

        if __name__ == "__main__":
            Trainer(accelerator="cpu", max_steps=4, logger=False, enable_progress_bar=False,
                    enable_checkpointing=False, enable_model_summary=False).fit(Model())
    """)
    )
    line = next(i for i, text in enumerate(script.read_text().splitlines(), 1) if "# LINE" in text)
    result = run_script(script)
    assert result.exit_code == 0
    ours = [
        f
        for f in result.report.findings
        if f.component == "sync_points" and f.severity == "warning"
    ]
    assert len(ours) == 1
    assert ours[0].location is not None
    assert ours[0].location.endswith(f"train.py:{line}")
    assert ours[0].figures["count"] == 4
    assert ours[0].figures["per_step"] == 1.0
    assert ours[0].fix is not None
    assert ours[0].fix.startswith(".item() ->")
    assert result.report.runs[0].figures["syncs_per_step"] == 1.0


# --- tables in the run (issue 15) ----------------------------------------------------------------


def _csv_rows(path: Path) -> list[dict[str, str]]:
    import csv

    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


@each_namespace
def test_csv_logger_gets_the_sync_table_summary_and_findings(ns: Namespace, tmp_path: Path) -> None:
    import json

    class Chatty(ns.SizedBoringModel):  # type: ignore[misc, name-defined]
        """A step that reads the loss back to the host."""

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            out = super().training_step(batch, batch_idx)
            self.last = out["loss"].item()  # sync: item
            return out

    line = marked_lines(Chatty.training_step)["item"]
    logger = ns.sub("loggers").CSVLogger(tmp_path / "csv")
    trainer = ns.Trainer(
        callbacks=[SyncPointWarnings(mode="summary", include_cpu=True)],
        **quiet_trainer_kwargs(tmp_path, max_steps=STEPS, logger=logger, limit_val_batches=0),
    )
    trainer.fit(Chatty())
    log_dir = Path(logger.log_dir)
    (row,) = _csv_rows(log_dir / "speedpack_sync_points.csv")
    assert row["location"] == f"tests/sync_points/test_callback.py:{line}"
    assert (row["origin"], row["kind"], row["function"]) == ("user", "item", "training_step")
    assert (row["per_step"], row["steps_seen"], row["first_step"]) == ("1.0", str(STEPS), "0")
    summary = json.loads((log_dir / "speedpack_summary.json").read_text())
    assert summary["speedpack/syncs_per_step"] == 1.0
    assert summary["speedpack/findings/warning"] == 1  # the only pack callback: it logs findings
    (finding,) = _csv_rows(log_dir / "speedpack_findings.csv")
    assert (finding["id"], finding["location"]) == ("sync-item", row["location"])


@each_namespace
def test_without_a_logger_nothing_is_written(ns: Namespace, tmp_path: Path) -> None:
    trainer = ns.Trainer(
        callbacks=[SyncPointWarnings(mode="summary", include_cpu=True)],
        **quiet_trainer_kwargs(tmp_path, max_steps=2),
    )
    trainer.fit(ns.SizedBoringModel())
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith("speedpack")]


class MetricOnStep(BoringModel):
    """Lightning's documented torchmetrics pattern: the metric called in the step, the metric
    object logged with on_step=True."""

    def __init__(self) -> None:
        super().__init__()
        import torchmetrics

        self.train_acc = torchmetrics.classification.MulticlassAccuracy(num_classes=2)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        out = super().training_step(batch, batch_idx)
        preds = self.layer(batch).argmax(dim=-1)
        self.train_acc(preds, (batch[:, 0] > 0).long())  # sync: metric-call
        self.log("train_acc", self.train_acc, on_step=True, on_epoch=False)
        return out


def test_a_sync_inside_torchmetrics_is_placed_at_the_users_line_with_the_setting(
    tmp_path: Path,
) -> None:
    cb = SyncPointWarnings(mode="summary", include_cpu=True)
    fit(cb, MetricOnStep(), tmp_path)
    line = marked_lines(MetricOnStep.training_step)["metric-call"]
    findings = [f for f in cb.doctor_findings() if f.figures.get("library") == "torchmetrics"]
    assert findings, [f.location for f in cb.doctor_findings()]
    for finding in findings:  # never a line in site-packages alone
        assert finding.location == f"tests/sync_points/test_callback.py:{line}"
        assert finding.severity == "warning"
        assert "inside torchmetrics (torchmetrics/" in finding.message
        assert finding.figures["library_location"].startswith("torchmetrics/")
        assert "update(preds, target)" in (finding.fix or "")
        assert "on_epoch=True" in (finding.fix or "")
    assert not any("site-packages" in (f.location or "") for f in cb.doctor_findings())
