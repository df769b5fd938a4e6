"""SpeedAdvisor on real Trainers: each finding from a bad configuration, none from the fixed one."""

from __future__ import annotations

import pickle
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from pytorch_lightning import Callback, LightningModule, Trainer
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_speedpack import AdvisorFinding, DeviceInfo, SpeedAdvisor
from lightning_speedpack.advisor.rules import GPU_ONLY_IDS
from lightning_speedpack.core import events
from lightning_speedpack.core.events import BatchTransfer
from lightning_speedpack.doctor.runner import run_script
from tests.helpers import global_state
from tests.helpers.ddp import run_ddp
from tests.helpers.models import TinyCNN, quiet_trainer_kwargs
from tests.helpers.namespaces import Namespace, each_namespace

A100 = DeviceInfo("cuda", "NVIDIA A100", (8, 0), has_tensor_cores=True)


class SlowDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Each sample takes ``delay`` seconds to 'decode'."""

    def __init__(self, n: int = 64, width: int = 32, delay: float = 0.0) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, width, generator=g)
        self.y = torch.randn(n, 1, generator=g)
        self.delay = delay

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay:
            time.sleep(self.delay)
        return self.x[i], self.y[i]


class Configurable(LightningModule):
    """An MLP whose data-loading settings, widths and quirks each test picks."""

    def __init__(
        self,
        width: int = 32,
        batch_size: int = 16,
        num_workers: int = 0,
        persistent_workers: bool = False,
        delay: float = 0.0,
        step_sleep: float = 0.0,
        n: int = 64,
    ) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, 8))
        self.batch_size, self.num_workers, self.persistent = (
            batch_size,
            num_workers,
            persistent_workers,
        )
        self.delay, self.step_sleep, self.n = delay, step_sleep, n

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.step_sleep:
            time.sleep(self.step_sleep)  # a step that does real work, without using the cores
        x, y = batch
        return nn.functional.mse_loss(self.net(x).mean(1, keepdim=True), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(
            SlowDataset(self.n, delay=self.delay),
            batch_size=self.batch_size,
            num_workers=self.num_workers,
            persistent_workers=self.persistent,
        )


def fit(model: LightningModule, advisor: SpeedAdvisor, tmp_path: Path, **kw: Any) -> Trainer:
    trainer = Trainer(callbacks=[advisor], **quiet_trainer_kwargs(tmp_path, **kw))
    trainer.fit(model)
    return trainer


def advisor_(**kw: Any) -> SpeedAdvisor:
    """An advisor for tests that are not about data-wait.

    On a shared, loaded machine the loop's own gap between tiny steps can exceed 20% of them,
    so those tests raise the threshold out of reach.
    """
    kw.setdefault("verbose", False)
    kw.setdefault("data_wait_threshold", 0.99)
    return SpeedAdvisor(**kw)


def ids(advisor: SpeedAdvisor) -> list[str]:
    return [f.id for f in advisor.findings]


# --- construction ---------------------------------------------------------------------------


def test_arguments_are_validated_at_construction() -> None:
    with pytest.raises(ValueError, match=r"`measure_steps` must be a positive int, got 0"):
        SpeedAdvisor(measure_steps=0)
    with pytest.raises(
        ValueError, match=r"unknown fix\(es\) \['amp'\]; allowed: \['cudnn_benchmark'"
    ):
        SpeedAdvisor(apply=("cudnn_benchmark", "amp"))
    with pytest.raises(TypeError, match=r"write apply=\('channels_last',\)"):
        SpeedAdvisor(apply="channels_last")
    with pytest.raises(TypeError, match="`apply` must be a sequence of fix names, got 5"):
        SpeedAdvisor(apply=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`data_wait_threshold` must be in \[0, 1\), got 1.5"):
        SpeedAdvisor(data_wait_threshold=1.5)
    with pytest.raises(ValueError, match=r"measure_steps.*; .*data_wait_threshold"):
        SpeedAdvisor(measure_steps=-1, data_wait_threshold=-0.1)  # all problems at once
    with pytest.raises(TypeError, match="`device_info` must be a DeviceInfo"):
        SpeedAdvisor(device_info="cuda")  # type: ignore[arg-type]


# --- CPU findings ---------------------------------------------------------------------------


def test_clean_cpu_run_has_no_findings(tmp_path: Path) -> None:
    advisor = SpeedAdvisor(measure_steps=5, verbose=False)
    model = Configurable(num_workers=1, persistent_workers=True, step_sleep=0.05)
    fit(model, advisor, tmp_path, max_epochs=2)
    assert advisor.findings == []
    assert advisor.skipped == dict.fromkeys(
        sorted(GPU_ONLY_IDS), "the run trains on 'cpu', not a CUDA GPU"
    )
    assert advisor.measured_steps == 5
    assert advisor.data_wait_fraction is not None
    assert advisor.data_wait_fraction < 0.2


def test_data_loading_findings(tmp_path: Path) -> None:
    advisor = SpeedAdvisor(measure_steps=3, verbose=False)
    model = Configurable(batch_size=12, width=30, delay=0.01, n=48)  # 120 ms of loading per batch
    fit(model, advisor, tmp_path, max_epochs=2)
    assert ids(advisor) == [
        "dataloader-workers",
        "data-wait",
        "batch-size-multiple",
        "layer-dims-multiple",
        "layer-dims-multiple",
    ]
    by_id = {f.id: f for f in advisor.findings}
    assert by_id["dataloader-workers"].evidence == "train_dataloader: num_workers=0"
    wait = by_id["data-wait"]
    assert wait.figures["steps"] == 3
    assert advisor.data_wait_fraction is not None
    assert advisor.data_wait_fraction > 0.2
    assert wait.figures["data_wait_fraction"] == round(advisor.data_wait_fraction, 4)
    assert by_id["batch-size-multiple"].evidence == "train_dataloader: batch_size=12"
    assert [f.location for f in advisor.findings if f.id == "layer-dims-multiple"] == [
        "net.0",
        "net.2",
    ]


def test_persistent_workers_needs_several_epochs(tmp_path: Path) -> None:
    advisor = advisor_(measure_steps=2)
    fit(Configurable(num_workers=1, n=32), advisor, tmp_path / "a", max_epochs=2)
    assert ids(advisor) == ["persistent-workers"]
    assert advisor.findings[0].figures == {"planned_epochs": 2}
    # a single epoch restarts no workers: no finding
    fit(Configurable(num_workers=1, n=32), advisor, tmp_path / "b", max_epochs=1)
    assert ids(advisor) == []


class BadModel(Configurable):
    def __init__(self) -> None:
        super().__init__(num_workers=1, persistent_workers=True, n=32)
        self.net = nn.Sequential(nn.Linear(32, 8), nn.DataParallel(nn.Linear(8, 8)))
        self.conv = nn.Sequential(nn.Conv1d(1, 8, 1), nn.BatchNorm1d(8))

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
        optimizer.zero_grad(set_to_none=False)

    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        with torch.enable_grad():  # the bug: gradients recorded during validation
            return nn.functional.mse_loss(self.net(x).mean(1, keepdim=True), y)

    def val_dataloader(self) -> DataLoader[Any]:
        return DataLoader(SlowDataset(16), batch_size=8)


def test_model_findings(tmp_path: Path) -> None:
    advisor = advisor_(measure_steps=3)
    fit(BadModel(), advisor, tmp_path, max_epochs=1)
    assert ids(advisor) == ["conv-bias-before-bn", "dataparallel", "zero-grad", "eval-grad"]
    by_id = {f.id: f for f in advisor.findings}
    assert by_id["conv-bias-before-bn"].location == "conv.0"
    assert by_id["dataparallel"].location == "net.1"
    assert by_id["zero-grad"].evidence.startswith("net.0.weight still held a gradient tensor")
    assert by_id["eval-grad"].evidence == "grad mode was enabled in a forward during validation"


def test_eval_grad_without_inference_mode_and_after_the_table(tmp_path: Path) -> None:
    # no sanity check: the first validation runs after the measurement was reported
    advisor = advisor_(measure_steps=2)
    fit(BadModel(), advisor, tmp_path, max_epochs=1, inference_mode=False, num_sanity_val_steps=0)
    assert ids(advisor)[-1] == "eval-grad"


def test_zero_grad_fix_is_applied_and_removed(tmp_path: Path) -> None:
    advisor = advisor_(measure_steps=3, apply=("zero_grad_set_to_none",))
    model = BadModel()
    fit(model, advisor, tmp_path, max_epochs=1)
    assert "zero-grad" not in ids(advisor)
    assert advisor.applied == ["zero_grad_set_to_none"]
    assert "optimizer_zero_grad" not in vars(model)  # the module's own hook is back


# --- GPU-only findings with an injected device ------------------------------------------------


def test_gpu_findings_with_injected_device(tmp_path: Path) -> None:
    advisor = advisor_(measure_steps=2, device_info=A100)
    fit(TinyCNN(batch_size=16, n=64), advisor, tmp_path, max_epochs=1)
    gpu = [f for f in advisor.findings if f.id in GPU_ONLY_IDS]
    assert [f.id for f in gpu] == ["pin-memory", "precision", "cudnn-benchmark", "channels-last"]
    assert advisor.skipped == {}
    assert {f.id: f.severity for f in advisor.findings}["layer-dims-multiple"] == "warning"
    assert {f.id: f.fix for f in advisor.findings}["precision"] == "Trainer(precision='bf16-mixed')"


def test_apply_fixes_take_effect_and_global_state_is_restored(tmp_path: Path) -> None:
    before = global_state.snapshot()
    assert torch.backends.cudnn.benchmark is False
    seen: list[bool] = []

    class Probe(TinyCNN):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            seen.append(torch.backends.cudnn.benchmark)
            return super().training_step(batch, batch_idx)

    advisor = advisor_(
        measure_steps=2, apply=("cudnn_benchmark", "channels_last"), device_info=A100
    )
    model = Probe(batch_size=16, n=64)
    fit(model, advisor, tmp_path, max_epochs=1)
    assert "cudnn-benchmark" not in ids(advisor)
    assert "channels-last" not in ids(advisor)
    assert advisor.applied == ["channels_last", "cudnn_benchmark"]
    assert seen
    assert all(seen)
    assert torch.backends.cudnn.benchmark is False  # restored after fit
    conv = model.net[0]
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)  # the model's format now
    assert global_state.diff(before, global_state.snapshot()) == {}
    pickle.loads(pickle.dumps(advisor))


def test_global_state_restored_after_an_exception(tmp_path: Path) -> None:
    class Boom(TinyCNN):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if batch_idx == 1:
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

    before = global_state.snapshot()
    advisor = advisor_(apply=("cudnn_benchmark", "zero_grad_set_to_none"))
    model = Boom()
    with pytest.raises(RuntimeError, match="boom"):
        fit(model, advisor, tmp_path)
    assert global_state.diff(before, global_state.snapshot()) == {}
    assert "optimizer_zero_grad" not in vars(model)


def test_fewer_steps_than_measure_steps_still_reports(tmp_path: Path) -> None:
    advisor = advisor_(measure_steps=50)
    fit(Configurable(n=64), advisor, tmp_path, max_epochs=1)  # 4 steps, the first is warm-up
    assert advisor.measured_steps == 3
    assert "dataloader-workers" in ids(advisor)


def test_table_is_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    advisor = SpeedAdvisor(measure_steps=2, data_wait_threshold=0.99)
    fit(Configurable(batch_size=12), advisor, tmp_path, max_epochs=1)
    err = capsys.readouterr().err
    assert "SpeedAdvisor: 2 finding(s)" in err
    assert "dataloader-workers" in err
    assert "batch-size-multiple" in err
    assert "skipped channels-last, cudnn-benchmark, pin-memory, precision" in err


# --- doctor --------------------------------------------------------------------------------------


def test_doctor_report_includes_the_advisor(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            f"""
            from pytorch_lightning import Trainer
            from tests.helpers.models import SizedBoringModel, quiet_trainer_kwargs

            trainer = Trainer(**quiet_trainer_kwargs({str(tmp_path)!r}, max_steps=4))
            trainer.fit(SizedBoringModel(batch_size=12))
            """
        )
    )
    result = run_script(script)
    assert result.exit_code == 0
    advisor = [f for f in result.report.findings if f.component == "advisor"]
    # BoringModel's Linear(32, 2): 2 is below 8, not worth padding, so no layer-dims finding
    assert {f.id for f in advisor} >= {"batch-size-multiple"}
    # num_workers=0, but the run (in-memory data) was measured model-bound: "add workers"
    # would contradict the measurement
    assert result.report.runs[0].figures["bound"] == "model"
    assert "dataloader-workers" not in {f.id for f in advisor}
    batch = next(f for f in advisor if f.id == "batch-size-multiple")
    assert batch.location == "train_dataloader"
    assert batch.message.endswith("(train_dataloader: batch_size=12)")
    # the figure counts the run's own findings; the checks read for a GPU come on top
    own = [f for f in advisor if f.id not in GPU_ONLY_IDS]
    assert result.report.runs[0].figures["advisor_findings"] == len(own)
    assert {f.id for f in advisor if f.pays_on == "GPU"} >= {"pin-memory", "precision"}


def test_findings_convert_to_doctor_findings() -> None:
    advisor = SpeedAdvisor()
    advisor.findings = [AdvisorFinding("zero-grad", "warning", "m", "e", "f", location="w")]
    (doc,) = advisor.doctor_findings()
    assert (doc.component, doc.id, doc.location) == ("advisor", "zero-grad", "w")
    assert advisor.doctor_figures() == {"advisor_findings": 1}


# --- DDP -----------------------------------------------------------------------------------------


class BNModel(Configurable):
    def __init__(self) -> None:
        super().__init__(batch_size=4, num_workers=1, persistent_workers=True, n=32)
        self.net = nn.Sequential(nn.Linear(32, 8, bias=False), nn.BatchNorm1d(8), nn.Linear(8, 8))


def _ddp_advisor(tmp: str) -> tuple[int, list[str], str | None]:
    advisor = advisor_(measure_steps=2)
    trainer = Trainer(
        callbacks=[advisor],
        **quiet_trainer_kwargs(tmp, devices=2, strategy="ddp", max_epochs=1),
    )
    trainer.fit(BNModel())
    sync = next((f for f in advisor.findings if f.id == "sync-batchnorm"), None)
    return trainer.global_rank, [f.id for f in advisor.findings], sync and sync.evidence


@pytest.mark.ddp
@pytest.mark.timeout(240)
def test_under_ddp_every_rank_checks_without_collectives(tmp_path: Path) -> None:
    results = run_ddp(_ddp_advisor, str(tmp_path), timeout=180)
    # batch 4 is both tiny for BatchNorm and not a multiple of 8; 1 worker fits 1 core per rank
    for rank, found, evidence in results:
        assert found == ["batch-size-multiple", "sync-batchnorm"], rank
        assert evidence == "1 BatchNorm layer(s) (first: net.1), per-device batch 4, 2 processes"


# --- tables in the run (issue 15) ----------------------------------------------------------------


@each_namespace
def test_csv_logger_gets_the_advisor_table_and_counts(ns: Namespace, tmp_path: Path) -> None:
    import csv
    import json

    advisor = advisor_(measure_steps=2)
    logger = ns.sub("loggers").CSVLogger(tmp_path / "csv")
    trainer = ns.Trainer(
        callbacks=[advisor],
        **quiet_trainer_kwargs(tmp_path, max_steps=4, logger=logger, limit_val_batches=0),
    )
    trainer.fit(ns.SizedBoringModel())
    log_dir = Path(logger.log_dir)
    with (log_dir / "speedpack_advisor.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["id"] for r in rows] == ids(advisor)
    workers = next(r for r in rows if r["id"] == "dataloader-workers")
    assert workers == {
        "id": "dataloader-workers",
        "severity": "warning",
        "evidence": "train_dataloader: num_workers=0",
        "fix": next(f.fix for f in advisor.findings if f.id == "dataloader-workers"),
        "location": "train_dataloader",
    }
    summary = json.loads((log_dir / "speedpack_summary.json").read_text())
    reported = advisor.doctor_findings()  # its own, then those read for a GPU (info)
    assert len(reported) > len(advisor.findings)
    for severity in ("error", "warning", "info"):
        expected = sum(f.severity == severity for f in advisor.findings)
        assert summary[f"speedpack/advisor/{severity}"] == expected
        every = sum(f.severity == severity for f in reported)
        assert summary[f"speedpack/findings/{severity}"] == every  # the last: logs findings
    assert summary["speedpack/advisor_findings"] == len(advisor.findings)
    assert summary["speedpack/advisor/data_wait_fraction"] == round(
        advisor.data_wait_fraction or 0.0, 4
    )


# --- the measured worker count, from the data profiler --------------------------------------


@pytest.mark.parametrize("advisor_first", [True, False], ids=["advisor-first", "profiler-first"])
def test_dataloader_workers_carries_the_measured_worker_count(
    tmp_path: Path, advisor_first: bool
) -> None:
    from lightning_speedpack import DataPipelineProfiler

    advisor = advisor_(measure_steps=2)
    profiler = DataPipelineProfiler(probe="start", probe_batches=3, model_steps=2)
    callbacks: list[Any] = [advisor, profiler] if advisor_first else [profiler, advisor]
    before = global_state.snapshot()
    trainer = Trainer(callbacks=callbacks, **quiet_trainer_kwargs(tmp_path, max_steps=4))
    trainer.fit(Configurable(delay=0.01, n=64))  # 160 ms per batch of 16: data-bound
    assert global_state.diff(before, global_state.snapshot()) == {}  # unsubscribed after fit
    assert profiler.verdict is not None
    assert profiler.verdict.bound == "data"
    (workers,) = (f for f in advisor.findings if f.id == "dataloader-workers")
    needed = profiler.verdict.workers_needed
    assert needed is not None
    assert needed >= 2
    assert workers.figures["workers_needed"] == needed
    assert f"num_workers={needed}," in workers.fix
    assert "measured" in workers.fix


def test_without_the_profiler_the_rule_of_thumb_stays(tmp_path: Path) -> None:
    advisor = advisor_(measure_steps=2)
    fit(Configurable(), advisor, tmp_path, max_steps=3)
    (workers,) = (f for f in advisor.findings if f.id == "dataloader-workers")
    assert "workers_needed" not in workers.figures
    assert "measured" not in workers.fix


# --- pin-memory with the measured copy, from the step timeline --------------------------------


class _PublishesCopy(Callback):
    """Stands in for StepTimeline: publishes a measured copy of ``share`` after each batch."""

    def __init__(self, share: float) -> None:
        self.share = share

    def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
        measured = BatchTransfer(100.0 * self.share, 100.0, trainer.global_step)
        events.publish(events.BATCH_TRANSFER, measured)


def _pin_memory(advisor: SpeedAdvisor) -> list[AdvisorFinding]:
    return [f for f in advisor.findings if f.id == "pin-memory"]


def _fit_with(callbacks: list[Any], tmp_path: Path, steps: int = 4) -> None:
    trainer = Trainer(callbacks=callbacks, **quiet_trainer_kwargs(tmp_path, max_steps=steps))
    trainer.fit(TinyCNN(batch_size=16, n=64))


@pytest.mark.slow
def test_pin_memory_is_silent_when_the_measured_copy_is_under_2_percent(tmp_path: Path) -> None:
    advisor = advisor_(measure_steps=2, device_info=A100)
    _fit_with([advisor, _PublishesCopy(0.019)], tmp_path)
    assert _pin_memory(advisor) == []
    assert advisor.findings  # the other findings are still there
    assert events.subscriber_count() == 0


@pytest.mark.slow
def test_pin_memory_carries_the_measured_copy_share(tmp_path: Path) -> None:
    advisor = advisor_(measure_steps=2, device_info=A100)
    _fit_with([advisor, _PublishesCopy(0.25)], tmp_path)
    (pin,) = _pin_memory(advisor)
    assert pin.evidence.endswith(
        "measured: the copy to the device takes 25.0% of the step (25.0 of 100.0 ms per batch)"
    )
    assert pin.figures["copy_share"] == 0.25
    assert events.subscriber_count() == 0
    pickle.loads(pickle.dumps(advisor))


@pytest.mark.slow
def test_pin_memory_follows_the_copy_measured_after_the_table(tmp_path: Path) -> None:
    """Reported after 2 steps under 2%; the run's copy then grows, and the finding comes back."""

    class Growing(_PublishesCopy):
        def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
            self.share = 0.01 if trainer.global_step <= 3 else 0.5
            super().on_train_batch_end(trainer, *args)

    class Watch(Callback):
        def __init__(self) -> None:
            self.reported: list[str] | None = None

        def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
            if self.reported is None and advisor.measured_steps:
                self.reported = [f.id for f in advisor.findings]

    advisor = advisor_(measure_steps=2, device_info=A100)
    watch = Watch()
    _fit_with([advisor, Growing(0.0), watch], tmp_path, steps=4)
    assert watch.reported is not None
    assert "pin-memory" not in watch.reported  # the table, at step 3: 1% of the step
    (pin,) = _pin_memory(advisor)
    assert pin.figures["copy_share"] == 0.5
    assert [f.id for f in advisor.findings][:2] == ["dataloader-workers", "pin-memory"]


@pytest.mark.slow
def test_pin_memory_without_a_timeline_says_the_copy_was_not_measured(tmp_path: Path) -> None:
    advisor = advisor_(measure_steps=2, device_info=A100)
    _fit_with([advisor], tmp_path)
    (pin,) = _pin_memory(advisor)
    assert pin.evidence == "train_dataloader: pin_memory=False on NVIDIA A100; copy not measured"


class _SlowCopy(TinyCNN):
    """Its own transfer takes 30 ms: a copy that is a large share of a tiny step."""

    def transfer_batch_to_device(self, batch: Any, device: Any, dataloader_idx: int) -> Any:
        time.sleep(0.03)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)


@pytest.mark.slow
def test_pin_memory_carries_the_step_timelines_share(tmp_path: Path) -> None:
    from lightning_speedpack import StepTimeline

    advisor = advisor_(measure_steps=2, device_info=A100)
    timeline = StepTimeline(nvtx=False)
    trainer = Trainer(callbacks=[advisor, timeline], **quiet_trainer_kwargs(tmp_path, max_steps=4))
    trainer.fit(_SlowCopy(batch_size=16, n=64))
    measured = timeline.measured_transfer()
    assert measured is not None
    pins = _pin_memory(advisor)
    # the advice follows the timeline's own figure for the whole run, whichever side of 2%
    assert [f.figures["copy_share"] for f in pins] == (
        [round(measured.share, 4)] if measured.share >= 0.02 else []
    )
    assert events.subscriber_count() == 0


class _ForwardHooks(Callback):
    """Counts the forward hooks on the module while it trains."""

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        self.hooks = len(pl_module._forward_hooks)


@pytest.mark.parametrize("validates", [True, False])
def test_the_eval_grad_watch_hooks_the_forward_only_when_a_validation_loop_can_run(
    tmp_path: Path, validates: bool
) -> None:
    from pytorch_lightning.demos.boring_classes import BoringModel

    seen = _ForwardHooks()
    trainer = Trainer(
        callbacks=[SpeedAdvisor(verbose=False), seen],
        **quiet_trainer_kwargs(
            tmp_path, max_steps=2, limit_val_batches=2 if validates else 0, num_sanity_val_steps=0
        ),
    )
    trainer.fit(BoringModel())
    # Without a validation loop a hook would be one more Python call in every forward.
    assert seen.hooks == (1 if validates else 0)
