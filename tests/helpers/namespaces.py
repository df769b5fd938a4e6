"""Both Lightning namespaces as a test parameter: ``pytorch_lightning`` and ``lightning.pytorch``.

A test that takes the ``ns`` fixture runs once per installed namespace and builds everything
(Trainer, models, callbacks of Lightning's own) from ``ns``, so the pack is exercised exactly as
a user of that namespace would use it::

    @each_namespace
    def test_fit(ns: Namespace, tmp_path: Path) -> None:
        trainer = ns.Trainer(callbacks=[ThroughputLogger()], **quiet_trainer_kwargs(tmp_path))
        trainer.fit(ns.SizedBoringModel())
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest
from torch.utils.data import DataLoader

from tests.helpers import global_state

__all__ = [
    "NAMESPACES",
    "NAMESPACE_IDS",
    "NAMESPACE_NAMES",
    "Namespace",
    "each_namespace",
    "load",
    "ns",
    "snapshot",
]

#: The namespaces the pack serves; a test id per namespace (``pl`` / ``L``).
NAMESPACE_IDS = {"pytorch_lightning": "pl", "lightning.pytorch": "L"}


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False


#: The namespaces installed here, ``pytorch_lightning`` first.
NAMESPACE_NAMES = [name for name in NAMESPACE_IDS if _installed(name)]


@dataclass(frozen=True)
class Namespace:
    """One Lightning namespace: its module and the classes a test builds from it."""

    name: str
    module: ModuleType

    @property
    def id(self) -> str:
        """``"pl"`` or ``"L"``."""
        return NAMESPACE_IDS[self.name]

    def sub(self, dotted: str) -> ModuleType:
        """The namespace's submodule ``dotted`` (e.g. ``"strategies"``)."""
        return importlib.import_module(f"{self.name}.{dotted}")

    @property
    def Trainer(self) -> Any:
        return self.module.Trainer

    @property
    def Callback(self) -> Any:
        return self.module.Callback

    @property
    def LightningModule(self) -> Any:
        return self.module.LightningModule

    @property
    def BoringModel(self) -> Any:
        return self.sub("demos.boring_classes").BoringModel

    @property
    def RandomDataset(self) -> Any:
        return self.sub("demos.boring_classes").RandomDataset

    @property
    def ModelCheckpoint(self) -> Any:
        return self.sub("callbacks").ModelCheckpoint

    @property
    def StrategyRegistry(self) -> Any:
        return self.sub("strategies").StrategyRegistry

    @property
    def DDPStrategy(self) -> Any:
        return self.sub("strategies").DDPStrategy

    @property
    def LightningCLI(self) -> Any:
        return self.sub("cli").LightningCLI

    @property
    def strategy_class(self) -> Any:
        """The pack's ``DDPSpeedpackStrategy`` for this namespace."""
        module = "pytorch_lightning" if self.name == "pytorch_lightning" else "lightning"
        return importlib.import_module(
            f"lightning_speedpack.strategies.{module}"
        ).DDPSpeedpackStrategy

    @property
    def SizedBoringModel(self) -> Any:
        """``tests.helpers.models.SizedBoringModel``, built on this namespace's BoringModel."""
        return _sized_boring_model(self.name)


@functools.cache
def _sized_boring_model(name: str) -> type[Any]:
    ns = load(name)
    boring, random_dataset = ns.BoringModel, ns.RandomDataset

    def __init__(self: Any, batch_size: int = 8, length: int = 64) -> None:
        boring.__init__(self)
        self.batch_size = batch_size
        self.length = length

    def train_dataloader(self: Any) -> DataLoader[Any]:
        return DataLoader(random_dataset(32, self.length), batch_size=self.batch_size)

    def val_dataloader(self: Any) -> DataLoader[Any]:
        return DataLoader(random_dataset(32, self.length), batch_size=self.batch_size)

    qualname = f"SizedBoringModel_{NAMESPACE_IDS[name]}"
    cls = type(
        "SizedBoringModel",
        (boring,),
        {
            "__init__": __init__,
            "train_dataloader": train_dataloader,
            "val_dataloader": val_dataloader,
            "__module__": __name__,
            "__qualname__": qualname,
        },
    )
    globals()[qualname] = cls  # picklable by name, as a class defined here would be
    return cls


@functools.cache
def load(name: str) -> Namespace:
    """The :class:`Namespace` ``name``: ``"pytorch_lightning"`` or ``"lightning.pytorch"``."""
    return Namespace(name, importlib.import_module(name))


#: Every installed namespace, loaded.
NAMESPACES = [load(n) for n in NAMESPACE_NAMES]

#: ``@each_namespace`` runs a test once per installed namespace, as its ``ns`` argument.
each_namespace = pytest.mark.parametrize("ns", NAMESPACES, ids=lambda n: n.id)


@pytest.fixture(params=NAMESPACE_NAMES, ids=[NAMESPACE_IDS[n] for n in NAMESPACE_NAMES])
def ns(request: pytest.FixtureRequest) -> Namespace:
    """Each installed Lightning namespace in turn."""
    return load(request.param)


def snapshot() -> dict[str, Any]:
    """:func:`tests.helpers.global_state.snapshot` plus every namespace's ``Trainer.__init__``."""
    state = global_state.snapshot()
    state["trainer_inits"] = {n: id(load(n).Trainer.__init__) for n in NAMESPACE_NAMES}
    return state
