"""The doctor names batches that repeat: on every rank (a stream not split), or in an epoch.

Real fits under the doctor, the data an ``IterableDataset`` as users first write one. Under
DDP (2 ranks, gloo, CPU, ``speedpack doctor``) every rank reads the whole stream (Lightning does
not split a stream and does not warn); sharded by the global rank, each reads its own half. In
one process with two DataLoader workers, each worker reads the whole stream; sharded by
``get_worker_info()``, each reads its own half.
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from pytorch_lightning import LightningModule, Trainer
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from lightning_speedpack.core.findings import findings_from_dicts
from lightning_speedpack.doctor.grouping import presented
from lightning_speedpack.doctor.runner import DoctorSession
from tests.helpers.models import quiet_trainer_kwargs
from tests.helpers.procs import run_in_session

SCRIPT = """
import sys
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset
from pytorch_lightning import LightningModule, Trainer

SHARDED = sys.argv[1] == "sharded"


class Stream(IterableDataset):
    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        rows = [(torch.randn(32, generator=g), int(i % 4)) for i in range(128)]
        if SHARDED:  # what the fix says: the global rank picks this rank's part
            rank = torch.distributed.get_rank()
            rows = rows[rank :: torch.distributed.get_world_size()]
        return iter(rows)


class Model(LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return DataLoader(Stream(), batch_size=8)


trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                  enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False)
trainer.fit(Model())
"""


@pytest.mark.ddp
@pytest.mark.timeout(300)
@pytest.mark.parametrize("data", ["whole", "sharded"])
def test_ranks_reading_the_whole_stream_are_the_first_warning(tmp_path: Path, data: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    report_path = tmp_path / "report.json"
    command = [sys.executable, "-m", "lightning_speedpack", "doctor", "--quiet", "--json"]
    proc = run_in_session(
        [*command, str(report_path), str(script), data], timeout=280, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(report_path.read_text())
    (run,) = report["runs"]
    same = run["figures"]["world"]["same_batches"]
    warnings = [
        f for f in presented(findings_from_dicts(report["findings"])) if f.severity != "info"
    ]
    if data == "sharded":
        assert same is None
        assert not any(f.id == "same-batches" for f in warnings)
        return
    assert same == {"groups": [[0, 1]], "world": 2, "batches": 16, "distinct": 1}
    first = warnings[0]
    assert (first.component, first.id) == ("world", "same-batches")
    assert first.message.startswith("every rank trained on the same batches (")
    assert run["samples"] == 2 * 2 * 128  # each rank read all 128 samples, twice


class Stream(IterableDataset[tuple[torch.Tensor, int]]):
    def __init__(self, by_worker: bool) -> None:
        self.by_worker = by_worker

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        g = torch.Generator().manual_seed(0)
        rows = [(torch.randn(32, generator=g), i % 4) for i in range(128)]
        info = get_worker_info()
        if self.by_worker and info is not None:  # what the fix says
            rows = rows[info.id :: info.num_workers]
        return iter(rows)


class StreamModel(LightningModule):
    def __init__(self, by_worker: bool, workers: int) -> None:
        super().__init__()
        self.by_worker, self.workers = by_worker, workers
        self.net = nn.Linear(32, 4)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(Stream(self.by_worker), batch_size=8, num_workers=self.workers)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 8 workers on 2 cores
@pytest.mark.parametrize(
    ("by_worker", "workers"),
    [(False, 2), (True, 2), (False, 8)],
    ids=["whole", "by-worker", "whole-8-workers"],
)
def test_a_stream_every_worker_reads_whole_is_named_in_one_process(
    tmp_path: Path, by_worker: bool, workers: int
) -> None:
    session = DoctorSession()
    with session.installed():
        trainer = Trainer(**quiet_trainer_kwargs(tmp_path, max_epochs=1))
    trainer.fit(StreamModel(by_worker, workers))
    report = session.report()
    repeated = [f for f in report.findings if f.id == "repeated-batches"]
    # each worker's copy of the 16 batches, or its part of them
    assert trainer.global_step == (16 if by_worker else 16 * workers)
    if by_worker:
        assert repeated == []
        assert report.runs[0].figures["repeated_batches"] is None
        return
    (finding,) = repeated
    assert finding.severity == "warning"
    groups = report.runs[0].figures["repeated_batches"]["groups"]
    if workers == 2:
        assert "batches 0 and 1 are one; 2 and 3 too;" in finding.message
        assert groups[:2] == [[0, 1], [2, 3]]
        return
    # 8 workers: the first 8 batches are all one (before, taken for constant data: no warning)
    assert "batches 0 to 7 are one" in finding.message
    assert groups[0] == list(range(8))
    assert finding.figures["wall_fraction"] == 0.875
