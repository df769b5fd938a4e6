"""How a cached batch is read for ``default_collate``: copied one sample at a time, or as views.

``CachedDataset`` hands torch's ``default_collate`` views into its arena, except in a DataLoader
worker for samples stored in fewer than 4 KiB, which it copies one at a time (issue 38: views
cost each forked worker ~0.5 MiB more copy-on-write memory, ``benchmarks/cache.py --only
tokens``). This measures what a sample's copy costs against its view, in one process, the two
alternated, medians of the rounds.

Run ``.venv/bin/python benchmarks/cache_reads.py [--quick] [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, default_collate

sys.path.insert(0, str(Path(__file__).parent))
from _common import alternate, print_table

from lightning_speedpack import CachedDataset

__all__ = ["read_costs"]


class _Filled(Dataset[torch.Tensor]):
    """``n`` samples of one shape and dtype, each filled with its index."""

    def __init__(self, n: int, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        self.n, self.shape, self.dtype = n, shape, dtype

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full(self.shape, i % 100, dtype=self.dtype)


def read_costs(repeats: int = 5, scale: float = 1.0) -> list[list[str]]:
    """Microseconds a sample of a cached batch read and stacked by ``default_collate``.

    Copied one at a time (``each``: a worker's path for samples under 4 KiB) or as views.
    """
    cases = [
        ((96,), torch.int64, 256, 20_000),
        ((3, 32, 32), torch.uint8, 256, 10_000),
        ((3, 224, 224), torch.uint8, 64, 640),
    ]
    rows = []
    for shape, dtype, batch, full in cases:
        n = int(full * scale)
        with CachedDataset(_Filled(n, shape, dtype), key=f"reads-{shape}-{os.getpid()}") as ds:
            ds.fill(processes=0)
            arena = ds._arena
            assert arena is not None
            order = random.Random(0).sample(range(n), n)
            batches = [order[k : k + batch] for k in range(0, n - batch + 1, batch)]

            def read(
                how: Any, arena: Any = arena, batches: list[list[int]] = batches, n: int = n
            ) -> float:
                start = time.perf_counter()
                for b in batches:
                    default_collate(arena.get_many(b, n, how=how))
                return (time.perf_counter() - start) / (len(batches) * len(batches[0])) * 1e6

            med = alternate(
                {how: functools.partial(read, how) for how in ("each", "views")}, repeats
            )
        nbytes = int(torch.empty(shape, dtype=dtype).nbytes)
        rows.append(
            [
                f"{'x'.join(map(str, shape))} {str(dtype)[6:]} ({nbytes:,} B), batch {batch}",
                f"{med['each']:.2f}",
                f"{med['views']:.2f}",
                f"{med['each'] / med['views']:.2f}",
            ]
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="alternating rounds (>= 5)")
    parser.add_argument("--quick", action="store_true", help="a quarter of the samples")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print_table(
        f"Reading a cached batch for default_collate, us a sample (medians of {args.repeats} "
        "alternating rounds, one process)",
        ["samples", "copied (each)", "views", "copied / views"],
        read_costs(args.repeats, 0.25 if args.quick else 1.0),
    )


if __name__ == "__main__":
    main()
