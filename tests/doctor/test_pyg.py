"""A PyTorch Geometric job under the doctor: it runs, and the report counts graphs (issue 36)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from lightning_speedpack.doctor.runner import run_script

pytest.importorskip("torch_geometric")

#: As PyG's docs write it: PyG's own DataLoader, GCNConv, global_mean_pool, and the batch size
#: given to self.log as `num_graphs`.
SCRIPT = """
import torch
import pytorch_lightning as pl
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader
from torch_geometric.nn import GCNConv, global_mean_pool

g = torch.Generator().manual_seed(0)
graphs = []
for i in range(96):
    n = 5 + i % 7
    graphs.append(Data(x=torch.randn(n, 8, generator=g),
                       edge_index=torch.randint(0, n, (2, 3 * n), generator=g),
                       y=torch.tensor([i % 2])))

class GNN(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.conv = GCNConv(8, 16)
        self.head = torch.nn.Linear(16, 2)

    def training_step(self, b, i):
        h = self.conv(b.x, b.edge_index).relu()
        loss = torch.nn.functional.cross_entropy(self.head(global_mean_pool(h, b.batch)), b.y)
        self.log("loss", loss, batch_size=b.num_graphs)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

trainer = pl.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)
trainer.fit(GNN(), DataLoader(graphs, batch_size=16, shuffle=True))
"""


def test_a_pyg_job_runs_under_the_doctor_and_counts_graphs(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    result = run_script(script)
    assert result.exit_code == 0, result.error
    [run] = result.report.runs
    assert run.samples == 2 * 96  # graphs, not nodes (the first tensor has ~750 rows a batch)
    assert run.figures["sample_unit"] == "graphs"
    assert run.figures["h2d_bytes_per_batch"] > 0  # x, edge_index, y, batch, ptr
    assert "graphs/s" in run.figures["verdict"]
    ids = {f.id for f in result.report.findings}
    assert "batch-size-not-measured" not in ids
