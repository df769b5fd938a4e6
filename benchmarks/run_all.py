"""``make bench``: run every benchmark script at full size, one after another.

Each script prints its own markdown tables of ratios; BENCHMARKS.md records the latest.
``--quick`` runs each script's small version instead (what_if.py's alone took 3.5 minutes
on a loaded 2-core machine).
``--beside DIR`` runs each script of another checkout (``DIR``, e.g. a ``git worktree`` of an
older commit) just before the same script of this one, with ``DIR`` first on ``PYTHONPATH``:
before and after, side by side, for what a change did to every figure. ``--skip a,b`` leaves
scripts out by name (e.g. ``soak``, a reliability run rather than a speed figure).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RENAMED = {"doctor_overhead": "doctor"}  # this tree's name -> an older checkout's


def _run(script: Path, root: Path, quick: bool, label: str) -> bool:
    cmd = [sys.executable, str(script)] + (["--quick"] if quick else [])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    print(f"\n## {label}{script.name}  (`{' '.join(['python', *cmd[1:]])}`)", flush=True)
    start = time.perf_counter()
    ok = subprocess.run(cmd, check=False, cwd=root, env=env).returncode == 0
    print(f"\n({label}{script.name}: {time.perf_counter() - start:.0f} s)", flush=True)
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="each script's small version")
    parser.add_argument("--beside", type=Path, help="another checkout to run each script in first")
    parser.add_argument("--skip", default="", help="comma-separated script names to leave out")
    args = parser.parse_args()
    skip = {name for name in args.skip.split(",") if name}
    scripts = sorted(
        p
        for p in HERE.glob("*.py")
        if not p.name.startswith(("_", "run_all", "gpu_check", "bench_check"))
        and p.stem not in skip
    )
    failed = []
    for script in scripts:
        if args.beside is not None:
            other = args.beside / "benchmarks" / f"{RENAMED.get(script.stem, script.stem)}.py"
            if other.exists() and not _run(other, args.beside.resolve(), args.quick, "before: "):
                failed.append(f"before: {script.name}")
        if not _run(script, HERE.parent, args.quick, "after: " if args.beside else ""):
            failed.append(script.name)
    if failed:
        print(f"\nFAILED: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
