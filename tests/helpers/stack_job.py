"""A small training job that records which samples its training steps received, per epoch.

``tests/test_invisible.py`` runs it twice -- ``python stack_job.py ...`` and under the pack
(``speedpack doctor [--deep] stack_job.py ...``, or with ``--callbacks profiler``) -- and
compares the two runs. It is a plain user script: it imports nothing from the tests, and it
reads the data that ``tests/helpers/stacks.py`` built (``--data DIR``)::

    python stack_job.py --stack tensor --data DIR --workers 2 --persistent --out ids.json

It trains a ``Linear(8, 1)`` for ``--epochs`` epochs on one of the stacks (see
``stacks.STACKS``; the ``pyg`` stack trains the graph classifier of PyTorch Geometric's docs,
two ``GCNConv`` and ``global_mean_pool``, on one small graph per sample, its id a graph-level
attribute), writes ``{"epochs": [[ids of epoch 0...], ...], ...}`` to ``--out``, and
prints its own results on lines that start with ``JOB:`` (the doctor's report, printed at the
end, is not part of the job's output). Only the real training steps count: the Lightning loop
calls ``on_train_batch_start`` before each of them, which a ``training_step`` called by anything
else (a probe timing the model) does not get; such calls are counted apart.

With ``--devices 2`` it trains with ``strategy="ddp"`` on two CPU processes (gloo; Lightning
relaunches the script for rank 1). A stream splits itself across ranks and workers; a map-style
loader gets Lightning's ``DistributedSampler``. Each rank records its own steps' ids and writes
them to ``ids.rank<r>.json`` beside ``--out``; at the end of the fit they are gathered, and rank
0 alone writes ``--out`` -- ``"epochs"`` holds each epoch's ids of rank 0 followed by those of
rank 1, ``"ranks"`` each rank's own ``epochs`` -- and prints the ``JOB:`` lines (their counts
are over all ranks).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset, get_worker_info

BATCH_SIZE = 16


def rank_and_world() -> tuple[int, int] | None:
    """``(rank, world size)`` of the initialised default process group, else ``None``."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return None


class Shards(IterableDataset):
    """Stands in for a WebDataset: each (rank, worker) reads its own ids, in the same order each
    pass -- process ``rank * workers + worker`` of ``world * workers``, as a stream that splits
    itself by node and by worker does."""

    def __init__(self, ids: torch.Tensor, x: torch.Tensor) -> None:
        self.ids, self.x = ids, x
        self._topology: tuple[int, int] | None = None  # the rank's, for a spawned worker

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_topology"] = rank_and_world() or self._topology
        return state

    def __iter__(self):  # type: ignore[no-untyped-def]
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        rank, world = rank_and_world() or self._topology or (0, 1)
        me, shards = rank * workers + worker, world * workers
        for i in range(me, len(self.ids), shards):
            yield self.ids[i], self.x[i]


def to_tensors(sample: tuple[int, np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """A decoded WebDataset sample (``.cls``, ``.npy``) as tensors."""
    key, x = sample
    return torch.tensor(key, dtype=torch.int64), torch.from_numpy(np.array(x, dtype=np.float32))


def arrays(data: Path) -> tuple[torch.Tensor, torch.Tensor]:
    found = np.load(data / "samples.npz")
    return torch.from_numpy(found["ids"]), torch.from_numpy(found["x"])


def graphs(ids: torch.Tensor, x: torch.Tensor) -> list[Any]:
    """One small graph per sample, as PyG's examples build theirs: ``4 + i % 5`` nodes in a ring
    (both directions) with a self loop on node 0, node features ``x[i]`` shifted per node, class
    ``i % 3``; the sample's id is a graph-level attribute (``batch.id``: one per graph)."""
    from torch_geometric.data import Data

    out = []
    for sample_id, features in zip(ids, x, strict=True):
        i = int(sample_id)
        n = 4 + i % 5
        ring = torch.arange(n)
        loop = torch.zeros(1, dtype=torch.int64)
        edges = torch.stack(
            [torch.cat([ring, (ring + 1) % n, loop]), torch.cat([(ring + 1) % n, ring, loop])]
        )
        nodes = features.repeat(n, 1) + 0.1 * ring[:, None].float()
        out.append(Data(x=nodes, edge_index=edges, y=torch.tensor([i % 3]), id=sample_id.view(1)))
    return out


class SlowDecode(TensorDataset):
    """A ``TensorDataset`` whose items take 4 ms each to "decode": the loader, not the model,
    sets the pace (a job planted data-bound)."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        time.sleep(0.004)
        return super().__getitem__(index)


def nodes_loader(data: Path, workers: int) -> Any:
    """A ``torchdata.nodes`` pipeline as its docs build one: a shuffled sampler, the dataset's
    items mapped in ``workers`` threads (in order; 0: in line), batched (the last one partial),
    collated and prefetched, in a ``Loader``."""
    from torch.utils.data import RandomSampler, default_collate
    from torchdata.nodes import Batcher, Loader, Mapper, ParallelMapper, Prefetcher, SamplerWrapper

    dataset = SlowDecode(*arrays(data))
    node: Any = SamplerWrapper(RandomSampler(dataset))
    node = ParallelMapper(node, map_fn=dataset.__getitem__, num_workers=workers, method="thread")
    node = Batcher(node, batch_size=BATCH_SIZE, drop_last=False)
    node = Mapper(node, default_collate)
    node = Prefetcher(node, prefetch_factor=2)
    return Loader(node)


def webdataset_stream(data: Path) -> Any:
    import webdataset as wds

    urls = sorted(str(p) for p in data.glob("shard-*.tar"))
    # Unshuffled shards, split by node (a no-op on one process; under DDP, rank r of n reads
    # shards r, r + n, ...) and then by DataLoader worker (WebDataset's default): each epoch
    # reads every sample once across the ranks.
    pipeline = wds.WebDataset(urls, shardshuffle=False, nodesplitter=wds.split_by_node)
    return pipeline.decode().to_tuple("cls", "npy").map(to_tensors)


def make_loader(args: argparse.Namespace) -> Any:
    """The training DataLoader of ``args.stack`` over the data in ``args.data``."""
    data = Path(args.data)
    stack = args.stack
    loader_kwargs: dict[str, Any] = {"batch_size": BATCH_SIZE, "num_workers": args.workers}
    if args.workers:
        loader_kwargs["persistent_workers"] = args.persistent
        if args.spawn:
            loader_kwargs["multiprocessing_context"] = "spawn"
    if stack in ("cached_map", "stream_cached", "wds_cached", "hf_cached"):
        from lightning_speedpack import CachedDataset
    if stack == "tensor":
        return DataLoader(TensorDataset(*arrays(data)), shuffle=True, **loader_kwargs)
    if stack == "cached_map":
        cached = CachedDataset(TensorDataset(*arrays(data)))
        return DataLoader(cached, shuffle=True, **loader_kwargs)
    if stack == "stream":
        return DataLoader(Shards(*arrays(data)), **loader_kwargs)
    if stack == "stream_cached":
        stream = CachedDataset(Shards(*arrays(data)), shuffle=True, seed=0)
        return DataLoader(stream, **loader_kwargs)
    if stack == "wds":
        return DataLoader(webdataset_stream(data), **loader_kwargs)
    if stack == "wds_cached":
        return DataLoader(CachedDataset(webdataset_stream(data)), **loader_kwargs)
    if stack in ("hf", "hf_cached"):
        import datasets

        table = datasets.load_from_disk(str(data / "hf")).with_format("torch")
        dataset = table if stack == "hf" else CachedDataset(table)
        return DataLoader(dataset, shuffle=True, **loader_kwargs)
    if stack == "litdata":
        import litdata

        return litdata.StreamingDataLoader(
            litdata.StreamingDataset(str(data / "litdata")), **loader_kwargs
        )
    if stack == "mosaic":
        import streaming

        dataset = streaming.StreamingDataset(
            local=str(data / "mds"), batch_size=BATCH_SIZE, shuffle=False
        )
        return DataLoader(dataset, **loader_kwargs)
    if stack == "pyg":
        from torch_geometric.loader import DataLoader as GraphLoader

        return GraphLoader(graphs(*arrays(data)), shuffle=True, **loader_kwargs)
    if stack == "nodes":
        return nodes_loader(data, args.workers)
    raise SystemExit(f"unknown --stack {stack!r}")


def ids_and_x(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The sample ids and the features of a batch of any stack (a dict, an (ids, x) pair, or a
    PyG ``Batch``: its graphs' ids and node features)."""
    if hasattr(batch, "num_graphs"):
        return batch.id, batch.x
    if isinstance(batch, dict):
        return batch["id"], batch["x"]
    return batch[0], batch[1]


def graph_classifier() -> torch.nn.Module:
    """The model of PyG's graph-classification examples: two ``GCNConv``, ``global_mean_pool``
    and a linear head over 3 classes."""
    from torch_geometric.nn import GCNConv, global_mean_pool

    class GNN(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = GCNConv(8, 16)
            self.conv2 = GCNConv(16, 16)
            self.head = torch.nn.Linear(16, 3)

        def forward(self, b: Any) -> torch.Tensor:
            h = self.conv1(b.x, b.edge_index).relu()
            h = self.conv2(h, b.edge_index).relu()
            return self.head(global_mean_pool(h, b.batch))

    return GNN()


def make_module(pl: Any, stack: str = "") -> Any:
    class Job(pl.LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.layer = graph_classifier() if stack == "pyg" else torch.nn.Linear(8, 1)
            self.epochs: list[list[int]] = []
            self.other_training_step_calls = 0
            self._real_step = False
            # every rank's ``epochs`` and other calls: set at the end of the fit
            self.ranks: list[list[list[int]]] = [self.epochs]
            self.other_calls_per_rank: list[int] | None = None

        def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
            self._real_step = True  # the Lightning loop is about to run a real training step

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            ids, x = ids_and_x(batch)
            if self._real_step:
                while len(self.epochs) <= self.current_epoch:
                    self.epochs.append([])
                self.epochs[self.current_epoch].extend(int(i) for i in ids.reshape(-1).tolist())
            else:
                self.other_training_step_calls += 1
            self._real_step = False
            if stack == "pyg":
                loss = torch.nn.functional.cross_entropy(self.layer(batch), batch.y)
                self.log("train_loss", loss, batch_size=batch.num_graphs)
                return loss
            return self.layer(x.float()).pow(2).mean()

        def on_train_end(self) -> None:
            # every rank's ids, on every rank (the process group is up until the fit ends)
            self.ranks = [self.epochs]
            self.other_calls_per_rank = [self.other_training_step_calls]
            if self.trainer.world_size > 1:
                gathered: list[Any] = [None] * self.trainer.world_size
                torch.distributed.all_gather_object(
                    gathered, (self.epochs, self.other_training_step_calls)
                )
                self.ranks = [epochs for epochs, _ in gathered]
                self.other_calls_per_rank = [calls for _, calls in gathered]

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Job()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--spawn", action="store_true", help='multiprocessing_context="spawn"')
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", default=None)
    parser.add_argument("--namespace", default="pytorch_lightning")
    parser.add_argument("--callbacks", default="", help="comma-separated: profiler")
    parser.add_argument("--devices", type=int, default=1, help='> 1: strategy="ddp" on CPUs')
    args = parser.parse_args()

    if args.namespace == "lightning":
        import lightning.pytorch as pl
    elif args.namespace == "pytorch_lightning":
        import pytorch_lightning as pl
    else:
        raise SystemExit(f"unknown --namespace {args.namespace!r}")

    pl.seed_everything(0, workers=True)
    loader = make_loader(args)
    model = make_module(pl, args.stack)
    callbacks = []
    for name in filter(None, args.callbacks.split(",")):
        if name == "profiler":
            from lightning_speedpack import DataPipelineProfiler

            callbacks.append(DataPipelineProfiler(probe="start", probe_batches=4, model_steps=2))
        else:
            raise SystemExit(f"unknown --callbacks entry {name!r}")
    distributed: dict[str, Any] = {}
    if args.devices > 1:
        distributed = {"devices": args.devices, "strategy": "ddp"}
    trainer = pl.Trainer(
        accelerator="cpu",
        **distributed,
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=callbacks,
    )
    trainer.fit(model, train_dataloaders=loader)

    if args.out and args.devices > 1:  # each rank's own record (a look after a failure)
        out = Path(args.out)
        mine = {
            "epochs": model.epochs,
            "other_training_step_calls": model.other_training_step_calls,
        }
        out.with_name(f"{out.stem}.rank{trainer.global_rank}.json").write_text(json.dumps(mine))
    if trainer.is_global_zero:
        weights = hashlib.sha256()
        for tensor in model.state_dict().values():
            weights.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        other_calls = model.other_calls_per_rank or [model.other_training_step_calls]
        n_epochs = max(len(epochs) for epochs in model.ranks)
        union = [
            [i for epochs in model.ranks for i in (epochs[e] if e < len(epochs) else [])]
            for e in range(n_epochs)
        ]
        if args.out:
            result: dict[str, Any] = {
                "epochs": union,
                "weights_sha256": weights.hexdigest(),
                "other_training_step_calls": sum(other_calls),
            }
            if args.devices > 1:
                result["ranks"] = model.ranks
                result["other_training_step_calls_per_rank"] = other_calls
            Path(args.out).write_text(json.dumps(result))
        counts = [len(epoch) for epoch in union]
        print(f"JOB: stack {args.stack} workers {args.workers} persistent {args.persistent}")
        if args.devices > 1:
            print(f"JOB: devices {args.devices} (ddp); samples per epoch over all ranks")
        print(f"JOB: epochs {len(union)}")
        print(f"JOB: samples per epoch {counts}")
        print(f"JOB: samples {sum(counts)}")
        print(f"JOB: global_step {trainer.global_step}")


if __name__ == "__main__":
    main()
