"""Off CUDA the GPU-only checks are kept for later: read for a GPU, labelled "on GPU" (#25)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pytorch_lightning import Trainer

from lightning_speedpack import DeviceInfo, SpeedAdvisor
from lightning_speedpack.advisor.rules import GPU_ONLY_IDS, as_if_on_gpu
from lightning_speedpack.doctor.grouping import presented
from tests.helpers.models import TinyCNN, quiet_trainer_kwargs

A100 = DeviceInfo("cuda", "NVIDIA A100", (8, 0), has_tensor_cores=True)


def _fit(advisor: SpeedAdvisor, tmp_path: Path) -> None:
    trainer = Trainer(**quiet_trainer_kwargs(tmp_path, max_steps=4), callbacks=[advisor])
    trainer.fit(TinyCNN(batch_size=16, n=64))  # conv net, fixed shapes, fp32, no pinning


def test_a_cpu_run_keeps_the_gpu_advice_as_info_labelled_on_gpu(tmp_path: Path) -> None:
    advisor = SpeedAdvisor(measure_steps=2, verbose=False)
    _fit(advisor, tmp_path)
    # The run's own findings: nothing GPU-only (they do not apply to a CPU) ...
    assert not {f.id for f in advisor.findings} & GPU_ONLY_IDS
    assert set(advisor.skipped) == GPU_ONLY_IDS
    # ... but what would pay on a GPU is kept, as info, for when the model moves to one.
    gpu = {f.id: f for f in advisor.gpu_findings}
    assert set(gpu) == {"pin-memory", "precision", "cudnn-benchmark", "channels-last"}
    assert {(f.severity, f.pays_on) for f in gpu.values()} == {("info", "GPU")}
    assert gpu["precision"].fix == "Trainer(precision='bf16-mixed')"
    assert gpu["precision"].evidence == (
        "Trainer(precision='32-true') on a GPU (this run is on the cpu)"
    )
    # The doctor gets them after the run's own findings, and lists them after what pays here.
    doctor = advisor.doctor_findings()
    assert [f.id for f in doctor[-4:]] == [f.id for f in advisor.gpu_findings]
    shown = presented(doctor)
    here = [f for f in shown if f.pays_on is None]
    assert shown[: len(here)] == here
    assert advisor.doctor_figures() == {"advisor_findings": len(advisor.findings)}


def test_a_gpu_run_has_no_gpu_findings_apart(tmp_path: Path) -> None:
    advisor = SpeedAdvisor(measure_steps=2, verbose=False, device_info=A100)
    _fit(advisor, tmp_path)
    assert advisor.gpu_findings == []
    assert advisor.skipped == {}
    own = {f.id: f for f in advisor.findings}
    assert {"pin-memory", "precision", "cudnn-benchmark", "channels-last"} <= set(own)
    assert {own[i].pays_on for i in GPU_ONLY_IDS} == {None}
    assert own["precision"].severity == "warning"


def test_the_printed_table_names_the_gpu_advice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    advisor = SpeedAdvisor(measure_steps=2, verbose=True)
    _fit(advisor, tmp_path)
    err = " ".join(capsys.readouterr().err.split())
    assert (
        "skipped channels-last, cudnn-benchmark, pin-memory, precision: the run trains on "
        "'cpu', not a CUDA GPU; for a GPU later, see gpu_findings: pin-memory, precision, "
        "channels-last, cudnn-benchmark"
    ) in err


def test_the_gpu_read_against_is_a_tensor_core_gpu_named_for_the_run() -> None:
    gpu = as_if_on_gpu(DeviceInfo("mps"))
    assert (gpu.type, gpu.has_tensor_cores, gpu.supports_bf16) == ("cuda", True, True)
    assert gpu.name == "a GPU (this run is on the mps)"
