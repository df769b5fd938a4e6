"""What importing the pack costs: a fresh interpreter per measurement, alternating the variants.

Every spawned DataLoader worker that unpickles a ``CachedDataset`` imports the package, and so
does ``speedpack --help``; the goal is that ``import lightning_speedpack.data`` and a spawn
worker's start cost no more than importing torch plus 0.2 s. Measured here:

- the wall time of ``python -c "<import>"`` for torch alone, ``lightning_speedpack.data``,
  ``lightning_speedpack``, ``speedpack --help`` and a callback (which does import Lightning);
- a spawn worker's start: time to the first batch of a ``DataLoader`` with one ``spawn``
  worker over a ``CachedDataset`` against the same loader over a plain ``TensorDataset``.

``--compare PATH`` also measures another checkout of the package (e.g. the commit before the
lazy imports) in the same rounds, through ``PYTHONPATH``. Median of ``--rounds`` (default 7).

Run ``.venv/bin/python benchmarks/imports.py [--quick] [--compare /path/to/other/checkout]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

REPO = Path(__file__).resolve().parents[1]

STATEMENTS = {
    "import torch": "import torch",
    "import lightning_speedpack.data": "import lightning_speedpack.data",
    # what unpickling a CachedDataset in a spawned worker imports: torch and the data tool
    "from lightning_speedpack.data import CachedDataset": "from lightning_speedpack.data "
    "import CachedDataset",
    "import lightning_speedpack": "import lightning_speedpack",
    "speedpack --help": "import sys; sys.argv=['speedpack','--help']; "
    "from lightning_speedpack.doctor.cli import main; main()",
    "from lightning_speedpack import ThroughputLogger": "from lightning_speedpack import "
    "ThroughputLogger",
}


def _python_seconds(statement: str, tree: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", statement],
        env=env,
        cwd=tree,
        check=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def _first_batch_seconds(dataset: object) -> float:
    loader = DataLoader(dataset, batch_size=4, num_workers=1, multiprocessing_context="spawn")  # type: ignore[arg-type]
    start = time.perf_counter()
    next(iter(loader))
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="3 rounds instead of 7")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--compare", type=Path, help="another checkout to measure beside this one")
    args = parser.parse_args()
    rounds = 3 if args.quick else args.rounds
    trees = {"this tree": REPO}
    if args.compare:
        trees["compare"] = args.compare.resolve()

    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):  # alternate every variant within each round
        for label, statement in STATEMENTS.items():
            for tree_name, tree in trees.items():
                key = (label, tree_name)
                times.setdefault(key, []).append(_python_seconds(statement, tree))

    print(f"\n### Import cost (median of {rounds} fresh interpreters, seconds)\n")
    print("| what | " + " | ".join(trees) + " | over `import torch` (this tree) |")
    print("|---|" + "---|" * len(trees) + "---|")
    torch_median = statistics.median(times[("import torch", "this tree")])
    for label in STATEMENTS:
        medians = [statistics.median(times[(label, t)]) for t in trees]
        delta = medians[0] - torch_median
        cells = " | ".join(f"{m:.2f}" for m in medians)
        print(f"| `{label}` | {cells} | {delta:+.2f} |")

    # A spawn worker's start, in this process (this tree only): CachedDataset vs TensorDataset.
    sys.path.insert(0, str(REPO))
    from lightning_speedpack.data import CachedDataset

    base = TensorDataset(torch.randn(64, 8), torch.arange(64))
    cached = CachedDataset(base)
    first: dict[str, list[float]] = {"TensorDataset": [], "CachedDataset": []}
    for _ in range(rounds):
        first["TensorDataset"].append(_first_batch_seconds(base))
        first["CachedDataset"].append(_first_batch_seconds(cached))
    t_plain = statistics.median(first["TensorDataset"])
    t_cached = statistics.median(first["CachedDataset"])
    print(f"\n### Spawn worker start: time to the first batch (median of {rounds})\n")
    print("| dataset | seconds | over TensorDataset |")
    print("|---|---|---|")
    print(f"| TensorDataset | {t_plain:.2f} | +0.00 |")
    print(f"| CachedDataset | {t_cached:.2f} | {t_cached - t_plain:+.2f} |")
    cached.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
