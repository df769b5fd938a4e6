"""Holders in module globals around the fit are found by the per-step walk, within 2 batches.

No heap scan runs before the end of these fits (``deep_scan_every_n_steps=0``), so a finding
during the fit can only come from the walk of ``__main__``'s globals and of the modules that
define the LightningModule, the datamodule and the callbacks.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
import types
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from pytorch_lightning import Callback, LightningModule, Trainer
from pytorch_lightning.demos.boring_classes import BoringModel

from lightning_speedpack import LossRetentionDetector
from lightning_speedpack.retention.roots import WalkRoots
from lightning_speedpack.retention.walk import defining_modules, walk_containers
from tests.helpers.models import quiet_trainer_kwargs


class FirstReport(Callback):
    """The batch at which the detector (earlier in the callback list) first reported."""

    def __init__(self, detector: LossRetentionDetector) -> None:
        self.detector = detector
        self.batch = -1
        self.reported_at: int | None = None

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        self.batch += 1
        if self.reported_at is None and self.detector.findings:
            self.reported_at = self.batch


def _fit(model: LightningModule, tmp_path: Path, *callbacks: Callback, **kwargs: Any) -> Any:
    detector = LossRetentionDetector(deep_scan_every_n_steps=0)
    probe = FirstReport(detector)
    trainer = Trainer(
        callbacks=[detector, *callbacks, probe],
        **quiet_trainer_kwargs(tmp_path, max_steps=6),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, **kwargs)
    (finding,) = detector.findings
    return finding.path, finding.step_first_seen, probe.reported_at


@pytest.fixture
def tmp_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """Write ``source`` as ``<name>.py`` under tmp_path and import it (removed afterwards)."""
    names: list[str] = []

    def make(name: str, source: str) -> Any:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        monkeypatch.syspath_prepend(str(tmp_path))
        names.append(name)
        return importlib.import_module(name)

    yield make
    for name in names:
        sys.modules.pop(name, None)


class MainLeak(BoringModel):
    """Appends its loss to the training script's ``GLOBAL_LOSSES`` (held by ``__main__``)."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        out = super().training_step(batch, batch_idx)
        sys.modules["__main__"].GLOBAL_LOSSES.append(out["loss"])
        return out


def test_a_global_of_the_training_script_is_found_within_two_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = types.ModuleType("__main__")
    script.__file__ = str(tmp_path / "train_script.py")
    script.GLOBAL_LOSSES = []  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "__main__", script)
    # found at batch 1 (one loss from batch 0 is retained), reported at 2 (two are)
    assert _fit(MainLeak(), tmp_path) == ("train_script.GLOBAL_LOSSES", 1, 2)


def test_a_global_of_the_lightning_modules_module_is_found_within_two_batches(
    tmp_path: Path, tmp_module: Callable[..., Any]
) -> None:
    mod = tmp_module(
        "leaky_model",
        """
        from pytorch_lightning.demos.boring_classes import BoringModel

        HISTORY = {"train": []}

        class Model(BoringModel):
            def training_step(self, batch, batch_idx):
                out = super().training_step(batch, batch_idx)
                HISTORY["train"].append(out["loss"])
                return out
        """,
    )
    assert _fit(mod.Model(), tmp_path) == ('leaky_model.HISTORY["train"]', 1, 2)


def test_a_global_of_a_callbacks_module_is_found_within_two_batches(
    tmp_path: Path, tmp_module: Callable[..., Any]
) -> None:
    mod = tmp_module(
        "loss_tracker",
        """
        from pytorch_lightning import Callback

        SEEN = []

        class LossTracker(Callback):
            def on_before_backward(self, trainer, pl_module, loss):
                SEEN.append(loss)  # the loss with its graph
        """,
    )
    assert _fit(BoringModel(), tmp_path, mod.LossTracker()) == ("loss_tracker.SEEN", 1, 2)


def test_a_global_of_the_datamodules_module_is_found_within_two_batches(
    tmp_path: Path, tmp_module: Callable[..., Any]
) -> None:
    mod = tmp_module(
        "leaky_data",
        """
        from pytorch_lightning import LightningDataModule
        from pytorch_lightning.demos.boring_classes import RandomDataset
        from torch.utils.data import DataLoader

        KEPT = []

        class Data(LightningDataModule):
            def train_dataloader(self):
                return DataLoader(RandomDataset(32, 64), batch_size=2)
        """,
    )

    class Model(BoringModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            out = super().training_step(batch, batch_idx)
            mod.KEPT.append(out["loss"] * 2)
            return out

    assert _fit(Model(), tmp_path, datamodule=mod.Data()) == ("leaky_data.KEPT", 1, 2)


# ------------------------------------------------------------------ the pieces


def test_defining_modules_skip_torch_lightning_and_the_standard_library() -> None:
    from collections import OrderedDict

    base = type("Base", (OrderedDict,), {"__module__": "my_lib"})
    mine = type("Mine", (base,), {"__module__": "my_script"})
    assert defining_modules([mine(), BoringModel(), torch.ones(1), 3]) == ["my_script", "my_lib"]


def test_walk_roots_read_values_each_time_but_names_on_refresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    script = types.ModuleType("__main__")
    script.__file__ = "/somewhere/run.py"
    script.A = []  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "__main__", script)
    roots = WalkRoots(refresh_every=4)
    assert [(n, list(v)) for n, v in roots.roots(0, list)] == [("run", ["A"])]
    script.A = [1]  # type: ignore[attr-defined]  # a new value: read at once
    script.B = []  # type: ignore[attr-defined]  # a new name: seen at the next refresh
    assert [(n, dict(v)) for n, v in roots.roots(1, list)] == [("run", {"A": [1]})]
    assert [(n, list(v)) for n, v in roots.roots(4, list)] == [("run", ["A", "B"])]


def test_one_large_root_does_not_hide_the_next() -> None:
    big = [[torch.ones(1)] for _ in range(100)]
    leaked = [torch.ones(1, requires_grad=True) * 2]
    paths = [p for p, _ in walk_containers([("big", big), ("small", leaked)], max_objects=5)]
    assert paths == ["small[0]"]


def test_an_exact_walk_lists_no_more_records_than_it_can_enter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The end-of-fit walk counts every item (no sampling); a datamodule holding 50,000 records
    # used to be listed in full (seconds at millions of records) only to enter 5,000 of them.
    from lightning_speedpack.retention import walk

    kinds = 0
    kind = walk._kind

    def counting(cls: type) -> int:
        nonlocal kinds
        kinds += 1
        return kind(cls)

    monkeypatch.setattr(walk, "_kind", counting)
    records = [([i, i + 1], i) for i in range(50_000)]
    losses = [torch.ones(1, requires_grad=True) * i for i in range(300)]
    roots = [("data", {"records": records}), ("model", {"losses": losses})]
    found = [p for p, _ in walk_containers(roots, max_objects=1000, sample_long=False)]
    assert found == [f'model["losses"][{i}]' for i in range(300)]  # every held loss, exactly
    assert kinds < 10_000  # not one look per record


def test_the_final_heap_scan_keeps_to_its_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scans = {}
    for budget in (1e-9, 0, None):
        detector = LossRetentionDetector(deep_scan_every_n_steps=0, final_scan_budget=budget)
        trainer = Trainer(callbacks=[detector], **quiet_trainer_kwargs(tmp_path, max_steps=3))
        trainer.fit(BoringModel())
        scans[budget] = (detector._scans, detector.doctor_figures()["end_heap_scan"])
    assert scans == {1e-9: (0, False), 0: (0, False), None: (1, True)}  # None: always


@pytest.mark.parametrize(
    ("budget", "error", "match"),
    [
        ("5%", TypeError, "float or None, got str"),
        (True, TypeError, "got bool"),
        (-0.1, ValueError, "non-negative"),
        (float("nan"), ValueError, "non-negative"),
    ],
)
def test_final_scan_budget_is_validated(budget: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        LossRetentionDetector(final_scan_budget=budget)
