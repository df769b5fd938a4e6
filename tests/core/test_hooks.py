"""The pack's callbacks keep Lightning from dispatching their no-op per-batch hooks."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest
from pytorch_lightning import Trainer
from pytorch_lightning.demos.boring_classes import BoringModel

from lightning_speedpack import ThroughputLogger
from lightning_speedpack.core.hooks import PER_BATCH_HOOKS, overrides, silenced_hooks
from lightning_speedpack.core.lightning import Callback
from tests.helpers.models import ProfiledNames as Names


class Counting(Callback):
    """A pack-style callback overriding one per-batch hook."""

    def __init__(self) -> None:
        self.ends = 0

    def on_train_batch_end(self, *args: Any) -> None:
        self.ends += 1


class Sub(Counting):
    """A user's subclass that adds a hook and calls up to Lightning's default."""

    def __init__(self) -> None:
        super().__init__()
        self.backwards = 0

    def on_before_backward(self, *args: Any) -> None:
        self.backwards += 1
        super().on_before_backward(*args)  # Lightning's empty default, through the class


def _fit(callback: Callback, profiler: Names) -> None:
    trainer = Trainer(
        max_steps=4,
        limit_val_batches=0,
        callbacks=[callback],
        profiler=profiler,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(BoringModel())


def test_lightning_calls_only_the_hooks_a_pack_callback_overrides() -> None:
    counting, profiler = Counting(), Names()
    _fit(counting, profiler)
    assert counting.ends == 4
    hooks = {n.rpartition(".")[2] for n in profiler.names if n.startswith("[Callback]Counting.")}
    assert "on_train_batch_end" in hooks
    # Without the silencing Lightning profiles a call of each default too, every batch.
    assert not hooks & (set(PER_BATCH_HOOKS) - {"on_train_batch_end"})
    assert "on_train_start" in hooks  # once-a-fit hooks keep Lightning's dispatch


def test_a_subclass_keeps_its_own_hooks_and_super_reaches_the_default() -> None:
    sub, profiler = Sub(), Names()
    _fit(sub, profiler)
    assert (sub.ends, sub.backwards) == (4, 4)
    assert "on_before_backward" not in silenced_hooks(Sub)
    assert "on_before_backward" in silenced_hooks(Counting)


@pytest.mark.parametrize("clone", [copy.deepcopy, lambda c: pickle.loads(pickle.dumps(c))])
def test_a_copied_callback_is_silenced_and_works(clone: Any) -> None:
    logger = clone(ThroughputLogger())
    assert logger.on_before_zero_grad is None
    assert callable(logger.on_train_batch_end)


def test_overrides_sees_through_lightning_bases() -> None:
    from pytorch_lightning import LightningModule

    class Model(LightningModule):
        def validation_step(self, batch: Any, batch_idx: int) -> None: ...

    class Child(Model):
        pass

    assert overrides(Child, "validation_step")
    assert not overrides(Child, "test_step")
    assert not overrides(Child, "no_such_hook")
