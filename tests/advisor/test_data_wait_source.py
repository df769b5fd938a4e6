"""SpeedAdvisor's data wait is the DataLoader's fetch: other callbacks' hooks are not "waiting"."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader, Dataset

from lightning_speedpack import SpeedAdvisor
from tests.helpers.models import quiet_trainer_kwargs
from tests.helpers.namespaces import Namespace, each_namespace

NAP = 0.03


class _SlowItems(Dataset[Any]):
    def __init__(self, nap: float) -> None:
        self.nap = nap

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> Any:
        time.sleep(self.nap)
        return index


def _fit(ns: Namespace, tmp_path: Path, callbacks: list[Any], item_nap: float) -> Any:
    advisor = SpeedAdvisor(measure_steps=4, verbose=False)

    class Model(ns.SizedBoringModel):  # type: ignore[misc, name-defined]
        def train_dataloader(self) -> DataLoader[Any]:
            ds = ns.RandomDataset(32, 64)
            slow = _SlowItems(item_nap)
            return DataLoader([(ds[i], slow) for i in range(64)], batch_size=8, collate_fn=_collate)

    trainer = ns.Trainer(
        callbacks=[advisor, *callbacks],
        **quiet_trainer_kwargs(tmp_path, max_steps=6, limit_val_batches=0),
    )
    trainer.fit(Model())
    return advisor, trainer


def _collate(items: list[Any]) -> Any:
    import torch

    for _, slow in items[:1]:
        time.sleep(slow.nap)  # one nap per batch, inside the fetch
    return torch.stack([x for x, _ in items])


@each_namespace
def test_a_slow_callback_hook_is_not_counted_as_data_wait(ns: Namespace, tmp_path: Path) -> None:
    class SlowHook(ns.Callback):  # type: ignore[misc, name-defined]
        def on_train_batch_end(self, *args: Any) -> None:
            time.sleep(NAP)

    advisor, trainer = _fit(ns, tmp_path, [SlowHook()], item_nap=0.0)
    assert advisor.measured_steps == 4
    assert advisor.data_wait_fraction is not None
    assert advisor.data_wait_fraction < 0.2  # the hook's 30 ms a step went to the step
    assert "data-wait" not in [f.id for f in advisor.findings]
    assert "start" not in vars(trainer.profiler)  # nothing left on the user's profiler


@each_namespace
def test_a_slow_fetch_is_data_wait(ns: Namespace, tmp_path: Path) -> None:
    # A long fetch (0.25 s a batch), so that no load on the machine makes the step as long.
    advisor, _ = _fit(ns, tmp_path, [], item_nap=0.25)
    assert advisor.data_wait_fraction is not None
    assert advisor.data_wait_fraction > 0.5
    assert "data-wait" in [f.id for f in advisor.findings]
