"""What the ``garbage-collection`` finding's fix buys: a full collection with, without freeze.

After ``import torch`` and Lightning a full collection scans ~400,000 live objects. The finding
advises ``gc.collect(); gc.freeze()`` before ``trainer.fit``: what exists then leaves the
collector's scans. This times one full collection (``gc.collect()``) in this process as it is,
and one after ``gc.freeze()`` (then ``gc.unfreeze()``), the two alternated, medians of the
rounds.

Run ``.venv/bin/python benchmarks/collector.py [--quick] [--repeats 7]``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import alternate_samples, paired_ratio, print_table

__all__ = ["full_collection_s"]


def full_collection_s(*, frozen: bool) -> float:
    """Seconds of one ``gc.collect()``, with what is alive now frozen or not."""
    if frozen:
        gc.freeze()
    try:
        started = time.perf_counter()
        gc.collect()
        return time.perf_counter() - started
    finally:
        if frozen:
            gc.unfreeze()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=None, help="alternating rounds (7)")
    parser.add_argument("--quick", action="store_true", help="5 rounds")
    args = parser.parse_args()
    args.repeats = args.repeats or (5 if args.quick else 7)
    import torch  # noqa: F401  (what a Lightning job has alive before fit)

    for name in ("pytorch_lightning", "lightning.pytorch"):
        with contextlib.suppress(ImportError):
            __import__(name)
    gc.collect()
    objects = len(gc.get_objects())
    samples = alternate_samples(
        {
            "as is": lambda: full_collection_s(frozen=False),
            "gc.freeze()": lambda: full_collection_s(frozen=True),
        },
        args.repeats,
    )
    ratio = paired_ratio(samples, "as is", "gc.freeze()")
    rows = [
        [name, f"{1000 * sorted(values)[len(values) // 2]:.3f}", len(values)]
        for name, values in samples.items()
    ]
    print_table(
        f"One full collection with {objects:,} objects alive (torch and Lightning imported)",
        ["collection", "median ms", "rounds"],
        rows,
    )
    print(f"\nas is / after gc.freeze(): {ratio:,.0f}x (median of paired rounds)")


if __name__ == "__main__":
    main()
