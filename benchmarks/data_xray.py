"""Cost of the data-pipeline X-ray: the profiler on the small CNN with 2 workers, a stage, a fetch.

The timed fetch: torch's fetcher of a batch of 8 rows of a ``TensorDataset`` (the DDP zoo's
clean job's loader, ``num_workers=0``) bare and through the X-ray's ``TimedFetcher`` with the
fetch's compute time read on every fetch (two schedstat reads) or sampled as the X-ray does
(``CPU_READ_EVERY``), microseconds a fetch, alternated in rounds of 2,000 fetches.

Run: ``.venv/bin/python benchmarks/data_xray.py [--quick] [--repeats N]``. Variants alternate in
one process; prints the ratio of the medians and the median of each round's ratio (the machine
is shared: only ratios count, and a round's two fits share its slow spells).
"""

from __future__ import annotations

import argparse
import statistics
import timeit
from time import perf_counter
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from benchmarks._common import (
    SmallCNN,
    alternate_samples,
    fit_seconds,
    paired_ratio,
    print_table,
)
from lightning_speedpack.core import stages
from lightning_speedpack.core.stages import stage
from lightning_speedpack.data_xray import instrument
from lightning_speedpack.data_xray.profiler import DataPipelineProfiler

FETCHES = 2_000  # a round of one variant


class WorkerCNN(SmallCNN):
    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(
            self.data, batch_size=self.batch_size, num_workers=2, persistent_workers=True
        )


def _fetch_us(fetcher: Any, every: int | None = None) -> float:
    """Microseconds a fetch of 8 rows through ``fetcher`` (``every``: the X-ray's read cadence)."""
    index = list(range(8))
    saved = instrument.CPU_READ_EVERY
    instrument.CPU_READ_EVERY = every or saved
    try:
        start = perf_counter()
        for _ in range(FETCHES):
            fetcher.fetch(index)
        return (perf_counter() - start) / FETCHES * 1e6
    finally:
        instrument.CPU_READ_EVERY = saved


def timed_fetch(repeats: int) -> None:
    """The timed fetch against torch's bare one (see the module's docstring)."""
    data = TensorDataset(torch.randn(512, 32), torch.randint(0, 10, (512,)))
    bare = iter(DataLoader(data, batch_size=8))._dataset_fetcher  # type: ignore[attr-defined]
    timed = instrument.TimedFetcher(bare)
    stages.activate(stages.CounterTable(rows=1), 0)  # recording, as in a profiled fit
    try:
        samples = alternate_samples(
            {
                "torch's fetcher": lambda: _fetch_us(bare),
                "timed, compute read every fetch": lambda: _fetch_us(timed, every=1),
                f"timed, 1 in {instrument.CPU_READ_EVERY} read (the X-ray's)": lambda: _fetch_us(
                    timed
                ),
            },
            repeats=repeats,
        )
    finally:
        stages.deactivate()
    base = statistics.median(samples["torch's fetcher"])
    print_table(
        f"The timed fetch: a batch of 8 rows, rounds of {FETCHES} fetches, {repeats} alternating",
        ["variant", "median us a fetch", "over torch's"],
        [
            [k, f"{statistics.median(v):.2f}", f"{statistics.median(v) - base:+.2f}"]
            for k, v in samples.items()
        ],
    )


def main(repeats: int = 5, epochs: int = 2) -> None:
    timed_fetch(max(repeats, 7))
    noop = stage("decode")

    def with_stage() -> None:
        with noop:
            pass

    n = 200_000
    per_call = min(timeit.repeat(with_stage, number=n, repeat=5)) / n
    print_table(
        "`with stage(...)` without a profiler",
        ["variant", "ns per call"],
        [["with stage('decode'): pass", per_call * 1e9]],
    )
    kwargs = {"max_epochs": epochs}
    samples = alternate_samples(
        {
            "plain": lambda: fit_seconds(lambda: WorkerCNN(n=1024), **kwargs),
            # The same fit again: its ratio is this measurement's own noise (an A/A comparison).
            "plain, again": lambda: fit_seconds(lambda: WorkerCNN(n=1024), **kwargs),
            "profiler": lambda: fit_seconds(
                lambda: WorkerCNN(n=1024),
                callbacks=[DataPipelineProfiler(probe="off", log_every_n_steps=10)],
                **kwargs,
            ),
        },
        repeats=repeats,
    )
    medians = {k: statistics.median(v) for k, v in samples.items()}
    print_table(
        f"DataPipelineProfiler cost: SmallCNN, 2 persistent workers, {epochs} epochs of 32 "
        f"batches, {repeats} alternating rounds",
        ["variant", "median fit s", "ratio of medians", "median of paired ratios"],
        [
            [k, v, v / medians["plain"], paired_ratio(samples, k, "plain")]
            for k, v in medians.items()
        ],
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="3 repeats of 1 epoch (< 60 s)")
    parser.add_argument("--repeats", type=int, default=None, help="alternating fits per variant")
    args = parser.parse_args()
    main(args.repeats or (3 if args.quick else 11), epochs=1 if args.quick else 6)
