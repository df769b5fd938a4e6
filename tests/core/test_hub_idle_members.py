"""Members of the doctor's HookHub that are done for the fit stop being called each batch.

SpeedAdvisor measures its first steps, BatchSizeTuner reads the batch size in use once: after
that, their per-batch hooks have nothing to do, and under a hub they are not called at all
(a millisecond step pays for every call). A new fit calls them again from its first batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytorch_lightning import Trainer

from lightning_speedpack import BatchSizeTuner, SpeedAdvisor
from lightning_speedpack.core.hook_hub import HookHub
from tests.helpers.models import TinyCNN, quiet_trainer_kwargs


class CountedAdvisor(SpeedAdvisor):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls: dict[str, list[int]] = {"start": [], "backward": [], "end": []}

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, idx: int) -> None:
        self.calls["start"].append(idx)
        super().on_train_batch_start(trainer, pl_module, batch, idx)

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self.calls["backward"].append(trainer.global_step)
        super().on_before_backward(trainer, pl_module, loss)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, idx: int
    ) -> None:
        self.calls["end"].append(idx)
        super().on_train_batch_end(trainer, pl_module, outputs, batch, idx)


class CountedTuner(BatchSizeTuner):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.starts: list[int] = []

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, idx: int) -> None:
        self.starts.append(idx)
        super().on_train_batch_start(trainer, pl_module, batch, idx)


def _fit(callbacks: list[Any], tmp_path: Path, steps: int = 12) -> None:
    trainer = Trainer(callbacks=callbacks, **quiet_trainer_kwargs(tmp_path, max_steps=steps))
    trainer.fit(TinyCNN(batch_size=4, n=64))


def test_the_advisor_is_not_called_after_its_measured_steps_and_reports_the_same(
    tmp_path: Path,
) -> None:
    alone = CountedAdvisor(measure_steps=3, verbose=False)
    _fit([alone], tmp_path / "alone")
    assert alone.calls["end"] == list(range(12))  # no hub: every batch, as before

    advisor = CountedAdvisor(measure_steps=3, verbose=False)
    hub = HookHub([advisor], owns=True)
    _fit([hub], tmp_path / "hub")
    # the warm-up batch and 3 measured ones (batch indices; the backward by optimizer step);
    # none after the report
    assert advisor.calls == {"start": [0, 1, 2, 3], "backward": [0, 1, 2, 3], "end": [0, 1, 2, 3]}
    assert advisor.measured_steps == alone.measured_steps == 3
    assert [f.id for f in advisor.findings] == [f.id for f in alone.findings]

    _fit([hub], tmp_path / "again", steps=6)  # a new fit: measured again from its first batch
    assert advisor.calls["end"][4:] == [0, 1, 2, 3]
    assert advisor.measured_steps == 3


def test_the_tuner_reads_the_batch_size_once_a_fit_under_a_hub(tmp_path: Path) -> None:
    tuner = CountedTuner(report_only=True, verbose=False)
    hub = HookHub([tuner], owns=True)
    _fit([hub], tmp_path / "one", steps=8)
    assert tuner.starts == [0]  # the loader's batch size was known: nothing left to read
    _fit([hub], tmp_path / "two", steps=8)
    assert tuner.starts == [0, 0]

    alone = CountedTuner(report_only=True, verbose=False)
    _fit([alone], tmp_path / "alone", steps=8)
    assert alone.starts == list(range(8))
