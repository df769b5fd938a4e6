"""The doctor runs an unmodified script, attaches diagnostics to its Trainers, then leaves."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import textwrap
import threading
import warnings
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning import Callback, Trainer

from lightning_speedpack.core.hook_hub import callbacks_of
from lightning_speedpack.doctor import Finding, register_diagnostic, unregister_diagnostic
from lightning_speedpack.doctor.cli import main as cli_main
from lightning_speedpack.doctor.runner import DoctorSession, RunRecorder, run_script
from tests.helpers.models import SizedBoringModel, quiet_trainer_kwargs
from tests.helpers.namespaces import NAMESPACE_NAMES, Namespace, each_namespace
from tests.helpers.procs import run_in_session

REPO = Path(__file__).resolve().parents[2]

FIT_SCRIPT = """
import sys
from pytorch_lightning import Trainer
from pytorch_lightning.demos.boring_classes import BoringModel

print("script args:", sys.argv[1:])
trainer = Trainer(accelerator="cpu", max_steps=5, logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False,
                  default_root_dir={root!r})
trainer.fit(BoringModel())
from lightning_speedpack.core.hook_hub import callbacks_of
print("callbacks:", sorted(type(c).__name__ for c in callbacks_of(trainer)))
"""


class Probe(Callback):
    """A diagnostic registered only for these tests."""

    def __init__(self, tag: str = "doctor") -> None:
        self.tag = tag
        self.batches = 0

    def on_train_batch_end(self, *args: Any) -> None:
        self.batches += 1

    def doctor_findings(self) -> list[Finding]:
        return [
            Finding("probe", "batches", f"saw {self.batches} batches", figures={"n": self.batches})
        ]

    def doctor_figures(self) -> dict[str, Any]:
        return {"probe_batches": self.batches, "probe_series": [[1, 2.0]]}


@pytest.fixture
def probe() -> Iterator[None]:
    register_diagnostic("probe", Probe, factory=lambda ctx: Probe("doctor"), order=1)
    yield
    unregister_diagnostic("probe")


def _script(tmp_path: Path, body: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def test_reports_wall_time_samples_and_diagnostic_findings(
    tmp_path: Path, probe: None, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _script(tmp_path, FIT_SCRIPT.format(root=str(tmp_path)))
    result = run_script(script, ["--lr", "0.1"])
    out = capsys.readouterr().out
    assert result.exit_code == 0
    assert "script args: ['--lr', '0.1']" in out  # the script's stdout and argv pass through
    assert "Probe" in out
    assert "RunRecorder" in out
    (run,) = result.report.runs
    assert run.samples == 5  # BoringModel: batches of 1
    assert run.wall_s > 0
    assert run.samples_per_sec == pytest.approx(run.samples / run.wall_s)
    assert run.figures["probe_batches"] == 5
    assert [f.id for f in result.report.findings if f.component == "probe"] == ["batches"]


def test_trainer_init_is_restored_after_the_script(tmp_path: Path, probe: None) -> None:
    original = pl.Trainer.__init__
    run_script(_script(tmp_path, "raise RuntimeError('x')\n"))
    assert pl.Trainer.__init__ is original
    trainer = Trainer(**quiet_trainer_kwargs(tmp_path))
    assert not any(isinstance(c, (Probe, RunRecorder)) for c in callbacks_of(trainer))


def test_a_callback_the_user_added_is_not_added_twice(tmp_path: Path, probe: None) -> None:
    mine = Probe("user")
    session = DoctorSession()
    with session.installed():
        trainer = Trainer(callbacks=[mine], **quiet_trainer_kwargs(tmp_path, max_steps=3))
    with DoctorSession().installed():
        single = Trainer(callbacks=mine, **quiet_trainer_kwargs(tmp_path, max_steps=3))
    probes = [c for c in callbacks_of(trainer) if isinstance(c, Probe)]
    assert probes == [mine]
    assert [c for c in single.callbacks if isinstance(c, Probe)] == [mine]
    trainer.fit(SizedBoringModel())
    (finding,) = [f for f in session.report().findings if f.component == "probe"]
    assert finding.figures == {"n": 3}  # the user's instance reported


def test_a_barebones_trainer_fits_under_the_doctor_with_the_same_weights(tmp_path: Path) -> None:
    # `barebones=True` sets `log_every_n_steps=0`: the X-ray's and the timeline's logging
    # cadence divided by it at the first batch end, and the job died under the doctor alone.
    def fit(doctor: bool) -> tuple[Any, list[torch.Tensor]]:
        torch.manual_seed(0)
        model = SizedBoringModel()
        session = DoctorSession()
        with session.installed() if doctor else contextlib.nullcontext():
            trainer = Trainer(
                accelerator="cpu",
                barebones=True,
                max_epochs=2,
                limit_train_batches=24,
                default_root_dir=str(tmp_path),
            )
            trainer.fit(model)
        return session, [p.detach().clone() for p in model.parameters()]

    _, plain = fit(doctor=False)
    session, doctored = fit(doctor=True)
    assert all(torch.equal(a, b) for a, b in zip(plain, doctored, strict=True))
    ids = {f"{f.component}/{f.id}" for f in session.report().findings}
    assert {"timeline/step-phases", "data/data-pipeline"} <= ids


def test_exit_code_and_exception_pass_through(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_script(_script(tmp_path, "import sys\nsys.exit(3)\n")).exit_code == 3
    assert run_script(_script(tmp_path, "import sys\nsys.exit()\n")).exit_code == 0
    failing = _script(tmp_path, "def f():\n    raise ValueError('bad input')\n\nf()\n", "bad.py")
    result = run_script(failing)
    assert result.exit_code == 1
    assert isinstance(result.error, ValueError)
    result.print_traceback()
    err = capsys.readouterr().err
    assert f'File "{failing}", line 4, in <module>' in err
    assert f'File "{failing}", line 2, in f' in err
    assert "ValueError: bad input" in err
    assert "runpy" not in err  # the traceback starts at the user's frames
    assert "runner.py" not in err


LOADER_THREADS_SCRIPT = """
from torch.utils.data import default_collate
from torchdata.nodes import Batcher, Loader, Mapper, ParallelMapper, SamplerWrapper

node = ParallelMapper(SamplerWrapper(range(64)), map_fn=float, num_workers=2, method="thread")
loader = Loader(Mapper(Batcher(node, batch_size=4), default_collate))
job = {"iterator": iter(loader)}
job["self"] = job  # a cycle, as a Trainer and its loops make: only a collection frees it
next(job["iterator"])  # the loader's threads are started
"""


def test_the_scripts_loader_threads_are_stopped_before_the_report(tmp_path: Path) -> None:
    # A torchdata.nodes job's loader, left to a collection near exit, was told to stop its
    # threads there: one could still be freeing a tensor as the interpreter finalized, and the
    # process aborted (`terminate called without an active exception`, 3 runs in 30).
    pytest.importorskip("torchdata.nodes")
    before = set(threading.enumerate())
    result = run_script(_script(tmp_path, LOADER_THREADS_SCRIPT))
    assert result.exit_code == 0, result.error
    started = set(threading.enumerate()) - before
    for thread in started:  # told to stop already; a loaded machine may need past the loader's
        thread.join(timeout=5)  # own 0.5 s join. Never told to stop, they would still run.
    assert [t.name for t in started if t.is_alive()] == []


def test_missing_script_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no training script"):
        run_script(tmp_path / "nope.py")


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_in_session(
        [sys.executable, "-m", "lightning_speedpack", "doctor", *args], timeout=240, cwd=cwd
    )


@pytest.mark.slow
def test_cli_writes_the_json_report_and_keeps_the_exit_code(tmp_path: Path) -> None:
    script = _script(tmp_path, FIT_SCRIPT.format(root=str(tmp_path)) + "raise SystemExit(4)\n")
    proc = _cli("--json", str(tmp_path / "r" / "report.json"), str(script), "a", cwd=tmp_path)
    assert proc.returncode == 4, proc.stderr
    assert "script args: ['a']" in proc.stdout
    assert "speedpack doctor" in proc.stderr  # the report goes to stderr, stdout stays the script's
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert set(report) == {"findings", "runs", "skipped", "command", "created"}
    assert report["command"] == [str(script), "a"]  # what ran, for the HTML page's header
    assert datetime.fromisoformat(report["created"]).tzinfo is not None
    assert set(report["runs"][0]) >= {"wall_s", "samples", "samples_per_sec"}
    assert report["runs"][0]["samples"] == 5
    for finding in report["findings"]:
        assert set(finding) >= {"component", "id", "message", "location", "figures"}


@pytest.mark.slow
def test_cli_shows_the_traceback_and_exits_nonzero(tmp_path: Path) -> None:
    script = _script(tmp_path, "print('before')\nraise KeyError('boom')\n")
    proc = _cli(str(script), cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stdout == "before\n"
    assert proc.stderr.rstrip().endswith("KeyError: 'boom'")
    assert f'File "{script}", line 2' in proc.stderr


DDP_SCRIPT = """
import os
from pytorch_lightning import Trainer
from pytorch_lightning.demos.boring_classes import BoringModel

trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=3, logger=False,
                  enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, default_root_dir={root!r})
trainer.fit(BoringModel())
from lightning_speedpack.core.hook_hub import callbacks_of
names = sorted(type(c).__name__ for c in callbacks_of(trainer))
with open(os.path.join({root!r}, f"rank{{trainer.global_rank}}.txt"), "w") as f:
    f.write(",".join(names))
"""


@pytest.mark.ddp
@pytest.mark.timeout(240)
@pytest.mark.parametrize("choice", [[], ["--deep"], ["--only", "throughput,sync_points"]])
def test_ranks_relaunched_by_lightning_get_the_same_diagnostics(
    tmp_path: Path, choice: list[str]
) -> None:
    script = _script(tmp_path, DDP_SCRIPT.format(root=str(tmp_path)))
    proc = _cli(*choice, "--json", str(tmp_path / "report.json"), str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rank0 = (tmp_path / "rank0.txt").read_text()
    rank1 = (tmp_path / "rank1.txt").read_text()
    assert "RunRecorder" in rank0
    assert rank0 == rank1  # same callbacks on both ranks, so their collectives match
    wanted = DoctorSession(
        deep="--deep" in choice, only=choice[1].split(",") if choice[1:] else None
    )
    wanted.install()  # registers every tool, so `selected` knows them all
    wanted.uninstall()
    expected = {d.callback_type.__name__ for d in wanted.selected()} | {"RunRecorder", "HookHub"}
    assert set(rank0.split(",")) == expected
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["runs"][0]["samples"] == 3 * 2  # 3 batches of 1 on each of 2 ranks


def test_json_and_html_after_the_script_are_the_doctors_and_double_dash_passes_through() -> None:
    from lightning_speedpack.doctor.cli import _split_script_args

    assert _split_script_args(["--epochs", "2", "--json", "o.json"]) == (
        {"--json": "o.json"},
        ["--epochs", "2"],
    )
    assert _split_script_args(["--json=o.json", "x", "--html", "r.html"]) == (
        {"--json": "o.json", "--html": "r.html"},
        ["x"],
    )
    assert _split_script_args(["a", "--", "--json", "mine"]) == ({}, ["a", "--json", "mine"])


class Echo(Probe):
    """A second diagnostic that reports the same finding id as Probe, more severely."""

    def doctor_findings(self) -> list[Finding]:
        return [Finding("echo", "batches", "same thing", severity="error")]


class Pointer(Probe):
    """A third one that says where: its finding is kept over the others."""

    def doctor_findings(self) -> list[Finding]:
        return [Finding("pointer", "batches", "here", location="train.py:3", severity="info")]


def test_the_same_finding_id_from_two_components_is_reported_once(
    tmp_path: Path, probe: None
) -> None:
    register_diagnostic("echo", Echo, order=2)
    try:
        session = DoctorSession()
        with session.installed():
            trainer = Trainer(**quiet_trainer_kwargs(tmp_path, max_steps=2))
        trainer.fit(SizedBoringModel())
        same = [f for f in session.report().findings if f.id == "batches"]
    finally:
        unregister_diagnostic("echo")
    assert len(same) == 1
    assert same[0].component == "probe"  # registered first
    assert same[0].severity == "error"  # the most severe of the two
    assert same[0].figures["also_reported_by"] == ["echo"]


def test_of_findings_with_the_same_id_the_one_with_a_location_is_kept(
    tmp_path: Path, probe: None
) -> None:
    register_diagnostic("echo", Echo, order=2)
    register_diagnostic("pointer", Pointer, order=3)
    try:
        session = DoctorSession()
        with session.installed():
            trainer = Trainer(**quiet_trainer_kwargs(tmp_path, max_steps=2))
        trainer.fit(SizedBoringModel())
        same = [f for f in session.report().findings if f.id == "batches"]
    finally:
        unregister_diagnostic("echo")
        unregister_diagnostic("pointer")
    assert [(f.component, f.location, f.severity) for f in same] == [
        ("pointer", "train.py:3", "error")
    ]
    assert same[0].figures["also_reported_by"] == ["echo", "probe"]


# --- both namespaces: the same script written against `lightning` or `pytorch_lightning` ------

#: The imports (two lines each, so both twins have the same line numbers) and the Trainer.
TWIN_HEADERS = {
    "pl": (
        "from pytorch_lightning import Trainer\n"
        "from pytorch_lightning.demos.boring_classes import BoringModel",
        "Trainer",
    ),
    "L": (
        "import lightning as L\nfrom lightning.pytorch.demos.boring_classes import BoringModel",
        "L.Trainer",
    ),
}

TWIN_SCRIPT = """\
import time
import torch
{imports}
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):  # 70 ms per batch of 7: the loop waits for data, every time
    def __len__(self):
        return 70

    def __getitem__(self, i):
        time.sleep(0.01)
        return torch.randn(32)


kept = []


class Model(BoringModel):
    def training_step(self, batch, batch_idx):
        loss = self.layer(batch).sum()
        kept.append(loss)
        if loss.item() > 1e9:
            print("big")
        return loss

    def train_dataloader(self):
        return DataLoader(Slow(), batch_size=7)


trainer = {trainer}(accelerator="cpu", max_steps=6, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Model())
"""


def _twin(tmp_path: Path, ns_id: str) -> Path:
    imports, trainer = TWIN_HEADERS[ns_id]
    folder = tmp_path / ns_id
    folder.mkdir(exist_ok=True)
    return _script(folder, TWIN_SCRIPT.format(imports=imports, trainer=trainer))


#: Findings that depend on the process's history, not on the namespace: Python collects its
#: garbage when the allocations made so far (another namespace imported, an earlier run) cross
#: its thresholds, so one twin's run may hold a full collection and the other's none.
HISTORY_FINDINGS = frozenset({"garbage-collection"})


def _shape(findings: list[dict[str, Any]], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """What must match between twins: each finding's component, id, severity and file (not
    its folder), the number of runs, and each run's figure keys and sample count."""
    return {
        "findings": sorted(
            (f["component"], f["id"], f["severity"], Path(f["location"] or "").name)
            for f in findings
            if f["id"] not in HISTORY_FINDINGS
        ),
        "runs": [(r["samples"], sorted(r["figures"])) for r in runs],
    }


def _run_as_a_user_would(script: Path, args: Sequence[str] = (), *, deep: bool = True) -> Any:
    """``run_script`` (``--deep`` by default: the full report) without pytest's "error"
    filter: the script's warnings are not under test."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run_script(script, args, deep=deep)


def _report_shape(report: Any) -> dict[str, Any]:
    data = report.to_dict()
    return _shape(data["findings"], data["runs"])


EXPECTED_TWIN_FINDINGS = {
    ("sync_points", "sync-item", "train.py:24"),  # the `.item()` line
    ("loss_retention", "retained-graph", "train.kept"),
    # the `__getitem__` that waits: the data profiler timed the wait itself, so it is stated
    # once, in the verdict (ThroughputLogger's `data-wait` defers to it)
    ("data", "data-pipeline", "train.py:12"),  # the stage table, at the same fetch
    ("data", "data-bound", "train.py:12"),  # the verdict, checked against the run
    ("advisor", "dataloader-workers", "train_dataloader"),
    ("advisor", "batch-size-multiple", "train_dataloader"),
}


@pytest.mark.slow
@pytest.mark.skipif(len(NAMESPACE_NAMES) < 2, reason="needs both Lightning namespaces")
def test_a_lightning_script_gets_the_same_report_as_its_pytorch_lightning_twin(
    tmp_path: Path,
) -> None:
    shapes = {}
    for ns_id in ("pl", "L"):
        result = _run_as_a_user_would(_twin(tmp_path, ns_id))
        assert result.exit_code == 0, result.error
        shapes[ns_id] = _report_shape(result.report)
    assert shapes["L"] == shapes["pl"]
    found = {(c, i, loc) for c, i, _sev, loc in shapes["L"]["findings"]}
    assert found >= EXPECTED_TWIN_FINDINGS  # the twins agree on a full report, not an empty one
    default = _run_as_a_user_would(_twin(tmp_path, "L"), deep=False)
    default_found = {(c, i, loc) for c, i, _sev, loc in _report_shape(default.report)["findings"]}
    # Without --deep: no ceilings probe (the report says so), yet the verdict from the run's own
    # epochs is there: the same findings.
    assert default_found >= EXPECTED_TWIN_FINDINGS
    assert any(s.startswith("data: the loader and model ceilings") for s in default.report.skipped)
    assert shapes["L"]["runs"] == [(6 * 7, shapes["L"]["runs"][0][1])]
    assert {
        "peak_rss_mb",
        "samples_per_sec",
        "syncs_per_step",
        "retained_graphs",
        "end_heap_scan",
        "loader_ceiling_samples_per_sec",
        "model_ceiling_samples_per_sec",
        "verdict",
    } <= set(shapes["L"]["runs"][0][1])


@pytest.mark.slow
@pytest.mark.skipif(len(NAMESPACE_NAMES) < 2, reason="needs both Lightning namespaces")
def test_speedpack_doctor_on_an_import_lightning_as_l_script(tmp_path: Path) -> None:
    twin = _run_as_a_user_would(_twin(tmp_path, "pl"))
    assert twin.exit_code == 0, twin.error
    script = _twin(tmp_path, "L")
    proc = _cli("--deep", "--json", str(tmp_path / "report.json"), str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert _shape(report["findings"], report["runs"]) == _report_shape(twin.report)


LIGHTNING_CLI_SCRIPT = """\
from {ns}.cli import LightningCLI
from {ns}.demos.boring_classes import BoringModel

cli = LightningCLI(BoringModel, save_config_kwargs={{"overwrite": True}})
from lightning_speedpack.core.hook_hub import callbacks_of
print("callbacks:", sorted(type(c).__name__ for c in callbacks_of(cli.trainer)))
"""


@each_namespace
def test_the_doctor_attaches_to_a_trainer_built_by_lightning_cli(
    ns: Namespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _script(tmp_path, LIGHTNING_CLI_SCRIPT.format(ns=ns.name), "cli_train.py")
    args = [
        "fit",
        "--seed_everything=0",
        "--trainer.accelerator=cpu",
        "--trainer.max_steps=3",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={tmp_path}",
    ]
    result = _run_as_a_user_would(script, args)
    assert result.exit_code == 0, result.error
    out = capsys.readouterr().out
    for name in ("RunRecorder", "SyncPointWarnings", "ThroughputLogger", "SpeedAdvisor"):
        assert name in out
    (run,) = result.report.runs
    assert run.samples == 3
    assert {"samples_per_sec", "syncs_per_step", "peak_rss_mb"} <= set(run.figures)
    assert {f.component for f in result.report.findings} >= {"advisor"}


DDP_TWIN_HEADERS = {
    "pl": "from pytorch_lightning import Trainer\n"
    "from pytorch_lightning.demos.boring_classes import BoringModel\n",
    "L": "import lightning as L\nfrom lightning.pytorch.demos.boring_classes import BoringModel\n"
    "Trainer = L.Trainer\n",
}


@pytest.mark.ddp
@pytest.mark.timeout(240)
def test_ranks_relaunched_by_lightning_pytorch_get_the_same_diagnostics(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    body = DDP_SCRIPT.format(root=str(tmp_path)).replace(
        "from pytorch_lightning import Trainer\n"
        "from pytorch_lightning.demos.boring_classes import BoringModel\n",
        DDP_TWIN_HEADERS["L"],
    )
    assert "pytorch_lightning" not in body
    script = _script(tmp_path, body)
    proc = _cli("--json", str(tmp_path / "report.json"), str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rank0 = (tmp_path / "rank0.txt").read_text()
    rank1 = (tmp_path / "rank1.txt").read_text()
    assert "RunRecorder" in rank0
    assert rank0 == rank1
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["runs"][0]["samples"] == 3 * 2


class DeepProbe(Probe):
    """A diagnostic registered as ``deep`` for these tests."""


@pytest.fixture
def deep_probe() -> Iterator[None]:
    register_diagnostic("deep_probe", DeepProbe, factory=lambda ctx: DeepProbe(), deep=True)
    yield
    unregister_diagnostic("deep_probe")


def _attached(session: DoctorSession, tmp_path: Path) -> set[str]:
    with session.installed():
        trainer = Trainer(**quiet_trainer_kwargs(tmp_path, max_steps=1))
    return {type(c).__name__ for c in callbacks_of(trainer)}


def test_deep_diagnostics_run_only_with_deep_and_the_report_names_them(
    tmp_path: Path, probe: None, deep_probe: None
) -> None:
    default = DoctorSession()
    names = _attached(default, tmp_path)
    assert "Probe" in names
    assert "DeepProbe" not in names
    assert "deep_probe" in default.report().skipped
    assert "deep_probe" in default.report().to_dict()["skipped"]
    deep = DoctorSession(deep=True)
    assert {"Probe", "DeepProbe"} <= _attached(deep, tmp_path)
    assert deep.report().skipped == []


def test_only_attaches_just_the_named_diagnostics(
    tmp_path: Path, probe: None, deep_probe: None
) -> None:
    names = _attached(DoctorSession(only=["deep_probe"]), tmp_path)
    assert "DeepProbe" in names
    assert "Probe" not in names
    assert not names & {"ThroughputLogger", "SyncPointWarnings", "SpeedAdvisor"}
    original = pl.Trainer.__init__
    with pytest.raises(ValueError, match=r"unknown diagnostic.*nope.*choose from.*probe"):
        DoctorSession(only=["nope"]).install()
    assert pl.Trainer.__init__ is original  # a refused session wraps nothing
    with pytest.raises(TypeError, match="collection of diagnostic names"):
        DoctorSession(only="throughput")


@pytest.mark.slow
def test_the_cli_refuses_an_unknown_diagnostic_in_one_line(tmp_path: Path) -> None:
    script = _script(tmp_path, "print('never run')\n")
    proc = _cli("--only", "throughput,nope", str(script), cwd=tmp_path)
    assert proc.returncode == 2
    assert "never run" not in proc.stdout
    assert "unknown diagnostic(s) nope; choose from" in proc.stderr


def test_the_session_for_relaunched_ranks_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lightning_speedpack.doctor.runner import DEEP_ENV, ONLY_ENV

    monkeypatch.setenv(DEEP_ENV, "1")
    monkeypatch.setenv(ONLY_ENV, "")
    session = DoctorSession.from_environment()
    assert session.deep
    assert session.only is None
    monkeypatch.setenv(DEEP_ENV, "0")
    monkeypatch.setenv(ONLY_ENV, "throughput,data")
    session = DoctorSession.from_environment()
    assert not session.deep
    assert session.only == {"throughput", "data"}


def test_only_may_be_any_iterable_of_names(tmp_path: Path, probe: None) -> None:
    session = DoctorSession(only=(name for name in ["probe"]))  # read once, not consumed twice
    assert session.only == {"probe"}
    assert "Probe" in _attached(session, tmp_path)


CHILDREN_SCRIPT = """\
import multiprocessing
import subprocess
import sys


def square(x):
    return x * x


if __name__ == "__main__":
    child = subprocess.run(
        [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr)"],
        capture_output=True,
        text=True,
    )
    print("subprocess:", repr(child.stdout), repr(child.stderr), child.returncode)
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        print("spawn pool:", pool.map(square, range(4)))
"""


@pytest.mark.slow
def test_processes_the_doctor_does_not_attach_to_keep_their_output_byte_for_byte(
    tmp_path: Path,
) -> None:
    """A subprocess of ``sys.executable`` and a spawn pool started by the doctored script print
    exactly what they print without the doctor (no 'Error in sitecustomize')."""
    script = _script(tmp_path, CHILDREN_SCRIPT)
    plain = run_in_session([sys.executable, str(script)], timeout=120, cwd=tmp_path)
    doctored = _cli("--quiet", str(script), cwd=tmp_path)
    assert plain.returncode == doctored.returncode == 0, doctored.stderr
    assert "subprocess: 'out\\n' 'err\\n' 0" in plain.stdout
    assert doctored.stdout == plain.stdout
    assert doctored.stderr == plain.stderr == ""


def test_lightning_dispatches_the_doctors_per_batch_hooks_once_a_batch(tmp_path: Path) -> None:
    from lightning_speedpack import StepTimeline, ThroughputLogger
    from lightning_speedpack.core.hook_hub import HookHub
    from tests.helpers.models import ProfiledNames

    mine = ThroughputLogger()  # the user's own instance: Lightning calls it where it is
    profiler = ProfiledNames()
    session = DoctorSession()
    with session.installed():
        trainer = Trainer(
            **quiet_trainer_kwargs(tmp_path, max_steps=3), callbacks=[mine], profiler=profiler
        )
    trainer.fit(SizedBoringModel())
    (hub,) = [c for c in trainer.callbacks if isinstance(c, HookHub)]
    timeline = next(c for c in callbacks_of(trainer) if isinstance(c, StepTimeline))
    assert timeline in hub.members
    assert mine not in hub.members
    # Lightning loops over the hub alone for the doctor's callbacks, and over the user's own.
    assert [
        c for c in trainer.callbacks if type(c).__module__.startswith("lightning_speedpack")
    ] == [mine, hub]
    hook = ".on_train_batch_end"
    ends = sorted(
        a.removeprefix("[Callback]").removesuffix(hook)
        for a in profiler.names
        if a.startswith("[Callback]") and a.endswith(hook)
    )
    # One dispatch a batch for all the doctor's callbacks, one for the user's own instance.
    assert ends == sorted(["HookHub"] * 3 + [mine.state_key] * 3)
    # The ledger still charges each tool its own per-batch hooks, and never the hub.
    ledger = next(c for c in callbacks_of(trainer) if type(c).__name__ == "WallTimeLedger")
    assert "HookHub" not in ledger.callback_seconds()
    assert ("callback:StepTimeline", "on_train_batch_end") in ledger.details()


TORCHRUN_SCRIPT = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from pytorch_lightning import LightningModule, Trainer


class Model(LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(64, 8, generator=g), torch.randint(0, 2, (64,), generator=g)
        data = TensorDataset(x, y)
        return DataLoader(data, batch_size=8)


Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False).fit(Model())
"""


@pytest.mark.ddp
@pytest.mark.timeout(300)
def test_under_torchrun_rank_0_alone_writes_the_report(tmp_path: Path) -> None:
    """Every rank runs the doctor under torchrun; before, each wrote --json to the same path and
    the last to finish (rank 1, with no World table) was the file the user got."""
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_SCRIPT)
    report_path = tmp_path / "report.json"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    doctor = ["-m", "lightning_speedpack", "doctor", "--layout", "log", "--json", str(report_path)]
    proc = run_in_session([*torchrun, *doctor, str(script)], timeout=280, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("Findings (") + proc.stderr.count("No findings") == 1  # one report
    world = json.loads(report_path.read_text())["runs"][0]["figures"]["world"]
    assert [row["rank"] for row in world["ranks"]] == [0, 1]


@pytest.mark.parametrize(("variable", "value"), [("RANK", "1"), ("SLURM_PROCID", "3")])
def test_a_rank_a_launcher_numbered_above_0_writes_and_prints_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    variable: str,
    value: str,
) -> None:
    for name in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, value)
    script = _script(tmp_path, "import sys\nsys.exit(3)\n")
    report_path = tmp_path / "report.json"
    assert cli_main(["doctor", "--json", str(report_path), str(script)]) == 3  # passed through
    assert not report_path.exists()
    assert "speedpack doctor" not in capsys.readouterr().err
    monkeypatch.setenv(variable, "0")
    assert cli_main(["doctor", "--json", str(report_path), str(script)]) == 3
    assert report_path.exists()
