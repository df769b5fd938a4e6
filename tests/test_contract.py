"""Every exported callback fits twice, resumes, pickles, and leaves nothing behind.

Each test runs once per installed Lightning namespace (``pytorch_lightning`` and
``lightning.pytorch``): a callback is used exactly as a user of that namespace would use it.
"""

from __future__ import annotations

import copy
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

import lightning_speedpack
from tests.helpers import global_state, namespaces
from tests.helpers.models import quiet_trainer_kwargs
from tests.helpers.namespaces import NAMESPACES, Namespace, each_namespace

#: The Callback class of every installed namespace.
CALLBACK_BASES = tuple(ns.Callback for ns in NAMESPACES)

EXPORTED_CALLBACKS = sorted(
    (
        obj
        for name in lightning_speedpack.__all__
        if isinstance(obj := getattr(lightning_speedpack, name), type)
        and issubclass(obj, CALLBACK_BASES)
    ),
    key=lambda cls: cls.__name__,
)

each_callback = pytest.mark.parametrize("cls", EXPORTED_CALLBACKS, ids=lambda c: c.__name__)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _fit(ns: Namespace, callback: Any, tmp_path: Path, **kwargs: Any) -> Any:
    ckpt_path = kwargs.pop("ckpt_path", None)
    trainer = ns.Trainer(
        callbacks=[callback, *kwargs.pop("extra_callbacks", [])],
        **quiet_trainer_kwargs(tmp_path, max_steps=kwargs.pop("max_steps", 4), **kwargs),
    )
    trainer.fit(ns.SizedBoringModel(), ckpt_path=ckpt_path)
    return trainer


def test_every_public_callback_is_in_the_contract() -> None:
    # Pinned by name: a callback that stops being exported (or a new one) changes this list.
    assert [cls.__name__ for cls in EXPORTED_CALLBACKS] == [
        "BatchSizeTuner",
        "CommMonitor",
        "DataPipelineProfiler",
        "LossRetentionDetector",
        "SpeedAdvisor",
        "StepTimeline",
        "SyncPointWarnings",
        "ThroughputLogger",
        "WallTimeLedger",
        "WhatIf",
    ]


@each_callback
def test_is_a_callback_of_every_installed_namespace(cls: type[Any]) -> None:
    assert len(CALLBACK_BASES) == len(NAMESPACES) >= 1
    callback = cls()
    for base in CALLBACK_BASES:  # what each Trainer and each LightningCLI parser checks
        assert issubclass(cls, base)
        assert isinstance(callback, base)
    clone = pickle.loads(pickle.dumps(callback))
    assert all(isinstance(clone, base) for base in CALLBACK_BASES)


@each_callback
def test_constructs_with_defaults_and_pickles(cls: type[Any]) -> None:
    callback = cls()
    clone = pickle.loads(pickle.dumps(callback))
    assert type(clone) is cls
    copy.deepcopy(callback)


@each_namespace
@each_callback
def test_fits_twice_and_leaves_no_global_state(
    cls: type[Any], ns: Namespace, tmp_path: Path
) -> None:
    before = namespaces.snapshot()
    callback = cls()
    _fit(ns, callback, tmp_path / "a")
    _fit(ns, callback, tmp_path / "b")
    assert global_state.diff(before, namespaces.snapshot()) == {}
    pickle.loads(pickle.dumps(callback))  # still picklable after fitting (ddp_spawn)


@each_namespace
@each_callback
def test_checkpoint_save_and_restore(cls: type[Any], ns: Namespace, tmp_path: Path) -> None:
    callback = cls()
    ckpt = ns.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    _fit(ns, callback, tmp_path, extra_callbacks=[ckpt], enable_checkpointing=True)
    saved = torch.load(ckpt.last_model_path, weights_only=False)
    state = callback.state_dict()
    if state:
        assert _same(saved["callbacks"][callback.state_key], state)
    resumed = cls()
    restored: list[dict[str, Any]] = []
    load = resumed.load_state_dict
    resumed.load_state_dict = lambda sd: (restored.append(sd), load(sd))[1]  # type: ignore[method-assign]
    _fit(
        ns,
        resumed,
        tmp_path,
        max_steps=6,
        ckpt_path=ckpt.last_model_path,
        extra_callbacks=[ns.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)],
        enable_checkpointing=True,
    )
    if state:  # the resumed run started from exactly what was saved
        assert len(restored) == 1
        assert _same(restored[0], state)


@pytest.mark.skipif(len(NAMESPACES) < 2, reason="needs both Lightning namespaces")
@pytest.mark.parametrize(
    ("writer", "reader"),
    # with one namespace installed the test is skipped; the pairs must still be well-formed
    [tuple(NAMESPACES[:2]), tuple(NAMESPACES[1::-1])] if len(NAMESPACES) >= 2 else [(None, None)],
    ids=["pl->L", "L->pl"] if len(NAMESPACES) >= 2 else ["one-namespace"],
)
@each_callback
def test_a_checkpoint_written_under_one_namespace_resumes_under_the_other(
    cls: type[Any], writer: Namespace, reader: Namespace, tmp_path: Path
) -> None:
    callback = cls()
    ckpt = writer.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    # Whole epochs (a mid-epoch resume warns), whatever batch size a tuner picks.
    first = _fit(
        writer, callback, tmp_path, extra_callbacks=[ckpt], enable_checkpointing=True, max_steps=-1
    )
    assert writer.Trainer is not reader.Trainer
    state = callback.state_dict()
    resumed = cls()
    restored: list[dict[str, Any]] = []
    load = resumed.load_state_dict
    resumed.load_state_dict = lambda sd: (restored.append(sd), load(sd))[1]  # type: ignore[method-assign]
    trainer = _fit(
        reader,
        resumed,
        tmp_path / "resumed",
        max_steps=-1,
        max_epochs=2,
        ckpt_path=ckpt.last_model_path,
        extra_callbacks=[reader.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)],
        enable_checkpointing=True,
    )
    assert isinstance(trainer, reader.Trainer)
    assert first.global_step > 0
    assert (
        trainer.global_step == 2 * first.global_step
    )  # resumed after epoch 1, not restarted  # resumed at step 4, not started over
    if state:  # the callback's state came back, whichever namespace wrote it
        assert len(restored) == 1
        assert _same(restored[0], state)


@each_namespace
@each_callback
# The data profiler's model-ceiling probe runs `training_step` too, meets the planted error
# first, and says so in a warning (a probe never ends the fit); the fit then raises it itself.
@pytest.mark.filterwarnings("ignore:DataPipelineProfiler. the model ceiling was not measured")
def test_no_global_state_after_an_exception_mid_fit(
    cls: type[Any], ns: Namespace, tmp_path: Path
) -> None:
    class Boom(ns.SizedBoringModel):  # type: ignore[misc, name-defined]
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if batch_idx == 2:
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

    before = namespaces.snapshot()
    trainer = ns.Trainer(callbacks=[cls()], **quiet_trainer_kwargs(tmp_path, max_steps=4))
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Boom())
    assert global_state.diff(before, namespaces.snapshot()) == {}
