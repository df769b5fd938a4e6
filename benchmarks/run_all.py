"""``make bench``: run every benchmark script at full size, one after another.

Each script prints its own markdown tables of ratios; BENCHMARKS.md records the latest.
``--quick`` runs each script's small version instead (about 2 minutes in all).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    full = "--quick" not in sys.argv[1:]
    scripts = sorted(p for p in HERE.glob("*.py") if not p.name.startswith(("_", "run_all")))
    failed = []
    for script in scripts:
        cmd = [sys.executable, str(script)] + ([] if full else ["--quick"])
        print(f"\n## {script.name}  (`{' '.join(['python', *cmd[1:]])}`)", flush=True)
        start = time.perf_counter()
        if subprocess.run(cmd, check=False).returncode != 0:
            failed.append(script.name)
        print(f"\n({script.name}: {time.perf_counter() - start:.0f} s)", flush=True)
    if failed:
        print(f"\nFAILED: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
