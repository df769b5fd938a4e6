"""One planted 2-rank DDP run for ``benchmarks/world_zoo.py``: run it under ``speedpack doctor``.

``--case`` picks the run; each is a plain Lightning script (an MLP of about 1 ms a step on
in-memory random data, gloo on the CPU, one torch thread a rank, batch 8, SGD, 2 epochs of 32
batches a rank: 512 samples dealt out by Lightning's ``DistributedSampler``), with no progress
bar, logger or checkpoint, one cause of a slow or uneven world planted as a user would write it,
and nothing of the pack's. ``Trainer(accelerator="cpu", devices=2, strategy="ddp")`` unless said.

- ``clean``: nothing planted.
- ``clean-sync-epoch``: ``self.log(..., sync_dist=True, on_step=False, on_epoch=True)`` of 6
  values in every step: reduced once an epoch, not a finding.
- ``slow-data``: rank 1's dataset sleeps 4 ms a sample (``num_workers=0``).
- ``slow-step``: rank 1's ``training_step`` sleeps 30 ms.
- ``find-unused``: ``strategy="ddp_find_unused_parameters_true"``, every parameter used.
- ``sync-dist-step``: ``self.log(..., sync_dist=True)`` of 6 values every step (on_step).
- ``moving-data``: 8 ms a sample on the samples that Lightning's ``DistributedSampler``
  (shuffle, seed 0) deals to rank 0 in epoch 0 and to rank 1 in epoch 1 (a quarter of the
  data): rank 0 is slow in epoch 0, rank 1 in epoch 1.
- ``big-batch``: rank 1's loader has batch 16, rank 0's batch 8 (1024 samples, so each rank's
  shard has 512; ``limit_train_batches=32`` keeps the ranks in step, as DDP needs).
- ``uneven-batches``: ``use_distributed_sampler=False`` and a sampler of the user's own that
  gives rank 0 256 samples and rank 1 320 an epoch (32 and 40 batches of 8); ``max_steps=64``
  ends the fit on both ranks after the same number of steps (DDP needs as many steps on every
  rank), so rank 0 starts its second epoch while rank 1 is still in its first.
- ``comm-bound``: an embedding table in front of the MLP (524,288 rows of 64: 33.6M
  parameters, 128 MiB of dense gradients; 16 ids a sample, drawn from the features), for 16
  steps. Its gradient costs a fill and a scatter, computed last in the backward, so its
  all-reduce (a bucket of its own) starts when the little compute is over: on both ranks alike,
  gloo's all-reduce over loopback is most of the step.
- ``two-nodes``: for ``torchrun --nnodes 2 --nproc-per-node 1`` (``devices=1, num_nodes=2``):
  the rank on node 1 sleeps 4 ms a sample in its dataset.
- ``busy-host-moving``: as ``busy-host``, but the spinning processes move to rank 0's core in
  odd epochs (back to rank 1's in even ones): the slowest rank changes with the host's load,
  not with the data.
- ``busy-host``: another job shares rank 1's core: for the training loop each rank (all its
  threads) is pinned to a core of its own, and 6 processes that spin (not the job's: they stand
  for a neighbour on the host) share rank 1's. Its code is no slower; it gets a seventh of its
  core.
- ``stalls``: rank 1's ``training_step`` sleeps 150 ms in batches 8 and 24 of each epoch (work
  it does now and then that rank 0 does not) and keeps pace in the others.
- ``stalls-callback``: a callback of the user's that plots on rank 0 only
  (``@rank_zero_only``), every 16 batches from batch 8: 150 ms in its ``on_train_batch_end``.
- ``slow-callback``: that callback on rank 0 in every batch, 30 ms: after the all-reduce, so
  rank 1 waits for it in Lightning's broadcast at the start of its next batch.
- ``same-stream``: the data as an ``IterableDataset`` that yields every sample on every rank
  (not sharded by rank, which Lightning does not do for a stream): both ranks train on the same
  512 samples an epoch, in the same order, 64 batches each.

``--wall-out PATH`` (rank 0 only) writes the wall seconds of ``trainer.fit`` (``perf_counter``
around the call; with Lightning's launcher it includes starting rank 1) and of the training loop
alone (the module's ``on_train_start`` to ``on_train_end``), and the loop's CPU seconds (every
thread of rank 0's process), to PATH as JSON.

``--device cuda`` (``benchmarks/gpu/check_world.py``) trains on the GPU, one device a process
(``devices=1``): one rank alone gets NCCL (``strategy="ddp"``); with ``--nodes 2`` (two ``torchrun``
agents on one host, both ranks on ``cuda:0``) the backend is gloo, since NCCL refuses two ranks of
one communicator on the same GPU. ``--nodes 2`` runs any case as two nodes of one rank each.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from pytorch_lightning import Callback, LightningModule, Trainer
from pytorch_lightning.utilities import rank_zero_only
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

DIM = 64
WIDTH = 256
CLASSES = 10
SAMPLES = 512
BATCH = 8
#: ``WORLD_JOB_EPOCHS`` lengthens the job: the doctor's cost is measured on a longer fit (2 epochs
#: are a 0.4 s loop inside a fit of several seconds, mostly rank 1's start).
EPOCHS = int(os.environ.get("WORLD_JOB_EPOCHS", "2"))

CASES = (
    "clean",
    "clean-sync-epoch",
    "slow-data",
    "slow-step",
    "find-unused",
    "sync-dist-step",
    "moving-data",
    "big-batch",
    "uneven-batches",
    "two-nodes",
    "comm-bound",
    "busy-host",
    "busy-host-moving",
    "stalls",
    "stalls-callback",
    "slow-callback",
    "same-stream",
)
#: ``stalls``: rank 1's step sleeps this long in these batches of each epoch (rank-local work
#: now and then: a plot written, a file flushed), and is as fast as rank 0 in the others.
STALL_S = 0.15
STALL_BATCHES = (8, 24)
#: ``slow-callback``: rank 0's callback sleeps this long at every batch's end.
SLOW_HOOK_S = 0.03
#: ``busy-host``: spinning processes sharing rank 1's core (it gets about a seventh of it).
RIVALS = 6
#: ``comm-bound``: its embedding table's rows, ids per sample and steps (a fit of about 10 s).
VOCAB = 1 << 19
IDS = 16
WIDE_STEPS = 16


def global_rank() -> int:
    """This process's rank in the world (the process group's once it exists)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))


def moving_ids(n: int, seed: int = 0) -> set[int]:
    """The samples a 2-rank ``DistributedSampler`` gives rank 0 in epoch 0 and rank 1 in epoch 1.

    It shuffles with ``randperm`` seeded ``seed + epoch`` (``shuffle=True``, Lightning's seed 0)
    and deals the permutation out ``rank::2``.
    """
    where = []
    for epoch in (0, 1):
        g = torch.Generator().manual_seed(seed + epoch)
        perm = torch.randperm(n, generator=g).tolist()
        where.append({index: position % 2 for position, index in enumerate(perm)})
    return {i for i in range(n) if where[0][i] == 0 and where[1][i] == 1}


class Synthetic(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """``n`` random samples in memory; a slow read on ``slow_rank`` or of the ``slow_ids``."""

    def __init__(
        self,
        n: int,
        sleep: float = 0.0,
        slow_rank: int | None = None,
        slow_ids: set[int] | None = None,
    ) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, DIM, generator=g)
        self.y = torch.randint(0, CLASSES, (n,), generator=g)
        self.sleep, self.slow_rank, self.slow_ids = sleep, slow_rank, slow_ids

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.sleep:
            if self.slow_ids is not None:
                slow = index in self.slow_ids
            else:
                slow = self.slow_rank is None or global_rank() == self.slow_rank
            if slow:
                time.sleep(self.sleep)
        return self.x[index], self.y[index]


class Stream(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """``Synthetic``'s samples as a stream, in order, on every rank alike (not sharded)."""

    def __init__(self, n: int) -> None:
        self.data = Synthetic(n)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return (self.data[i] for i in range(len(self.data)))


class RankZeroPlots(Callback):
    """A plot drawn and saved on rank 0 alone: ``seconds`` in ``batches`` (None: every batch)."""

    def __init__(self, seconds: float, batches: tuple[int, ...] | None = None) -> None:
        self.seconds, self.batches = seconds, batches

    @rank_zero_only
    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        if self.batches is None or args[-1] in self.batches:  # batch_idx
            time.sleep(self.seconds)


class UnevenSampler(Sampler[int]):
    """A user's own sharding: rank 0 gets ``sizes[0]`` samples an epoch, rank 1 ``sizes[1]``."""

    def __init__(self, sizes: tuple[int, int]) -> None:
        self.sizes = sizes

    def __len__(self) -> int:
        return self.sizes[global_rank()]

    def __iter__(self) -> Iterator[int]:
        rank = global_rank()
        start = sum(self.sizes[:rank])
        return iter(range(start, start + self.sizes[rank]))


def _spin(stop: Any) -> None:
    while not stop.is_set():
        sum(range(10_000))


class Neighbours:
    """``busy-host``: each rank on a core of its own, rank 1's shared with spinning neighbours.

    On rank 1, :data:`RIVALS` spinning processes start on its core (forked after the pinning).
    :meth:`move_to` puts them on another rank's core; :meth:`stop` ends them and unpins.
    """

    def __init__(self, rank: int) -> None:
        self.cores = sorted(os.sched_getaffinity(0))
        self.before = set(self.cores)
        _pin_process({self.cores[rank % len(self.cores)]})  # gloo's threads too
        context = multiprocessing.get_context("fork")
        self.stopping = context.Event()
        count = RIVALS if rank == 1 else 0
        self.rivals = [
            context.Process(target=_spin, args=(self.stopping,), daemon=True) for _ in range(count)
        ]
        for rival in self.rivals:
            rival.start()

    def move_to(self, rank: int) -> None:
        """Every neighbour onto ``rank``'s core."""
        for rival in self.rivals:
            if rival.pid is None:  # never started: 0 would be this process
                continue
            with contextlib.suppress(OSError):  # one that ended meanwhile
                os.sched_setaffinity(rival.pid, {self.cores[rank % len(self.cores)]})

    def stop(self) -> None:
        """End the neighbours and unpin this process's threads."""
        self.stopping.set()
        for rival in self.rivals:
            rival.join(5)
        _pin_process(self.before)


def _pin_process(cores: set[int]) -> None:
    """Every thread of this process (gloo's too) on ``cores``."""
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(task), cores)


class MLP(LightningModule):
    def __init__(self, case: str) -> None:
        super().__init__()
        self.case = case
        self.embed = nn.Embedding(VOCAB, DIM) if case == "comm-bound" else None
        self.net = nn.Sequential(
            nn.Linear(DIM, WIDTH),
            nn.ReLU(),
            nn.Linear(WIDTH, WIDTH),
            nn.ReLU(),
            nn.Linear(WIDTH, CLASSES),
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        if self.embed is not None:  # ids from the features: a lookup of IDS rows per sample
            ids = (x[:, :IDS].abs() * 1e5).long() % VOCAB
            x = self.embed(ids).mean(1)
        logits = self.net(x)
        loss = nn.functional.cross_entropy(logits, y)
        if self.case == "slow-step" and self.global_rank == 1:
            time.sleep(0.03)  # work done on one rank only
        if self.case == "stalls" and self.global_rank == 1 and batch_idx in STALL_BATCHES:
            time.sleep(STALL_S)  # now and then, on one rank only
        if self.case in ("sync-dist-step", "clean-sync-epoch"):
            per_epoch = self.case == "clean-sync-epoch"
            with torch.no_grad():
                values = {
                    "loss": loss,
                    "acc": (logits.argmax(1) == y).float().mean(),
                    "logit_mean": logits.mean(),
                    "logit_std": logits.std(),
                    "x_norm": x.norm(dim=1).mean(),
                    "margin": (logits.max(1).values - logits.mean(1)).mean(),
                }
            for name, value in values.items():
                self.log(
                    f"train/{name}",
                    value,
                    sync_dist=True,
                    on_step=not per_epoch,
                    on_epoch=per_epoch,
                )
        return loss

    def on_train_start(self) -> None:
        busy = self.case in ("busy-host", "busy-host-moving")
        self.neighbour = Neighbours(self.global_rank) if busy else None
        self.train_started = time.perf_counter()
        self.train_cpu_started = time.process_time()

    def on_train_epoch_start(self) -> None:
        # busy-host-moving: the neighbours share rank 1's core in even epochs, rank 0's in odd.
        if self.case == "busy-host-moving" and self.neighbour is not None:
            self.neighbour.move_to(1 - self.current_epoch % 2)

    def on_train_end(self) -> None:
        self.train_s = time.perf_counter() - self.train_started
        # The loop's CPU time, every thread of this rank's process (gloo's too): unlike its
        # wall time it leaves out the time spent waiting for a CPU on a busy machine.
        self.train_cpu_s = time.process_time() - self.train_cpu_started
        if self.neighbour is not None:
            self.neighbour.stop()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader[Any]:
        case = self.case
        if case in ("slow-data", "two-nodes"):
            return DataLoader(
                Synthetic(SAMPLES, 0.004, slow_rank=1), batch_size=BATCH, shuffle=True
            )
        if case == "moving-data":
            data = Synthetic(SAMPLES, 0.008, slow_ids=moving_ids(SAMPLES))
            return DataLoader(data, batch_size=BATCH, shuffle=True)
        if case == "big-batch":
            batch = 16 if self.global_rank == 1 else BATCH
            return DataLoader(Synthetic(2 * SAMPLES), batch_size=batch, shuffle=True)
        if case == "uneven-batches":
            sizes = (SAMPLES // 2, SAMPLES // 2 + 8 * BATCH)
            data = Synthetic(sum(sizes))
            return DataLoader(data, batch_size=BATCH, sampler=UnevenSampler(sizes))
        if case == "same-stream":
            return DataLoader(Stream(SAMPLES), batch_size=BATCH)
        return DataLoader(Synthetic(SAMPLES), batch_size=BATCH, shuffle=True)


def trainer_kwargs(
    case: str, root: Path, device: str = "cpu", nodes: int | None = None
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 2,
        "strategy": "ddp",
        "max_epochs": EPOCHS,
        "default_root_dir": str(root),
        "logger": False,
        "enable_progress_bar": False,
        "enable_checkpointing": False,
        "enable_model_summary": False,
    }
    if case == "find-unused":
        kwargs["strategy"] = "ddp_find_unused_parameters_true"
    elif case == "big-batch":
        kwargs["limit_train_batches"] = SAMPLES // (2 * BATCH)
    elif case == "uneven-batches":
        kwargs.update(use_distributed_sampler=False, max_steps=EPOCHS * SAMPLES // (2 * BATCH))
        kwargs["max_epochs"] = EPOCHS + 1
    elif case == "two-nodes":
        kwargs.update(devices=1, num_nodes=2)
    elif case == "comm-bound":
        kwargs.update(max_steps=WIDE_STEPS)
    elif case == "stalls-callback":
        kwargs["callbacks"] = [RankZeroPlots(STALL_S, STALL_BATCHES)]
    elif case == "slow-callback":
        kwargs["callbacks"] = [RankZeroPlots(SLOW_HOOK_S)]
    if nodes is not None:
        kwargs.update(devices=1, num_nodes=nodes)
    if device == "cuda":
        kwargs.update(accelerator="gpu", devices=1)
        if kwargs.get("num_nodes", 1) > 1:  # two ranks on cuda:0: NCCL would refuse them
            from pytorch_lightning.strategies import DDPStrategy

            unused = case == "find-unused"
            kwargs["strategy"] = DDPStrategy(
                process_group_backend="gloo", find_unused_parameters=unused
            )
    return kwargs


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--case", required=True, choices=CASES)
    parser.add_argument("--wall-out", type=Path, help="(rank 0) write trainer.fit's seconds here")
    parser.add_argument("--root", type=Path, help="the Trainer's default_root_dir")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--nodes", type=int, help="run as this many nodes of one rank each")
    args = parser.parse_args()
    torch.set_num_threads(1)  # 2 ranks on 2 cores
    root = args.root or Path(tempfile.mkdtemp(prefix="world-job-"))
    trainer = Trainer(**trainer_kwargs(args.case, root, args.device, args.nodes))
    model = MLP(args.case)
    start = time.perf_counter()
    trainer.fit(model)
    wall = time.perf_counter() - start
    if trainer.is_global_zero:
        if args.wall_out is not None:
            args.wall_out.write_text(
                json.dumps(
                    {
                        "fit_s": wall,
                        "train_s": model.train_s,
                        "train_cpu_s": model.train_cpu_s,
                        "steps": trainer.global_step,
                        # perf_counter at the loop's start: to place other clocks' events in it
                        "train_started": model.train_started,
                    }
                )
            )
        print(f"world_job {args.case}: fit {wall:.2f} s, {trainer.global_step} steps")


if __name__ == "__main__":
    main()
