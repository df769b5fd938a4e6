"""A cheap reader of the global step reads what ``trainer.global_step`` does, batch after batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pytorch_lightning import Trainer
from pytorch_lightning.demos.boring_classes import BoringModel

from lightning_speedpack.core.steps import step_reader
from tests.helpers.models import quiet_trainer_kwargs


class _Reads(BoringModel):
    """Compares the reader with ``trainer.global_step`` at every batch's end."""

    def __init__(self) -> None:
        super().__init__()
        self.pairs: list[tuple[int, int]] = []

    def on_train_start(self) -> None:
        self.read_step = step_reader(self.trainer)

    def on_train_batch_end(self, *args: Any) -> None:
        self.pairs.append((self.read_step(), self.trainer.global_step))


class _Manual(_Reads):
    """Two optimizer steps a batch by hand: two global steps a batch."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> None:
        opt = self.optimizers()
        assert not isinstance(opt, list)
        for _ in range(2):
            opt.zero_grad()
            self.manual_backward(self.step(batch).sum())
            opt.step()


@pytest.mark.parametrize(
    ("kind", "kwargs"),
    [(_Reads, {}), (_Reads, {"accumulate_grad_batches": 3}), (_Manual, {})],
    ids=["automatic", "accumulating", "manual"],
)
def test_it_reads_the_global_step_at_every_batch(
    kind: type[_Reads], kwargs: dict[str, Any], tmp_path: Path
) -> None:
    model = kind()
    kw = quiet_trainer_kwargs(tmp_path, max_epochs=2, limit_train_batches=7, limit_val_batches=0)
    Trainer(**kw, **kwargs).fit(model)
    assert len(model.pairs) == 14
    assert all(read == expected for read, expected in model.pairs), model.pairs
    assert model.pairs[-1][1] > 0


def test_where_the_loops_are_not_lightnings_it_reads_the_property() -> None:
    class Odd:
        global_step = 5
        lightning_module = None

    read = step_reader(Odd())
    assert read() == 5
    Odd.global_step = 6
    assert read() == 6
