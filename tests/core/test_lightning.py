"""The namespace layer: both Lightnings' classes, the object's own namespace."""

from __future__ import annotations

import importlib.util
import pickle
import sys
import textwrap
from typing import Any

import pytest

from lightning_speedpack.core import lightning as core
from tests.helpers.namespaces import NAMESPACES, Namespace, each_namespace
from tests.helpers.procs import run_in_session


def test_callback_is_a_subclass_of_every_installed_callback() -> None:
    assert core.installed_namespaces() == tuple(ns.name for ns in NAMESPACES)
    for ns in NAMESPACES:
        assert issubclass(core.Callback, ns.Callback)

    class Mine(core.Callback):  # type: ignore[misc, valid-type]
        pass

    assert all(isinstance(Mine(), ns.Callback) for ns in NAMESPACES)
    assert type(pickle.loads(pickle.dumps(core.Callback()))) is core.Callback


@pytest.mark.parametrize(
    "dotted",
    [
        "Trainer",
        "LightningModule",
        "LightningDataModule",
        "loggers.WandbLogger",
        "loggers.CSVLogger",
        "loggers.TensorBoardLogger",
        "strategies.DDPStrategy",
        "strategies.SingleDeviceStrategy",
        "plugins.precision.MixedPrecision",
        "utilities.CombinedLoader",
    ],
)
def test_classes_gives_the_class_of_every_namespace(dotted: str) -> None:
    found = core.classes(dotted)
    module, _, name = dotted.rpartition(".")
    expected = tuple(getattr(ns.sub(module) if module else ns.module, name) for ns in NAMESPACES)
    assert found == expected
    assert len(set(found)) == len(NAMESPACES)


def test_classes_skips_what_a_namespace_lacks() -> None:
    assert core.classes("loggers.NoSuchLogger") == ()
    assert core.classes("no_such_module.Thing") == ()


@each_namespace
def test_namespace_of_follows_the_object(ns: Namespace) -> None:
    model = ns.BoringModel()
    assert core.namespace_of(model) is ns.module
    assert core.namespace_of(type(model)) is ns.module
    assert core.namespace_of(ns.Trainer) is ns.module
    assert core.namespace_of(object()) is NAMESPACES[0].module  # neither: the preferred one


@each_namespace
def test_is_overridden_and_attribute_helpers_for_either_namespace(ns: Namespace) -> None:
    model = ns.SizedBoringModel(batch_size=8)
    assert core.is_overridden("train_dataloader", model)
    assert not core.is_overridden("on_train_start", model)
    assert core.lightning_hasattr(model, "batch_size")
    assert core.lightning_getattr(model, "batch_size") == 8
    core.lightning_setattr(model, "batch_size", 16)
    assert model.batch_size == 16


def test_combined_loader_iterates_plain_loaders() -> None:
    batches = [batch for batch, _, _ in core.combined_loader({"a": [1, 2], "b": [3, 4]})]
    assert batches == [{"a": 1, "b": 3}, {"a": 2, "b": 4}]


@pytest.mark.parametrize("error", [ModuleNotFoundError("hidden"), ValueError("no spec")])
def test_installed_is_false_when_find_spec_raises(
    error: Exception, monkeypatch: pytest.MonkeyPatch
) -> None:
    def raising(name: str, package: Any = None) -> Any:
        raise error

    monkeypatch.setattr(importlib.util, "find_spec", raising)
    assert core._installed("pytorch_lightning") is False
    assert core._installed("lightning.pytorch") is False


@pytest.mark.slow
def test_installed_does_not_import_the_lightning_package() -> None:
    code = textwrap.dedent(
        """
        import sys
        from lightning_speedpack.core import lightning as core
        print(core._installed("lightning.pytorch"), core._installed("lightning.no_such_part"),
              core._installed("no_such_package_xyz"), "lightning" in sys.modules,
              "pytorch_lightning" in sys.modules)
        """
    )
    proc = run_in_session([sys.executable, "-c", code], timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # core.lightning builds its Callback base at import, so the namespaces *are* imported by
    # then; what is checked here is that the probe itself answers by path
    assert proc.stdout.split()[:3] == ["True", "False", "False"]


def test_installed_namespaces_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core, "_installed", lambda name: False)
    core.installed_namespaces.cache_clear()
    try:
        with pytest.raises(ModuleNotFoundError, match="pip install pytorch-lightning"):
            core.installed_namespaces()
    finally:
        monkeypatch.undo()
        core.installed_namespaces.cache_clear()
    assert core.installed_namespaces() == tuple(ns.name for ns in NAMESPACES)
