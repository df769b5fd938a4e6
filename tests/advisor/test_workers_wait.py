"""Issue 24: no "add workers" warning when the advisor measured the step hardly waiting for data."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from lightning_speedpack import SpeedAdvisor
from lightning_speedpack.advisor.data_loading import MIN_WAIT_STEPS, WORKERS_WAIT_THRESHOLD
from lightning_speedpack.advisor.rules import AdvisorFinding
from tests.helpers.models import quiet_trainer_kwargs
from tests.helpers.namespaces import Namespace, each_namespace

MEASURED = 6  # steps measured after the warm-up: enough for the advisor to trust its figure


class _SlowFetch(Dataset[torch.Tensor]):
    """Samples that take ``nap`` seconds each to 'decode', in the training process."""

    def __init__(self, nap: float) -> None:
        self.x = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))
        self.nap = nap

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.nap)
        return self.x[i]


def _fit(ns: Namespace, tmp_path: Path, dataset: Dataset[Any], step_sleep: float) -> SpeedAdvisor:
    advisor = SpeedAdvisor(measure_steps=MEASURED, verbose=False)

    class Model(ns.BoringModel):  # type: ignore[misc, name-defined]
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            time.sleep(step_sleep)  # the step's own work, without taking the busy cores
            x = batch[0] if isinstance(batch, (list, tuple)) else batch
            return super().training_step(x, batch_idx)

        def train_dataloader(self) -> DataLoader[Any]:
            return DataLoader(dataset, batch_size=4, num_workers=0)

    trainer = ns.Trainer(
        callbacks=[advisor],
        **quiet_trainer_kwargs(tmp_path, max_steps=MEASURED + 1, limit_val_batches=0),
    )
    trainer.fit(Model())
    assert advisor.measured_steps == MEASURED >= MIN_WAIT_STEPS
    assert advisor.data_wait_fraction is not None
    return advisor


def _workers(advisor: SpeedAdvisor) -> AdvisorFinding:
    (workers,) = (f for f in advisor.findings if f.id == "dataloader-workers")
    return workers


@each_namespace
def test_in_memory_data_with_no_workers_gets_no_workers_warning(
    ns: Namespace, tmp_path: Path
) -> None:
    # In-memory tensors: a fetch indexes and stacks (~0.3 ms here) while the step does 100 ms
    # of work, asleep: a loaded machine can stretch the fetch, but not twentyfold on average.
    data = TensorDataset(torch.randn(64, 32, generator=torch.Generator().manual_seed(0)))
    advisor = _fit(ns, tmp_path, data, step_sleep=0.1)
    fraction = advisor.data_wait_fraction
    assert fraction is not None
    assert fraction < WORKERS_WAIT_THRESHOLD
    assert not [
        f for f in advisor.findings if f.id == "dataloader-workers" and f.severity != "info"
    ]
    workers = _workers(advisor)  # kept, as info, with the figure that says why
    assert workers.evidence.startswith("train_dataloader: num_workers=0; measured: the step waits ")
    assert workers.evidence.endswith(" of its time for data; workers would not pay here")
    assert workers.figures["data_wait_fraction"] == round(fraction, 4)
    assert workers.figures["steps"] == MEASURED
    (doc,) = (f for f in advisor.doctor_findings() if f.id == "dataloader-workers")
    assert doc.severity == "info"


@each_namespace
def test_a_slow_fetch_with_no_workers_still_gets_the_warning(ns: Namespace, tmp_path: Path) -> None:
    # 0.25 s of 'decoding' per batch of 4, against a step of a few ms: no load on the machine
    # makes the step as long as the planted wait.
    advisor = _fit(ns, tmp_path, _SlowFetch(nap=0.0625), step_sleep=0.0)
    assert (advisor.data_wait_fraction or 0.0) > 0.5
    workers = _workers(advisor)
    assert workers.severity == "warning"
    assert workers.evidence == "train_dataloader: num_workers=0"
    assert "data_wait_fraction" not in workers.figures
    assert "data-wait" in [f.id for f in advisor.findings]
