"""Syncs inside PyTorch Geometric: placed at the user's line, with PyG's own remedy as the fix.

The model is the graph-classification job PyG's docs show (two ``GCNConv``, ``global_mean_pool``,
PyG's ``DataLoader``); on a GPU each of its steps syncs three times inside ``torch_geometric``
(``add_remaining_self_loops`` in each ``GCNConv``'s normalisation masks the edges;
``global_mean_pool`` counts the graphs with ``int(batch.max()) + 1``). The same model written
with the remedies the fixes name syncs nowhere in PyG.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from pytorch_lightning import LightningModule, Trainer

from lightning_speedpack.sync_points.attribution import library_fix
from lightning_speedpack.sync_points.callback import SyncPointWarnings
from lightning_speedpack.sync_points.detect import SyncDetector
from tests.helpers import global_state
from tests.helpers.models import quiet_trainer_kwargs

pyg = pytest.importorskip("torch_geometric")
from torch_geometric import transforms as T  # noqa: E402
from torch_geometric.data import Data  # noqa: E402
from torch_geometric.loader import DataLoader as GraphLoader  # noqa: E402
from torch_geometric.nn import GATConv, GCNConv, global_mean_pool  # noqa: E402
from torch_geometric.utils import add_remaining_self_loops, scatter, to_dense_batch  # noqa: E402

STEPS = 3
HERE = "tests/sync_points/test_pyg.py"
GCN_FIX = (
    "PyG's GCNConv adds self loops and normalises the graph in every forward "
    "(gcn_norm -> add_remaining_self_loops masks the edges: a data-dependent size). "
    "The same graph every step (transductive): GCNConv(..., cached=True). Batches of "
    "graphs: do it once per graph in the dataset's transform, "
    "transform=torch_geometric.transforms.GCNNorm() with GCNConv(..., normalize=False) "
    "given batch.edge_weight, or transform=torch_geometric.transforms."
    "AddRemainingSelfLoops() with GCNConv(..., add_self_loops=False)"
)
POOL_FIX = (
    "PyG's global_mean_pool counts the graphs with batch.max() + 1 when not told "
    "(scatter, int): pass the count, global_mean_pool(x, batch, size=batch.num_graphs) "
    "(or size= the number you know)"
)


def marked_lines(fn: Callable[..., Any]) -> dict[str, int]:
    """``{marker: line}`` for every ``# sync: <marker>`` comment in ``fn``'s source."""
    lines, start = inspect.getsourcelines(fn)
    return {
        line.split("# sync: ")[1].split()[0]: start + offset
        for offset, line in enumerate(lines)
        if "# sync: " in line
    }


def graphs(n: int = 48, transform: Any = None) -> list[Data]:
    """Small random graphs (10-29 nodes, 16 features, 3 classes), as PyG's examples build."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        nodes = int(torch.randint(10, 30, (1,), generator=g))
        x = torch.randn(nodes, 16, generator=g)
        edge_index = torch.randint(0, nodes, (2, nodes * 3), generator=g)
        data = Data(x=x, edge_index=edge_index, y=torch.tensor([i % 3]))
        out.append(transform(data) if transform is not None else data)
    return out


class GCN(LightningModule):
    """The graph classifier of PyG's docs, as users write it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = GCNConv(16, 32)
        self.conv2 = GCNConv(32, 32)
        self.head = torch.nn.Linear(32, 3)

    def forward(self, b: Any) -> torch.Tensor:
        h = self.conv1(b.x, b.edge_index).relu()  # sync: conv1
        h = self.conv2(h, b.edge_index).relu()  # sync: conv2
        return self.head(global_mean_pool(h, b.batch))  # sync: pool

    def training_step(self, b: Any, i: int) -> torch.Tensor:
        loss = torch.nn.functional.cross_entropy(self(b), b.y)
        self.log("train_loss", loss, batch_size=b.num_graphs)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)

    def train_dataloader(self) -> Any:
        return GraphLoader(graphs(), batch_size=16, shuffle=True)


class GCNRemedied(GCN):
    """The same model with the remedies the fixes name: the GCN normalisation (self loops
    included) done once per graph by ``GCNNorm`` and the pool told the number of graphs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = GCNConv(16, 32, normalize=False)
        self.conv2 = GCNConv(32, 32, normalize=False)

    def forward(self, b: Any) -> torch.Tensor:
        h = self.conv1(b.x, b.edge_index, b.edge_weight).relu()
        h = self.conv2(h, b.edge_index, b.edge_weight).relu()
        return self.head(global_mean_pool(h, b.batch, size=b.num_graphs))

    def train_dataloader(self) -> Any:
        return GraphLoader(graphs(transform=T.GCNNorm()), batch_size=16, shuffle=True)


class GCNSelfLoopsInTheData(GCN):
    """The other remedy: the self loops added once per graph, GCNConv told not to add them."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = GCNConv(16, 32, add_self_loops=False)
        self.conv2 = GCNConv(32, 32, add_self_loops=False)

    def forward(self, b: Any) -> torch.Tensor:
        h = self.conv1(b.x, b.edge_index).relu()
        h = self.conv2(h, b.edge_index).relu()
        return self.head(global_mean_pool(h, b.batch, size=b.num_graphs))

    def train_dataloader(self) -> Any:
        transform = T.AddRemainingSelfLoops()
        return GraphLoader(graphs(transform=transform), batch_size=16, shuffle=True)


def fit(model: LightningModule, tmp_path: Path) -> SyncPointWarnings:
    cb = SyncPointWarnings(mode="summary", include_cpu=True)
    trainer = Trainer(callbacks=[cb], **quiet_trainer_kwargs(tmp_path, max_steps=STEPS))
    trainer.fit(model)
    return cb


@pytest.fixture
def clean_state() -> Iterator[None]:
    before = global_state.snapshot()
    yield
    assert global_state.diff(before, global_state.snapshot()) == {}


def test_syncs_inside_pyg_get_pygs_own_remedy_at_the_users_line(
    tmp_path: Path, clean_state: None
) -> None:
    cb = fit(GCN(), tmp_path)
    lines = marked_lines(GCN.forward)
    found = {
        f.location: (f.figures["kind"], f.figures["library_location"].split(":")[0], f.fix)
        for f in cb.doctor_findings()
        if f.figures.get("library") == "torch_geometric"
    }
    assert found == {
        f"{HERE}:{lines['conv1']}": ("masked index", "torch_geometric/utils/loop.py", GCN_FIX),
        f"{HERE}:{lines['conv2']}": ("masked index", "torch_geometric/utils/loop.py", GCN_FIX),
        f"{HERE}:{lines['pool']}": ("int", "torch_geometric/utils/_scatter.py", POOL_FIX),
    }
    calls = {f.lineno: f.library_calls for f in cb.user_findings}
    assert calls == {
        lines["conv1"]: ("GCNConv.forward", "gcn_norm", "add_remaining_self_loops"),
        lines["conv2"]: ("GCNConv.forward", "gcn_norm", "add_remaining_self_loops"),
        lines["pool"]: ("global_mean_pool", "scatter"),
    }
    for finding in cb.doctor_findings():
        if finding.figures.get("library") == "torch_geometric":
            assert finding.severity == "warning"
            assert " inside torch_geometric (torch_geometric/utils/" in finding.message


@pytest.mark.parametrize("model", [GCNRemedied, GCNSelfLoopsInTheData], ids=lambda m: m.__name__)
def test_the_named_remedies_remove_every_sync_inside_pyg(
    model: type[LightningModule], tmp_path: Path
) -> None:
    cb = fit(model(), tmp_path)
    assert [(f.location, f.kind) for f in cb.user_findings] == []


def test_the_remedies_compute_what_the_model_computed() -> None:
    """The fixes move the work into the data, they do not change the result."""
    torch.manual_seed(0)
    plain = GCN()
    theirs = next(iter(GraphLoader(graphs(), batch_size=48)))
    for remedied, transform in (
        (GCNRemedied(), T.GCNNorm()),
        (GCNSelfLoopsInTheData(), T.AddRemainingSelfLoops()),
    ):
        remedied.load_state_dict(plain.state_dict())
        ours = next(iter(GraphLoader(graphs(transform=transform), batch_size=48)))
        torch.testing.assert_close(remedied(ours), plain(theirs))


def _watch(fn: Callable[[], Any]) -> SyncDetector:
    det = SyncDetector(include_cpu=True)
    det.install()
    try:
        det.arm(step=0)
        fn()
    finally:
        det.uninstall()
    return det


def test_other_pyg_calls_get_the_matching_remedy(clean_state: None) -> None:
    """The remedy follows the PyG functions the sync happened in, on real PyG frames."""
    data = graphs(2)
    x, edge_index = data[0].x, data[0].edge_index
    batch = torch.tensor([0] * 5 + [1] * (x.size(0) - 5))
    gat = GATConv(16, 8)

    def calls() -> None:
        gat(x, edge_index)  # sync: gat
        add_remaining_self_loops(edge_index)  # sync: loops
        scatter(x, batch, reduce="sum")  # sync: scatter
        to_dense_batch(x, batch)  # sync: dense

    det = _watch(calls)
    lines = marked_lines(calls)
    fixes = {
        f.lineno: library_fix(f.library, f.kind, f.library_location, f.library_calls)
        for f in det.findings()
        if f.library == "torch_geometric"
    }
    assert set(fixes) == set(lines.values())
    assert fixes[lines["gat"]].startswith("PyG's GATConv handles self loops in every forward (")
    assert "build GATConv(..., add_self_loops=False)" in fixes[lines["gat"]]
    assert fixes[lines["loops"]] == (
        "PyG's add_remaining_self_loops masks the edges in every call (a data-dependent size): "
        "do it once per graph in the dataset's transform "
        "(transform=torch_geometric.transforms.AddRemainingSelfLoops()) instead of in the step"
    )
    assert fixes[lines["scatter"]] == (
        "PyG's scatter sizes its output with index.max() + 1 when not told (int): "
        "pass dim_size= the count you know (batch.num_graphs, x.size(0))"
    )
    assert fixes[lines["dense"]].startswith("PyG syncs inside to_dense_batch (")
    assert (
        "pass the sizes you know explicitly (num_nodes=, dim_size=, size="
        in (fixes[lines["dense"]])
    )


def test_library_fix_without_the_calls_decides_by_the_file() -> None:
    """An older record (no calls): the file the sync happened in still picks the remedy."""
    loops = library_fix("torch_geometric", "masked index", "torch_geometric/utils/loop.py:650")
    assert loops.startswith("PyG syncs inside this call (masked index)")
    pool = library_fix("torch_geometric", "int", "torch_geometric/utils/_scatter.py:48")
    assert pool.startswith("PyG's scatter sizes its output with index.max() + 1")
    assert library_fix("torchmetrics", "item").startswith("a torchmetrics metric called as")
    assert library_fix("somelib", "item") == (
        "somelib syncs inside this call (item); call it less often than every step"
    )
