"""``strategy="ddp_speedpack"`` in both namespaces: each registry, each class, a real DDP fit."""

from __future__ import annotations

import csv
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import lightning_speedpack
from lightning_speedpack import ThroughputLogger
from lightning_speedpack.strategies.ddp import SpeedpackDDPMixin
from tests.helpers.ddp import run_ddp
from tests.helpers.models import quiet_trainer_kwargs
from tests.helpers.namespaces import NAMESPACE_NAMES, NAMESPACES, Namespace, each_namespace
from tests.helpers.procs import run_in_session

L = pytest.importorskip("lightning.pytorch")


@each_namespace
@pytest.mark.parametrize(
    ("name", "start_method"), [("ddp_speedpack", "popen"), ("ddp_speedpack_spawn", "spawn")]
)
def test_the_names_resolve_to_the_namespaces_own_class(
    ns: Namespace, name: str, start_method: str
) -> None:
    entry = dict.get(ns.StrategyRegistry, name)
    assert entry is not None, name
    assert entry["strategy"] is ns.strategy_class
    assert entry["init_params"] == {"start_method": start_method}
    trainer = ns.Trainer(strategy=name, accelerator="cpu", devices=2, logger=False)
    strategy = trainer.strategy
    assert type(strategy) is ns.strategy_class
    assert isinstance(strategy, ns.DDPStrategy)
    assert strategy._start_method == start_method
    assert strategy.ddp_kwargs == {"gradient_as_bucket_view": True, "find_unused_parameters": False}


def test_one_class_per_namespace_with_one_behaviour() -> None:
    classes = [ns.strategy_class for ns in NAMESPACES]
    assert lightning_speedpack.DDPSpeedpackStrategy is classes[0]  # pytorch_lightning's first
    assert len(set(classes)) == len(NAMESPACES)
    for ns, cls in zip(NAMESPACES, classes, strict=True):
        assert issubclass(cls, SpeedpackDDPMixin)
        for other in NAMESPACES:  # a Trainer accepts only its own namespace's strategies
            assert issubclass(cls, other.DDPStrategy) is (other is ns)


@pytest.mark.skipif(len(NAMESPACE_NAMES) < 2, reason="needs both Lightning namespaces")
@pytest.mark.parametrize(
    "order",
    [
        ["lightning_speedpack", "pytorch_lightning", "lightning.pytorch"],
        ["lightning.pytorch", "lightning_speedpack", "pytorch_lightning"],
        ["pytorch_lightning", "lightning.pytorch", "lightning_speedpack"],
        # a callback first: it looks the namespaces up (find_spec) before importing them
        ["lightning_speedpack.throughput", "pytorch_lightning", "lightning.pytorch"],
    ],
    ids=["pack-first", "L-first", "pack-last", "callback-first"],
)
@pytest.mark.slow
def test_the_names_work_whatever_the_import_order(order: list[str]) -> None:
    code = textwrap.dedent(
        f"""
        import importlib, sys
        for name in {order!r}:
            importlib.import_module(name)
        for ns in ("pytorch_lightning", "lightning.pytorch"):
            registry = importlib.import_module(ns + ".strategies").StrategyRegistry
            trainer = sys.modules[ns].Trainer(
                strategy="ddp_speedpack", accelerator="cpu", devices=2, logger=False
            )
            print(ns, type(trainer.strategy).__module__, "ddp_speedpack_spawn" in registry)
        """
    )
    proc = run_in_session([sys.executable, "-c", code], timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == [
        "pytorch_lightning lightning_speedpack.strategies.pytorch_lightning True",
        "lightning.pytorch lightning_speedpack.strategies.lightning True",
    ]


# --- a real 2-rank fit with the lightning.pytorch Trainer ---------------------------------------


class RankSizedModel(L.LightningModule):  # type: ignore[misc, name-defined]
    """Rank 0 trains on batches of 4, rank 1 on batches of 12."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> DataLoader[Any]:
        batch_size = 4 if self.trainer.global_rank == 0 else 12
        g = torch.Generator().manual_seed(self.trainer.global_rank)
        return DataLoader(list(torch.randn(8 * batch_size, 8, generator=g)), batch_size=batch_size)


def _fit_with_lightning(tmp: str) -> dict[str, Any]:
    import lightning as L_top
    from lightning.pytorch.loggers import CSVLogger

    torch.manual_seed(0)
    model = RankSizedModel()
    throughput = ThroughputLogger(window=2, log_every_n_steps=2, gpu_stats=False)
    trainer = L_top.Trainer(
        callbacks=[throughput],
        use_distributed_sampler=False,
        **quiet_trainer_kwargs(
            tmp,
            devices=2,
            strategy="ddp_speedpack",
            max_steps=4,
            log_every_n_steps=2,
            logger=CSVLogger(tmp, name="csv", version=0),
        ),
    )
    trainer.fit(model)
    rows: list[dict[str, str]] = []
    if trainer.global_rank == 0:
        with open(Path(tmp, "csv", "version_0", "metrics.csv")) as f:
            rows = list(csv.DictReader(f))
    return {
        "strategy": f"{type(trainer.strategy).__module__}.{type(trainer.strategy).__name__}",
        "trainer": type(trainer).__module__,
        "params": {k: v.numpy().copy() for k, v in model.state_dict().items()},
        "rows": rows,
        "samples_per_sec": throughput.doctor_figures()["samples_per_sec"],
    }


@pytest.mark.ddp
@pytest.mark.timeout(300)
def test_a_real_ddp_fit_with_the_lightning_trainer(tmp_path: Path) -> None:
    rank0, rank1 = run_ddp(_fit_with_lightning, str(tmp_path), timeout=240)
    for rank in (rank0, rank1):
        assert rank["strategy"] == "lightning_speedpack.strategies.lightning.DDPSpeedpackStrategy"
        assert rank["trainer"].startswith("lightning.pytorch")
    # DDP kept the replicas in sync although the ranks saw different data
    assert all(np.array_equal(rank0["params"][k], rank1["params"][k]) for k in rank0["params"])
    # ThroughputLogger summed over the ranks through the lightning.pytorch strategy and logged
    # on rank 0 only, through lightning.pytorch's CSVLogger
    logged = [(int(r["step"]), float(r["throughput/samples"])) for r in rank0["rows"]]
    assert logged == [(1, 2 * (4 + 12)), (3, 4 * (4 + 12))] or logged == [
        (2, 2 * (4 + 12)),
        (4, 4 * (4 + 12)),
    ]
    assert rank1["rows"] == []
    assert rank0["samples_per_sec"] == pytest.approx(rank1["samples_per_sec"])
