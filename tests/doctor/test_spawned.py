"""Ranks that Lightning starts in new processes (``ddp_spawn``, ``ddp_fork``) under the doctor.

Lightning pickles the Trainer and its callbacks into the spawned ranks: the doctor's HookHub
once made that fail (``Can't pickle local object '_timed.<locals>.dispatch'``), so the job died
under the doctor. And the doctor's callbacks in the calling process see none of the fit: rank 0
sends its report back with Lightning's own results (``doctor/spawned.py``).
"""

from __future__ import annotations

import json
import pickle
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from pytorch_lightning import Callback

from tests.helpers.procs import run_in_session

JOB = """
import hashlib, sys
import torch
from torch.utils.data import DataLoader, TensorDataset
import pytorch_lightning as pl


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        layers = (torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
        self.net = torch.nn.Sequential(*layers)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(128, 16, generator=g), torch.randint(0, 2, (128,), generator=g)
        data = TensorDataset(x, y)
        return DataLoader(data, batch_size=8)


if __name__ == "__main__":
    torch.set_num_threads(1)
    pl.seed_everything(0)
    model = Model()
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy=sys.argv[1], max_epochs=2, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(model)
    weights = hashlib.sha256()
    for tensor in model.state_dict().values():
        weights.update(tensor.detach().contiguous().numpy().tobytes())
    print(f"JOB: state {trainer.state.status.value}, weights {weights.hexdigest()}")
"""


def _job_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("JOB: ")]


def _run(tmp_path: Path, strategy: str, *doctor: str) -> tuple[Any, list[str]]:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(JOB))
    cmd = [sys.executable, *doctor, str(script), strategy]
    proc = run_in_session(cmd, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, _job_lines(proc.stdout)


@pytest.mark.ddp
@pytest.mark.timeout(540)
@pytest.mark.parametrize("strategy", ["ddp_spawn", "ddp_fork"])
def test_a_job_with_spawned_ranks_runs_as_it_does_plainly_and_rank_0_reports(
    tmp_path: Path, strategy: str
) -> None:
    _, plain = _run(tmp_path, strategy)
    report_path = tmp_path / "report.json"
    doctor = ("-m", "lightning_speedpack", "doctor", "--quiet", "--json", str(report_path))
    _, under_doctor = _run(tmp_path, strategy, *doctor)
    (line,) = plain
    assert "finished" in line
    assert under_doctor == plain  # the same weights, bit for bit, back in this process
    report = json.loads(report_path.read_text())
    (run,) = report["runs"]  # rank 0's fit, sent back from its process
    assert run["samples"] == 2 * 128  # 2 epochs, each rank half of the 128 samples
    world = run["figures"]["world"]
    assert [r["rank"] for r in world["ranks"]] == [0, 1]
    assert world["missing"] == []
    assert run["figures"]["comm_source"] == "DDP's runtime statistics"
    # rank 0's diagnostics judged its fit there: the loader's verdict and the step's phases
    ids = {(f["component"], f["id"]) for f in report["findings"]}
    assert {("data", "model-bound"), ("timeline", "step-phases")} <= ids


class _Count(Callback):  # module-level: picklable, as a callback in a spawned job must be
    def __init__(self) -> None:
        self.batches = self.epochs = 0

    def on_train_batch_end(self, *args: Any) -> None:
        self.batches += 1

    def on_train_epoch_end(self, *args: Any) -> None:
        self.epochs += 1


def test_the_hook_hub_pickles_into_a_hub_that_calls_its_members(tmp_path: Path) -> None:
    from pytorch_lightning import Trainer
    from pytorch_lightning.demos.boring_classes import BoringModel

    from lightning_speedpack.core.hook_hub import HookHub, callbacks_of, hub_of
    from tests.helpers.models import quiet_trainer_kwargs

    hub = HookHub([_Count(), _Count()], owns=True)
    copy = pickle.loads(pickle.dumps(hub))  # what a spawned rank gets
    trainer = Trainer(callbacks=[copy], **quiet_trainer_kwargs(tmp_path, max_steps=3))
    trainer.fit(BoringModel())
    members = callbacks_of(trainer)[1:]
    assert [(m.batches, m.epochs) for m in members] == [(3, 1), (3, 1)]
    assert all(hub_of(m) is copy for m in members)
    assert [m.batches for m in hub.members] == [0, 0]  # the original is untouched


class _Launcher:  # Lightning's _MultiProcessingLauncher, as far as the doctor touches it
    def get_extra_results(self, trainer: Any) -> dict[str, Any]:
        return {"callback_metrics_bytes": b"metrics"}

    def update_main_process_results(self, trainer: Any, extra: dict[str, Any]) -> None:
        self.extra = extra


def _trainer(launcher: Any) -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(strategy=SimpleNamespace(launcher=launcher))


def test_a_report_that_cannot_be_sent_is_said_and_lightnings_results_still_arrive() -> None:
    from lightning_speedpack.doctor.runner import _Attached, _carried
    from lightning_speedpack.doctor.spawned import carry

    def collect() -> Any:
        raise RuntimeError("a figure that does not pickle")

    launcher, got = _Launcher(), []
    trainer = _trainer(launcher)
    undo = carry(launcher, collect, got.append)
    extra = pickle.loads(pickle.dumps(launcher.get_extra_results(trainer)))  # across processes
    launcher.update_main_process_results(trainer, extra)
    assert launcher.extra == {"callback_metrics_bytes": b"metrics"}  # Lightning's, untouched
    (line,) = got
    assert line == "RuntimeError: a figure that does not pickle"
    attached = _Attached(recorder=None)  # type: ignore[arg-type]
    attached.take(line)
    (finding,), runs = attached.parts()
    assert (finding.id, finding.severity, runs) == ("spawned-report-lost", "info", [])
    assert "a figure that does not pickle" in finding.message
    assert _carried(([], [])) == ([], [])
    undo()
    assert not {"get_extra_results", "update_main_process_results"} & set(vars(launcher))


def test_carry_leaves_other_launchers_and_replaced_methods_alone() -> None:
    from lightning_speedpack.doctor.spawned import carry

    class Subprocess:  # Lightning's `ddp` launcher: the ranks re-run the script, nothing returns
        pass

    plain = Subprocess()
    carry(plain, list, print)()
    assert vars(plain) == {}
    assert carry(None, list, print)() is None
    launcher = _Launcher()
    launcher.get_extra_results = lambda trainer: {}  # type: ignore[method-assign]  # someone's own
    carry(launcher, list, print)
    assert "update_main_process_results" not in vars(launcher)


def test_a_strategy_that_fails_to_name_its_launcher_does_not_stop_the_fit() -> None:
    from types import SimpleNamespace

    from lightning_speedpack.doctor.runner import DoctorSession, _Attached

    class Odd:  # a user's strategy whose launcher cannot be read before the fit
        @property
        def launcher(self) -> Any:
            raise RuntimeError("launcher is set up in setup_environment")

    session = DoctorSession()
    recorder = object()
    session._attached.append(_Attached(recorder=recorder))  # type: ignore[arg-type]
    trainer = SimpleNamespace(strategy=Odd(), callbacks=[recorder])
    assert session._carry(trainer)() is None
