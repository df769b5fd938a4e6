"""Every exported callback fits twice, resumes, pickles, and leaves nothing behind."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from pytorch_lightning import Callback, Trainer
from pytorch_lightning.callbacks import ModelCheckpoint

import lightning_speedpack
from tests.helpers import global_state
from tests.helpers.models import SizedBoringModel, quiet_trainer_kwargs

EXPORTED_CALLBACKS = sorted(
    (
        obj
        for name in lightning_speedpack.__all__
        if isinstance(obj := getattr(lightning_speedpack, name), type) and issubclass(obj, Callback)
    ),
    key=lambda cls: cls.__name__,
)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _fit(callback: Callback, tmp_path: Path, **kwargs: Any) -> Trainer:
    ckpt_path = kwargs.pop("ckpt_path", None)
    trainer = Trainer(
        callbacks=[callback, *kwargs.pop("extra_callbacks", [])],
        **quiet_trainer_kwargs(tmp_path, max_steps=kwargs.pop("max_steps", 4), **kwargs),
    )
    trainer.fit(SizedBoringModel(), ckpt_path=ckpt_path)
    return trainer


def test_every_public_callback_is_in_the_contract() -> None:
    # Pinned by name: a callback that stops being exported (or a new one) changes this list.
    assert [cls.__name__ for cls in EXPORTED_CALLBACKS] == [
        "BatchSizeTuner",
        "LossRetentionDetector",
        "SpeedAdvisor",
        "SyncPointWarnings",
        "ThroughputLogger",
    ]


@pytest.mark.parametrize("cls", EXPORTED_CALLBACKS, ids=lambda c: c.__name__)
def test_constructs_with_defaults_and_pickles(cls: type[Callback]) -> None:
    callback = cls()
    clone = pickle.loads(pickle.dumps(callback))
    assert type(clone) is cls
    copy.deepcopy(callback)


@pytest.mark.parametrize("cls", EXPORTED_CALLBACKS, ids=lambda c: c.__name__)
def test_fits_twice_and_leaves_no_global_state(cls: type[Callback], tmp_path: Path) -> None:
    before = global_state.snapshot()
    callback = cls()
    _fit(callback, tmp_path / "a")
    _fit(callback, tmp_path / "b")
    assert global_state.diff(before, global_state.snapshot()) == {}
    pickle.loads(pickle.dumps(callback))  # still picklable after fitting (ddp_spawn)


@pytest.mark.parametrize("cls", EXPORTED_CALLBACKS, ids=lambda c: c.__name__)
def test_checkpoint_save_and_restore(cls: type[Callback], tmp_path: Path) -> None:
    callback = cls()
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    _fit(callback, tmp_path, extra_callbacks=[ckpt], enable_checkpointing=True)
    saved = torch.load(ckpt.last_model_path, weights_only=False)
    state = callback.state_dict()
    if state:
        assert _same(saved["callbacks"][callback.state_key], state)
    resumed = cls()
    restored: list[dict[str, Any]] = []
    load = resumed.load_state_dict
    resumed.load_state_dict = lambda sd: (restored.append(sd), load(sd))[1]  # type: ignore[method-assign]
    _fit(
        resumed,
        tmp_path,
        max_steps=6,
        ckpt_path=ckpt.last_model_path,
        extra_callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)],
        enable_checkpointing=True,
    )
    if state:  # the resumed run started from exactly what was saved
        assert len(restored) == 1
        assert _same(restored[0], state)


@pytest.mark.parametrize("cls", EXPORTED_CALLBACKS, ids=lambda c: c.__name__)
def test_no_global_state_after_an_exception_mid_fit(cls: type[Callback], tmp_path: Path) -> None:
    class Boom(SizedBoringModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if batch_idx == 2:
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

    before = global_state.snapshot()
    trainer = Trainer(callbacks=[cls()], **quiet_trainer_kwargs(tmp_path, max_steps=4))
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Boom())
    assert global_state.diff(before, global_state.snapshot()) == {}
