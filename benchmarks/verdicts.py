"""The verdict zoo: planted pipelines under ``speedpack doctor --deep``, verdicts vs truth.

Each case of ``benchmarks/zoo/verdict_job.py`` runs unmodified under the doctor in a fresh
process. A case is right when the doctor's verdict names the planted bound (``model`` for the
cached and in-memory pipelines once warm, ``data`` for the planted slow loaders) and raises no
warning against it: a model-bound case with a ``data-bound``, ``dataloader-workers`` or
``data-wait`` warning is a false alarm; a data-bound case must get ``data-bound`` first among
the data findings. Prints one row per case and the count of false warnings.

    python benchmarks/verdicts.py [--quick] [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import print_table

HERE = Path(__file__).resolve().parent
JOB = HERE / "zoo" / "verdict_job.py"
CASES = {  # case -> the planted bound
    "cached-light": "model",
    "cached-heavy": "model",
    "memory": "model",
    "cold-decode": "data",
    "zero-workers": "data",
    "slow-collate": "data",
    "handover": "data",
}
DATA_WARNINGS = ("data-bound", "dataloader-workers", "data-wait")


def run_case(case: str, samples: int, epochs: int, tmp: Path) -> dict[str, Any]:
    report = tmp / f"{case}.json"
    cmd = [
        sys.executable, "-m", "lightning_speedpack", "doctor", "--deep", "--quiet",
        "--json", str(report), str(JOB), "--case", case,
        "--samples", str(samples), "--epochs", str(epochs),
    ]  # fmt: skip
    start = time.perf_counter()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    seconds = time.perf_counter() - start
    if proc.returncode != 0 or not report.exists():
        return {"case": case, "error": proc.stderr[-2000:], "seconds": seconds}
    data = json.loads(report.read_text())
    figures = data["runs"][0]["figures"]
    warnings = [f["id"] for f in data["findings"] if f["severity"] in ("warning", "error")]
    data_ids = [f["id"] for f in data["findings"] if f["id"] in (*DATA_WARNINGS, "model-bound")]
    return {
        "case": case,
        "bound": figures.get("bound"),
        "verdict": figures.get("verdict", ""),
        "revisions": figures.get("verdict_revisions", []),
        "warnings": warnings,
        "first_data_finding": data_ids[0] if data_ids else None,
        "seconds": seconds,
    }


def judge(row: dict[str, Any]) -> tuple[bool, int]:
    """Whether the case is right, and its false warnings."""
    planted = CASES[row["case"]]
    if "error" in row:
        return False, 0
    false = [w for w in row["warnings"] if w in DATA_WARNINGS] if planted == "model" else []
    right = row["bound"] == planted and not false
    if planted == "data":
        right = right and row["first_data_finding"] == "data-bound"
    return right, len(false)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples and epochs")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    samples, epochs = (320, 3) if args.quick else (640, 4)
    rows, right, false_total = [], 0, 0
    with tempfile.TemporaryDirectory(prefix="speedpack-verdicts-") as tmp:
        for rnd in range(args.rounds):
            for case in CASES:
                row = run_case(case, samples, epochs, Path(tmp))
                ok, false = judge(row)
                right += ok
                false_total += false
                print(f"[round {rnd + 1}] {case}: {row.get('bound')} ok={ok}", file=sys.stderr)
                rows.append(
                    [
                        rnd + 1,
                        case,
                        CASES[case],
                        row.get("bound", "error"),
                        "yes" if ok else "NO",
                        ", ".join(row.get("warnings", [])) or "-",
                        (row.get("verdict") or row.get("error", ""))[:300],
                        f"{row['seconds']:.0f}",
                    ]
                )
    print_table(
        f"Verdict zoo: {samples} samples, {epochs} epochs, `speedpack doctor --deep`; "
        f"{right} of {len(rows)} right, {false_total} false warnings",
        ["round", "case", "planted", "verdict", "right", "warnings", "verdict text", "s"],
        rows,
    )


if __name__ == "__main__":
    main()
