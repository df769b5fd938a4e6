"""Under DDP the doctor names ranks that trained on the same batches (a stream not split).

Real 2-rank fits (gloo, CPU) under ``speedpack doctor``, the data an ``IterableDataset``: as
users first write one, every rank reads the whole stream (Lightning does not split a stream
and does not warn); sharded by the global rank, each reads its own half.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from lightning_speedpack.core.findings import findings_from_dicts
from lightning_speedpack.doctor.grouping import presented
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
    assert same == {"groups": [[0, 1]], "world": 2, "batches": 4, "distinct": 1}
    first = warnings[0]
    assert (first.component, first.id) == ("world", "same-batches")
    assert first.message.startswith("every rank trained on the same batches (")
    assert run["samples"] == 2 * 2 * 128  # each rank read all 128 samples, twice
