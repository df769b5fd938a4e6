"""SyncPointWarnings under both namespaces: Lightning's own frames are framework in each."""

from __future__ import annotations

import importlib.util
import inspect
import os
from pathlib import Path
from typing import Any

import pytest

from lightning_speedpack import SyncPointWarnings
from lightning_speedpack.sync_points.detect import attribute_frame
from tests.helpers.models import quiet_trainer_kwargs
from tests.helpers.namespaces import Namespace, each_namespace


def _package_dir(dotted: str) -> str | None:
    """Folder of ``dotted`` (``"lightning/pytorch"`` for ``lightning.pytorch``), found by path."""
    top, _, rest = dotted.partition(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(
        next(iter(spec.submodule_search_locations)), *rest.split(".") if rest else ()
    )


@pytest.mark.parametrize(
    "package", ["pytorch_lightning", "lightning_fabric", "lightning.pytorch", "lightning.fabric"]
)
def test_a_sync_in_either_namespaces_files_is_the_frameworks(package: str) -> None:
    folder = _package_dir(package)
    if folder is None:
        pytest.skip(f"{package} is not installed")
    fake = os.path.join(folder, "trainer", "speedpack_fake.py")  # compiled, never written
    namespace: dict[str, Any] = {}
    exec(
        compile("import inspect\ndef here():\n    return inspect.currentframe()\n", fake, "exec"),
        namespace,
    )
    found = attribute_frame(namespace["here"]())
    assert found is not None
    frame, origin = found
    assert (origin, frame.f_code.co_filename) == ("framework", fake)


def test_a_sync_in_a_users_file_is_the_users() -> None:
    found = attribute_frame(inspect.currentframe())
    assert found is not None
    assert (found[1], found[0].f_code.co_filename) == ("user", __file__)


def _model(ns: Namespace) -> Any:
    class Model(ns.BoringModel):  # type: ignore[misc, name-defined]
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            out = super().training_step(batch, batch_idx)
            self.log("loss", out["loss"], prog_bar=True)  # Lightning reads it: framework
            self.seen = out["loss"].item()  # the user's own sync
            return out

    return Model()


@each_namespace
def test_user_and_framework_syncs_are_told_apart_in_each_namespace(
    ns: Namespace, tmp_path: Path
) -> None:
    line = inspect.getsourcelines(_model)[1] + 5  # the `.item()` line
    sync = SyncPointWarnings(mode="summary", include_cpu=True)
    trainer = ns.Trainer(
        callbacks=[sync], **quiet_trainer_kwargs(tmp_path, max_steps=3, enable_progress_bar=True)
    )
    trainer.fit(_model(ns))
    user = [(f.kind, f.filename, f.lineno) for f in sync.report if f.origin == "user"]
    assert user == [("item", __file__, line)]
    framework = [f for f in sync.report if f.origin == "framework"]
    assert framework
    home = _package_dir(ns.name)
    assert home is not None
    assert all(f.filename.startswith(home + os.sep) for f in framework), [
        f.filename for f in framework
    ]
    assert any("progress bar" in (f.fix or "") for f in sync.doctor_findings())
