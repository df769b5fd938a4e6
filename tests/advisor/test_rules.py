"""Each advisor check fires on a minimal bad configuration and stays silent on the fixed one."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_speedpack.advisor import rules as _advice
from lightning_speedpack.advisor.data_loading import MIN_WAIT_STEPS, WORKERS_WAIT_THRESHOLD
from lightning_speedpack.advisor.rules import AdvisorFinding, DeviceInfo, LoaderSettings
from lightning_speedpack.core.events import BatchTransfer, DataVerdict

CPU = DeviceInfo("cpu")
A100 = DeviceInfo("cuda", "NVIDIA A100", (8, 0), has_tensor_cores=True)
V100 = DeviceInfo("cuda", "Tesla V100", (7, 0), has_tensor_cores=True)
P100 = DeviceInfo("cuda", "Tesla P100", (6, 0), has_tensor_cores=False)


def ids(findings: list[AdvisorFinding]) -> list[str]:
    return [f.id for f in findings]


def loader(**kw: object) -> LoaderSettings:
    return LoaderSettings("train_dataloader", **kw)  # type: ignore[arg-type]


def test_finding_ids_are_the_issue_table() -> None:
    assert _advice.FINDING_IDS == (
        "dataloader-workers",
        "pin-memory",
        "persistent-workers",
        "data-wait",
        "batch-size-multiple",
        "layer-dims-multiple",
        "conv-bias-before-bn",
        "precision",
        "cudnn-benchmark",
        "channels-last",
        "dataparallel",
        "zero-grad",
        "eval-grad",
        "sync-batchnorm",
    )
    assert {"pin-memory", "precision", "cudnn-benchmark", "channels-last"} == _advice.GPU_ONLY_IDS


def test_dataloader_workers() -> None:
    (f,) = _advice.check_dataloader_workers(loader(num_workers=0), cpu_cores=4)
    assert (f.id, f.severity, f.location) == ("dataloader-workers", "warning", "train_dataloader")
    assert f.evidence == "train_dataloader: num_workers=0"
    assert "num_workers=4" in f.fix
    assert _advice.check_dataloader_workers(loader(num_workers=4), cpu_cores=4) == []
    (f,) = _advice.check_dataloader_workers(loader(num_workers=5), cpu_cores=4)
    assert f.figures == {"num_workers": 5, "cpu_cores_per_process": 4}
    # 8 cores shared by 4 DDP processes: 2 per process
    (f,) = _advice.check_dataloader_workers(loader(num_workers=3), cpu_cores=8, local_processes=4)
    assert f.fix == "DataLoader(num_workers=2, ...)"
    assert _advice.check_dataloader_workers(loader(num_workers=2), 8, local_processes=4) == []


def test_pin_memory_only_on_gpu() -> None:
    (f,) = _advice.check_pin_memory(loader(pin_memory=False), A100)
    assert f.id == "pin-memory"
    assert "NVIDIA A100" in f.evidence
    assert _advice.check_pin_memory(loader(pin_memory=True), A100) == []
    assert _advice.check_pin_memory(loader(pin_memory=False), CPU) == []


def test_persistent_workers() -> None:
    bad = loader(num_workers=2, persistent_workers=False)
    (f,) = _advice.check_persistent_workers(bad, planned_epochs=3)
    assert f.evidence == "train_dataloader: num_workers=2, persistent_workers=False, 3 epochs"
    assert ids(_advice.check_persistent_workers(bad, planned_epochs=None)) == ["persistent-workers"]
    assert _advice.check_persistent_workers(bad, planned_epochs=1) == []
    assert _advice.check_persistent_workers(loader(num_workers=2, persistent_workers=True), 3) == []
    assert _advice.check_persistent_workers(loader(num_workers=0), 3) == []


def test_data_wait() -> None:
    (f,) = _advice.check_data_wait(wait_s=0.3, step_s=0.7, steps=10)
    assert (f.id, f.severity) == ("data-wait", "warning")
    assert f.figures == {"data_wait_fraction": 0.3, "steps": 10}
    assert f.evidence == "measured over 10 steps: 30.0 ms waiting vs 70.0 ms in the step, per step"
    assert "CachedDataset" in f.fix
    (f,) = _advice.check_data_wait(wait_s=0.6, step_s=0.4, steps=10)
    assert f.severity == "error"
    assert _advice.check_data_wait(wait_s=0.2, step_s=0.8, steps=10) == []  # exactly 20%: fine
    assert _advice.check_data_wait(wait_s=0.3, step_s=0.7, steps=10, threshold=0.5) == []
    # 0.3 ms per step of "waiting" is the loop's own bookkeeping, not data loading
    assert _advice.check_data_wait(wait_s=0.003, step_s=0.001, steps=10) == []
    assert _advice.check_data_wait(wait_s=0.0, step_s=0.0, steps=0) == []


def test_batch_size_multiple() -> None:
    (f,) = _advice.check_batch_size_multiple(12, CPU)
    assert (f.severity, f.evidence) == ("info", "train_dataloader: batch_size=12")
    assert f.fix.startswith("batch_size=16 or 8")
    assert "BatchSizeTuner" in f.fix
    (f,) = _advice.check_batch_size_multiple(3, A100)
    assert f.severity == "warning"
    assert f.fix.startswith("batch_size=8,")
    assert _advice.check_batch_size_multiple(16, A100) == []
    assert _advice.check_batch_size_multiple(None, A100) == []


def test_layer_dims_one_finding_per_module_and_vocab_called_out() -> None:
    model = nn.Sequential(nn.Linear(3, 64), nn.ReLU(), nn.Linear(64, 100), nn.Linear(100, 33708))
    findings = _advice.check_layer_dims(model, A100)
    assert [(f.location, f.severity, f.evidence) for f in findings] == [
        ("2", "warning", "2: out_features=100"),  # in_features=3 is below 8: not reported
        ("3", "warning", "3: in_features=100, out_features=33708"),
    ]
    assert "output vocabulary" in findings[1].message
    assert findings[1].fix.startswith("pad to in_features=104, out_features=33712")
    assert [f.severity for f in _advice.check_layer_dims(model, CPU)] == ["info", "info"]
    assert _advice.check_layer_dims(nn.Sequential(nn.Linear(3, 64), nn.Linear(64, 1)), A100) == []


def test_conv_bias_before_batchnorm() -> None:
    bad = nn.Sequential(nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU())
    (f,) = _advice.check_conv_bias_before_bn(bad)
    assert (f.location, f.evidence) == ("0", "0 (Conv2d, bias=True) -> 1 (BatchNorm2d)")
    good = nn.Sequential(nn.Conv2d(3, 16, 3, bias=False), nn.BatchNorm2d(16))
    assert _advice.check_conv_bias_before_bn(good) == []

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(16, 16, 3)
            self.bn1 = nn.BatchNorm2d(16)
            self.conv2 = nn.Conv2d(16, 16, 3)  # followed by nothing
            self.relu = nn.ReLU()

    model = nn.Sequential()
    model.add_module("stem", nn.Conv2d(3, 16, 3))
    model.add_module("block", Block())
    assert [f.location for f in _advice.check_conv_bias_before_bn(model)] == ["block.conv1"]


def test_precision_on_tensor_core_gpus_only() -> None:
    (f,) = _advice.check_precision("32-true", A100)
    assert f.fix == "Trainer(precision='bf16-mixed')"
    (f,) = _advice.check_precision("32-true", V100)
    assert f.fix == "Trainer(precision='16-mixed')"
    assert _advice.check_precision("bf16-mixed", A100) == []
    assert _advice.check_precision("32-true", P100) == []
    assert _advice.check_precision("32-true", CPU) == []


def test_cudnn_benchmark() -> None:
    conv = nn.Sequential(nn.Conv2d(3, 8, 3))
    (f,) = _advice.check_cudnn_benchmark(conv, benchmark=False, fixed_shapes=True, device=A100)
    assert f.id == "cudnn-benchmark"
    assert "Trainer(benchmark=True)" in f.fix
    assert _advice.check_cudnn_benchmark(conv, True, True, A100) == []
    assert _advice.check_cudnn_benchmark(conv, False, False, A100) == []
    assert _advice.check_cudnn_benchmark(conv, False, None, A100) == []
    assert _advice.check_cudnn_benchmark(nn.Linear(8, 8), False, True, A100) == []
    assert _advice.check_cudnn_benchmark(conv, False, True, CPU) == []


def test_channels_last() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 1), nn.Conv2d(8, 8, 3))
    (f,) = _advice.check_channels_last(model, A100)
    # the 1x1 conv's weight is already contiguous in both formats
    assert (f.location, f.evidence) == ("0", "2 Conv2d not channels_last: 0, 2")
    assert _advice.check_channels_last(model, CPU) == []
    model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    assert _advice.check_channels_last(model, A100) == []


def test_dataparallel() -> None:
    model = nn.Sequential(nn.DataParallel(nn.Linear(8, 8)))
    (f,) = _advice.check_dataparallel(model)
    assert (f.location, f.evidence) == ("0", "0 is nn.DataParallel")
    assert _advice.check_dataparallel(nn.Linear(8, 8)) == []


def test_zero_grad_and_eval_grad() -> None:
    (f,) = _advice.check_zero_grad("net.0.weight", step=3)
    assert f.evidence == "net.0.weight still held a gradient tensor before backward at step 3"
    assert _advice.check_zero_grad(None) == []
    (f,) = _advice.check_eval_grad("validation_step returned a tensor that requires grad")
    assert f.location == "validation_step"
    assert _advice.check_eval_grad(None) == []


def test_sync_batchnorm() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8))
    (f,) = _advice.check_sync_batchnorm(model, world_size=2, per_device_batch=4)
    assert (f.severity, f.location) == ("info", "1")
    assert f.figures == {"per_device_batch": 4, "world_size": 2}
    assert _advice.check_sync_batchnorm(model, world_size=1, per_device_batch=4) == []
    assert _advice.check_sync_batchnorm(model, world_size=2, per_device_batch=32) == []
    synced = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    assert _advice.check_sync_batchnorm(synced, world_size=2, per_device_batch=4) == []


def test_to_finding_and_device_info(monkeypatch: pytest.MonkeyPatch) -> None:
    f = AdvisorFinding(
        "pin-memory",
        "warning",
        "pinned memory is off",
        "pin_memory=False",
        "DataLoader(pin_memory=True)",
        location="train_dataloader",
    )
    doc = f.to_finding()
    assert (doc.component, doc.id, doc.severity, doc.location, doc.fix) == (
        "advisor",
        "pin-memory",
        "warning",
        "train_dataloader",
        "DataLoader(pin_memory=True)",
    )
    assert doc.message == "pinned memory is off (pin_memory=False)"
    assert doc.figures == {"evidence": "pin_memory=False"}

    assert DeviceInfo.from_device(torch.device("cpu")) == CPU
    assert _advice.gpu_skip_reason(CPU) == "the run trains on 'cpu', not a CUDA GPU"
    assert _advice.gpu_skip_reason(A100) is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    assert DeviceInfo.from_device(torch.device("cuda", 0)) == DeviceInfo(
        "cuda", "Tesla T4", (7, 5), has_tensor_cores=True
    )
    assert not DeviceInfo("cuda", "", (7, 5), True).supports_bf16
    assert A100.supports_bf16


# --- dataloader-workers with a measured verdict (from the data profiler) ---------------------


def _measured(bound: str, workers: int | None = 6) -> DataVerdict:
    return DataVerdict(bound, 300.0, 2400.0, workers, 400.0, num_workers=0)


def test_a_measured_data_bound_verdict_replaces_the_rule_of_thumb() -> None:
    loader = LoaderSettings("train_dataloader", num_workers=0, batch_size=16)
    (rule,) = _advice.check_dataloader_workers(loader, cpu_cores=2)
    (measured,) = _advice.with_measured_workers([rule], _measured("data"))
    assert measured.id == "dataloader-workers"
    assert measured.location == "train_dataloader"
    assert "num_workers=6" in measured.fix
    assert "num_workers=2" in rule.fix  # the rule of thumb (2 cores) it replaced
    assert measured.figures["workers_needed"] == 6
    assert measured.figures["per_worker_samples_per_sec"] == 400.0


def test_a_loader_with_the_workers_it_needs_is_not_told_to_add_more() -> None:
    """The verdict asked for as many workers as the loader has: no "more worker processes"."""
    enough = DataVerdict("data", 11328.0, 26546.0, 1, 28459.0, num_workers=1)
    assert _advice.with_measured_workers([], enough) == []
    fewer = DataVerdict("data", 11328.0, 26546.0, 2, 20000.0, num_workers=1)
    (advice,) = _advice.with_measured_workers([], fewer)
    assert "num_workers=2" in advice.fix


def test_a_data_bound_run_with_workers_gets_the_finding() -> None:
    other = AdvisorFinding("pin-memory", "warning", "off", "pin_memory=False", "pin it")
    found = _advice.with_measured_workers([other], _measured("data"))
    assert [f.id for f in found] == ["dataloader-workers", "pin-memory"]


@pytest.mark.parametrize("verdict", [None, _measured("model"), _measured("data", workers=None)])
def test_verdicts_without_the_runs_data_wait_leave_the_findings_alone(
    verdict: DataVerdict | None,
) -> None:
    loader = LoaderSettings("train_dataloader", num_workers=0, batch_size=16)
    found = _advice.check_dataloader_workers(loader, cpu_cores=2)
    assert _advice.with_measured_workers(found, verdict) == found


def _model_bound_after_the_run(wait: float, ms: float = 5.0) -> DataVerdict:
    return DataVerdict("model", 9000.0, 1200.0, None, 4500.0, 0, wait, ms)


def test_add_workers_is_dropped_when_the_run_measured_model_bound() -> None:
    """Issue 29 (and 24's transformer example): 1% data wait, yet "add workers" was advised."""
    loader = LoaderSettings("train_dataloader", num_workers=0, batch_size=16)
    found = _advice.check_dataloader_workers(loader, cpu_cores=2)
    assert [f.id for f in found] == ["dataloader-workers"]
    assert _advice.with_measured_workers(found, _model_bound_after_the_run(0.01)) == []
    assert _advice.with_measured_workers(found, _model_bound_after_the_run(0.12)) == []
    # a model-bound verdict from the probe alone (the run not checked yet) leaves the rule
    assert _advice.with_measured_workers(found, _measured("model")) == found


def test_a_data_bound_verdict_the_run_refuted_takes_its_workers_advice_with_it() -> None:
    early = _advice.with_measured_workers([], _measured("data"))
    assert [f.id for f in early] == ["dataloader-workers"]
    assert _advice.with_measured_workers(early, _model_bound_after_the_run(0.3)) == []


def test_too_many_workers_stays_whatever_the_verdict() -> None:
    loader = LoaderSettings("train_dataloader", num_workers=8, batch_size=16)
    found = _advice.check_dataloader_workers(loader, cpu_cores=2)
    assert _advice.with_measured_workers(found, _model_bound_after_the_run(0.0)) == found


def test_workers_that_cannot_close_the_gap_are_not_advised() -> None:
    loader = LoaderSettings("train_dataloader", num_workers=0, batch_size=16)
    found = _advice.check_dataloader_workers(loader, cpu_cores=2)
    capped = DataVerdict("data", 150.0, 36000.0, 1, 150.0, 0, 0.9, 40.0, workers_close_gap=False)
    assert _advice.with_measured_workers(found, capped) == []


# --- dataloader-workers against the advisor's own measured data wait (issue 24) --------------


def _no_workers() -> list[AdvisorFinding]:
    return _advice.check_dataloader_workers(loader(num_workers=0), cpu_cores=4)


def test_num_workers_0_is_info_when_the_step_hardly_waits_for_data() -> None:
    """Issue 24: the transformer example waited 1% of its step for data, yet "add workers"."""
    (f,) = _advice.with_own_data_wait(_no_workers(), 0.0123, steps=20)
    assert (f.id, f.severity, f.location) == ("dataloader-workers", "info", "train_dataloader")
    assert f.evidence == (
        "train_dataloader: num_workers=0; measured: the step waits 1% of its time for data; "
        "workers would not pay here"
    )
    assert f.message == (
        "batches are loaded in the training process, and the step hardly waits for them"
    )
    assert f.fix == (
        "none while loading stays this fast; if it gets slower (decoding, augmentation, remote "
        "storage): DataLoader(num_workers=4, ...)"
    )
    assert f.figures == {
        "num_workers": 0,
        "cpu_cores_per_process": 4,
        "data_wait_fraction": 0.0123,
        "steps": 20,
    }
    (f,) = _advice.with_own_data_wait(_no_workers(), 0.004, steps=5)
    assert "waits 0.4% of its time" in f.evidence


@pytest.mark.parametrize(
    ("fraction", "steps"),
    [
        (0.05, 20),  # exactly 5%: not under it
        (0.30, 20),  # a real wait
        (0.01, 4),  # too few steps to trust the figure
        (None, 0),  # not measured
    ],
)
def test_num_workers_0_stays_a_warning_unless_a_small_wait_was_measured(
    fraction: float | None, steps: int
) -> None:
    assert _advice.with_own_data_wait(_no_workers(), fraction, steps) == _no_workers()


def test_the_wait_threshold_and_steps_are_named_constants() -> None:
    assert WORKERS_WAIT_THRESHOLD == 0.05
    assert MIN_WAIT_STEPS == 5
    found = _no_workers()
    assert _advice.with_own_data_wait(found, 0.08, 3, threshold=0.1, min_steps=3)[0].severity == (
        "info"
    )


def test_more_workers_than_cores_stays_whatever_the_wait() -> None:
    found = _advice.check_dataloader_workers(loader(num_workers=8), cpu_cores=2)
    other = AdvisorFinding("data-wait", "warning", "waits", "e", "fix")
    assert _advice.with_own_data_wait([*found, other], 0.0, steps=50) == [*found, other]


def test_a_measured_worker_count_is_info_too_when_the_run_hardly_waited() -> None:
    (measured,) = _advice.with_measured_workers(_no_workers(), _measured("data"))
    (f,) = _advice.with_own_data_wait([measured], 0.02, steps=10)
    assert f.severity == "info"
    assert f.fix.endswith("DataLoader(num_workers=6, ...)")  # the count it measured
    assert f.figures["workers_needed"] == 6


@pytest.mark.parametrize(
    ("bound", "fraction", "ms", "kept"),
    [
        ("model", 0.03, 5.0, False),  # the loader hardly kept the step waiting
        ("model", 0.30, 0.4, False),  # a tiny model's own loop between batches
        ("model", 0.30, 5.0, True),  # a real wait a worker would overlap
        ("data", 0.90, 40.0, False),  # the data-bound finding says it, with the fix
        ("unknown", None, None, True),  # nothing measured: the advisor's own figure stands
    ],
)
def test_data_wait_follows_the_loaders_measured_wait(
    bound: str, fraction: float | None, ms: float | None, kept: bool
) -> None:
    wait = AdvisorFinding("data-wait", "error", "72% waits", "hooks", "fix")
    measured = DataVerdict(bound, 1.0, 2.0, None, None, 0, fraction, ms)
    assert (_advice.with_measured_wait([wait], measured) == [wait]) is kept


# --- pin-memory with the measured copy, from the step timeline -------------------------------


def _pin() -> AdvisorFinding:
    (f,) = _advice.check_pin_memory(loader(pin_memory=False), A100)
    return f


def _copy(transfer_ms: float, step_ms: float, **kw: object) -> BatchTransfer:
    return BatchTransfer(transfer_ms, step_ms, 20, **kw)  # type: ignore[arg-type]


def test_pin_memory_without_a_measurement_says_so() -> None:
    other = AdvisorFinding("data-wait", "warning", "waits", "e", "fix")
    kept, passed = _advice.with_measured_copy([_pin(), other], None)
    assert kept.evidence == f"{_pin().evidence}; copy not measured"
    assert (kept.message, kept.fix, kept.figures) == (_pin().message, _pin().fix, {})
    assert passed is other
    # a measurement of no batch at all is none either
    (kept,) = _advice.with_measured_copy([_pin()], BatchTransfer(0.0, 0.0, 0))
    assert kept.evidence.endswith("; copy not measured")


def test_pin_memory_is_silent_when_the_copy_is_under_2_percent_of_the_step() -> None:
    other = AdvisorFinding("data-wait", "warning", "waits", "e", "fix")
    assert _advice.with_measured_copy([_pin(), other], _copy(1.9, 100.0)) == [other]
    assert _advice.with_measured_copy([_pin()], _copy(0.0, 100.0)) == []
    # a custom threshold
    assert _advice.with_measured_copy([_pin()], _copy(4.0, 100.0), threshold=0.05) == []


def test_pin_memory_carries_the_measured_copy_share() -> None:
    # FIELD.md's Nsight hunt: 13.6 ms copying 154,140,672 bytes at ~11.3 GB/s, per batch
    measured = _copy(13.6, 186.0, bytes_per_batch=154_140_672, gb_per_sec=11.3)
    (f,) = _advice.with_measured_copy([_pin()], measured)
    assert (f.id, f.severity, f.location, f.fix) == ("pin-memory", "warning", *_pin_rest())
    assert f.evidence == (
        "train_dataloader: pin_memory=False on NVIDIA A100; measured: the copy to the device "
        "takes 7.3% of the step (13.6 of 186.0 ms per batch)"
    )
    assert f.figures == {
        "copy_share": 0.0731,
        "copy_ms_per_batch": 13.6,
        "step_ms_per_batch": 186.0,
        "h2d_bytes_per_batch": 154_140_672,
        "h2d_gb_per_sec": 11.3,
    }
    # exactly at the threshold it stays; bytes and rate only when measured
    (f,) = _advice.with_measured_copy([_pin()], _copy(2.0, 100.0))
    assert f.figures == {"copy_share": 0.02, "copy_ms_per_batch": 2.0, "step_ms_per_batch": 100.0}
    assert "2.0% of the step" in f.evidence


def _pin_rest() -> tuple[str | None, str]:
    return _pin().location, _pin().fix
