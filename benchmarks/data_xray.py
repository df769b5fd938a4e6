"""Cost of the data-pipeline X-ray: the profiler on the small CNN with 2 workers, and a stage.

Run: ``.venv/bin/python benchmarks/data_xray.py [--quick] [--repeats N]``. Variants alternate in
one process; prints the ratio of the medians and the median of each round's ratio (the machine
is shared: only ratios count, and a round's two fits share its slow spells).
"""

from __future__ import annotations

import argparse
import statistics
import timeit
from typing import Any

from torch.utils.data import DataLoader

from benchmarks._common import (
    SmallCNN,
    alternate_samples,
    fit_seconds,
    paired_ratio,
    print_table,
)
from lightning_speedpack.core.stages import stage
from lightning_speedpack.data_xray.profiler import DataPipelineProfiler


class WorkerCNN(SmallCNN):
    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(
            self.data, batch_size=self.batch_size, num_workers=2, persistent_workers=True
        )


def main(repeats: int = 5, epochs: int = 2) -> None:
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
