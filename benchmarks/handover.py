"""What handing a batch over from a DataLoader worker costs, by torch's sharing strategy.

A DataLoader worker puts each collated batch in shared memory; the training process receives
it inside ``next``. With torch's default strategy on Linux (``file_descriptor``) each tensor's
shared memory travels as a file descriptor, fetched through a connection to the worker that
made it; with ``file_system`` the training process opens it by name. This times the training
process's wait at ``next`` with the worker queue kept full (2 workers started for each measure,
samples read from memory, a fixed step of matrix products between batches), both strategies
alternated in one process, ``--rounds`` times, medians reported::

    python benchmarks/handover.py --rounds 5

It prints the median wait a batch for each strategy and batch shape, and the ratio
(``file_descriptor`` over ``file_system``). ``file_system`` keeps a batch's shared memory as a
file in ``/dev/shm`` until every process that holds it lets go, so torch's documentation warns
that it can leak when processes die unexpectedly.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.multiprocessing as tmp
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).parent))
from _common import print_table

STRATEGIES = ("file_descriptor", "file_system")
SKIP = 4  # the first batches of an epoch wait for the workers to start: not the handover


def wait_per_batch(strategy: str, batch: int, dim: int, batches: int, step: torch.Tensor) -> float:
    """Median milliseconds in ``next`` a batch, past the epoch's first :data:`SKIP` batches."""
    tmp.set_sharing_strategy(strategy)  # type: ignore[no-untyped-call]
    n = batch * (batches + SKIP)  # samples read from memory: nothing for a worker to compute
    data = TensorDataset(torch.randn(n, dim), torch.arange(n) % 10)
    loader = DataLoader(data, batch_size=batch, num_workers=2)
    waits = []
    it = iter(loader)
    for i in range(batches + SKIP):
        start = time.perf_counter()
        next(it)
        if i >= SKIP:
            waits.append(time.perf_counter() - start)
        for _ in range(3):  # a ~15 ms step: the workers refill the queue meanwhile
            step = torch.tanh(step @ step)
    del it
    return statistics.median(waits) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=48)
    parser.add_argument("--quick", action="store_true", help="24 batches a measure")
    args = parser.parse_args()
    if args.quick:
        args.batches = 24
    torch.set_num_threads(1)
    default = tmp.get_sharing_strategy()  # type: ignore[no-untyped-call]
    shapes = [(64, 256), (64, 1024), (256, 256)]
    step = torch.randn(512, 512) / 23
    ms: dict[tuple[str, int, int], list[float]] = {}
    try:
        for _ in range(args.rounds):
            for batch, dim in shapes:
                for strategy in STRATEGIES:
                    key = (strategy, batch, dim)
                    ms.setdefault(key, []).append(
                        wait_per_batch(strategy, batch, dim, args.batches, step)
                    )
    finally:
        tmp.set_sharing_strategy(default)  # type: ignore[no-untyped-call]
    rows = []
    for batch, dim in shapes:
        fd = statistics.median(ms[("file_descriptor", batch, dim)])
        fs = statistics.median(ms[("file_system", batch, dim)])
        rows.append([f"{batch} x {dim}", f"{fd:.2f}", f"{fs:.2f}", f"{fd / fs:.2f}x"])
    title = (
        f"Handover wait at `next`, ms a batch (2 workers, queue full; medians of {args.rounds} "
        f"alternating rounds of {args.batches} batches)"
    )
    print_table(title, ["batch", "file_descriptor", "file_system", "ratio"], rows)


if __name__ == "__main__":
    main()
