"""With only one Lightning installed (either one), the pack imports, fits and names its strategy.

Both namespaces are installed here, so each test runs a fresh interpreter in which a meta-path
finder hides one of them exactly as an absent package looks: ``import`` and
``importlib.util.find_spec`` raise ``ModuleNotFoundError``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.helpers.procs import run_in_session

#: Hides the packages named in HIDDEN; put first on sys.meta_path before anything is imported.
HIDE = """\
import importlib.abc, sys
HIDDEN = {hidden!r}
class _Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {{fullname!r}}", name=fullname)
        return None
sys.meta_path.insert(0, _Hide())
"""

FIT = """\
import json, sys
import lightning_speedpack
from lightning_speedpack import (
    BatchSizeTuner, LossRetentionDetector, SpeedAdvisor, SyncPointWarnings, ThroughputLogger,
)
from lightning_speedpack.core.lightning import installed_namespaces
import {namespace} as ns
from {namespace}.demos.boring_classes import BoringModel, RandomDataset
from torch.utils.data import DataLoader


class Model(BoringModel):
    def __init__(self):
        super().__init__()
        self.batch_size = 8

    def train_dataloader(self):
        return DataLoader(RandomDataset(32, 64), batch_size=self.batch_size)


quiet = dict(accelerator="cpu", logger=False, enable_checkpointing=False,
             enable_progress_bar=False, enable_model_summary=False, default_root_dir={root!r})
out = {{"installed": list(installed_namespaces())}}
callbacks = [ThroughputLogger(window=2, gpu_stats=False), SyncPointWarnings(mode="summary"),
             LossRetentionDetector(), BatchSizeTuner(max_val=16, verbose=False),
             SpeedAdvisor(verbose=False)]
out["isinstance"] = all(isinstance(c, ns.Callback) for c in callbacks)
trainer = ns.Trainer(callbacks=callbacks, max_steps=3, **quiet)
trainer.fit(Model())
out["global_step"] = trainer.global_step
out["samples_per_sec"] = callbacks[0].doctor_figures()["samples_per_sec"] > 0
out["strategies"] = [
    type(ns.Trainer(strategy=name, devices=2, **quiet).strategy).__module__
    for name in ("ddp_speedpack", "ddp_speedpack_spawn")
]
out["public_strategy"] = lightning_speedpack.DDPSpeedpackStrategy.__module__

from lightning_speedpack.doctor.runner import DoctorSession

session = DoctorSession()
with session.installed():
    doctored = ns.Trainer(max_steps=2, **quiet)
doctored.fit(BoringModel())
out["doctor_runs"] = [run.samples for run in session.report().runs]
out["hidden_imported"] = sorted(m for m in sys.modules if m.split(".")[0] in HIDDEN)
print("RESULT " + json.dumps(out))
"""

CASES = {
    # only `pip install pytorch-lightning`: the `lightning` package is absent
    "only-pytorch-lightning": (
        ("lightning",),
        "pytorch_lightning",
        "lightning_speedpack.strategies.pytorch_lightning",
    ),
    # only `pip install lightning`: `pytorch_lightning` and `lightning_fabric` are absent
    "only-lightning": (
        ("pytorch_lightning", "lightning_fabric"),
        "lightning.pytorch",
        "lightning_speedpack.strategies.lightning",
    ),
}


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return run_in_session([sys.executable, "-W", "ignore", "-c", code], timeout=240)


@pytest.mark.slow
@pytest.mark.timeout(260)
@pytest.mark.parametrize("case", sorted(CASES))
def test_imports_and_fits_with_one_namespace_hidden(case: str, tmp_path: object) -> None:
    hidden, namespace, strategy_module = CASES[case]
    if namespace == "lightning.pytorch":
        pytest.importorskip("lightning")
    code = HIDE.format(hidden=set(hidden)) + FIT.format(namespace=namespace, root=str(tmp_path))
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    out = json.loads(line.removeprefix("RESULT "))
    assert out == {
        "installed": [namespace],
        "isinstance": True,
        "global_step": 3,
        "samples_per_sec": True,
        "strategies": [strategy_module, strategy_module],
        "public_strategy": strategy_module,
        "doctor_runs": [2],
        "hidden_imported": [],
    }


@pytest.mark.slow
def test_the_hider_really_hides() -> None:
    code = HIDE.format(hidden={"lightning"}) + textwrap.dedent(
        """
        import importlib.util
        try:
            import lightning
        except ModuleNotFoundError:
            print("import: hidden")
        try:
            importlib.util.find_spec("lightning")
        except ModuleNotFoundError:
            print("find_spec: hidden")
        import lightning_speedpack.core.lightning as core
        print(core.installed_namespaces())
        """
    )
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-3:] == [
        "import: hidden",
        "find_spec: hidden",
        "('pytorch_lightning',)",
    ]


LIGHTNING_MODULES = ("pytorch_lightning", "lightning", "lightning_fabric")


@pytest.mark.parametrize(
    "statement",
    [
        "import lightning_speedpack",
        "import lightning_speedpack.data",
        "from lightning_speedpack.data import CachedDataset, CacheInfo, CacheBudgetWarning",
        "from lightning_speedpack import CachedDataset",
    ],
)
@pytest.mark.slow
def test_the_data_tool_imports_no_lightning(statement: str) -> None:
    code = textwrap.dedent(
        f"""
        import sys
        {statement}
        print(sorted(m for m in sys.modules if m.split(".")[0] in {LIGHTNING_MODULES!r}))
        """
    )
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1] == "[]"
