"""``make demo``: the doctor on a slow training script and on the same job fixed with the pack.

Runs ``speedpack doctor`` on ``slow_training.py`` and then on ``fast_training.py`` (same model,
same JPEG files, same epochs), each in its own process, and prints:

* the doctor's findings for the slow script, each with where it is and the fix;
* a side-by-side table (wall time, samples/s, data wait, syncs per step, retained graphs,
  batch size, peak RSS) and the speed-up;
* where each offline W&B run lives and the ``wandb sync`` command that uploads it;
* a PNG chart of samples/s over steps for both runs.

Usage: ``python examples/demo.py [--out demo-output] [--images 2000] [--epochs 10]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
# Wide enough for the findings table when the output is a log file or CI, not a terminal.
console = Console(width=None if sys.stdout.isatty() else 160)


def run_doctor(script: str, out: Path, data_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Run ``speedpack doctor`` on one example; return its JSON report."""
    report = out / f"{Path(script).stem}.json"
    log = out / f"{Path(script).stem}.log"
    cmd = [
        sys.executable,
        "-m",
        "lightning_speedpack",
        "doctor",
        "--json",
        str(report),
        str(HERE / script),
        "--images",
        str(args.images),
        "--epochs",
        str(args.epochs),
        "--data-dir",
        str(data_dir),
        "--out",
        str(out / Path(script).stem),
        "--wandb",
    ]
    console.print(f"[bold]$ speedpack doctor examples/{script} ...[/] (log: {log})")
    start = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=_env(out))
    if proc.returncode != 0:
        console.print(log.read_text()[-4000:])
        raise SystemExit(f"{script} failed under the doctor (exit {proc.returncode}); see {log}")
    console.print(f"  done in {time.perf_counter() - start:.1f} s")
    return dict(json.loads(report.read_text()))


def _env(out: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("WANDB_MODE", "offline")  # the demo never needs the network
    env.setdefault("WANDB_SILENT", "true")
    env["WANDB_DIR"] = str(out)
    return env


def print_findings(report: dict[str, Any]) -> None:
    """The slow script's findings, most severe first."""
    table = Table(title="What slows slow_training.py down", show_lines=True)
    table.add_column("severity", no_wrap=True)
    table.add_column("finding", ratio=3)
    table.add_column("where", ratio=1, overflow="fold")
    table.add_column("fix", ratio=2)
    order = {"error": 0, "warning": 1, "info": 2}
    for f in sorted(report["findings"], key=lambda f: order.get(f.get("severity", "info"), 3)):
        table.add_row(
            f.get("severity", ""),
            f"[bold]{f['component']}/{f['id']}[/]\n{f['message']}",
            f["location"] or "",
            f.get("fix") or "",
        )
    console.print(table)


ROWS = [
    ("wall time (s)", lambda r: r["wall_s"], ".1f"),
    ("samples/s", lambda r: r["samples_per_sec"], ".0f"),
    ("data wait (% of step)", lambda r: _pct(r["figures"].get("data_wait_fraction")), ".0f"),
    ("syncs per step (user code)", lambda r: r["figures"].get("syncs_per_step"), ".2f"),
    ("retained graphs", lambda r: r["figures"].get("retained_graphs"), "d"),
    ("batch size", lambda r: r["figures"].get("batch_size"), "d"),
    ("peak RSS (MB)", lambda r: r["figures"].get("peak_rss_mb"), ".0f"),
]


def _pct(value: float | None) -> float | None:
    return None if value is None else 100 * value


def _fmt(value: Any, spec: str = ".3g") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return format(int(value) if spec == "d" else value, spec)


def print_comparison(slow: dict[str, Any], fast: dict[str, Any]) -> float:
    """Side-by-side table; returns the samples/s speed-up."""
    s, f = slow["runs"][-1], fast["runs"][-1]
    speedup = f["samples_per_sec"] / s["samples_per_sec"]
    table = Table(title="slow_training.py vs fast_training.py (same model, data and epochs)")
    for col in ("", "slow", "fast"):
        table.add_column(col, justify="right")
    for name, get, spec in ROWS:
        table.add_row(name, _fmt(get(s), spec), _fmt(get(f), spec))
    table.add_row("[bold]speed-up (samples/s)", "1.0x", f"[bold green]{speedup:.1f}x")
    console.print(table)
    return speedup


def print_wandb_runs(out: Path) -> None:
    """Where each offline W&B run lives and how to upload it."""
    runs = sorted(out.glob("**/wandb/offline-run-*"))
    if not runs:
        console.print("No W&B runs were written (is wandb installed? `pip install .[wandb]`).")
        return
    console.print("[bold]W&B offline runs[/] (upload with `wandb sync`):")
    for run in runs:
        console.print(f"  wandb sync {run}", soft_wrap=True)


def draw_chart(slow: dict[str, Any], fast: dict[str, Any], path: Path) -> Path | None:
    """PNG of samples/s over training steps for both runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    drawn = False
    for name, report in (("slow_training.py", slow), ("fast_training.py", fast)):
        series = report["runs"][-1]["figures"].get("samples_per_sec_over_steps") or []
        if series:
            steps, rates = zip(*series, strict=True)
            ax.plot(steps, rates, marker=".", label=name)
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("training step")
    ax.set_ylabel("samples / s")
    ax.set_title("Throughput over the run (ThroughputLogger, per logging window)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("demo-output"))
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    data_dir = out / "jpegs"
    sys.path.insert(0, str(HERE))
    from jpeg_common import write_jpegs

    console.rule("[bold]lightning-speedpack demo")
    console.print(
        f"Writing {args.images} synthetic JPEGs to {data_dir} (once, shared by both runs)"
    )
    write_jpegs(data_dir, args.images)
    slow = run_doctor("slow_training.py", out, data_dir, args)
    fast = run_doctor("fast_training.py", out, data_dir, args)
    print_findings(slow)
    speedup = print_comparison(slow, fast)
    print_wandb_runs(out)
    chart = draw_chart(slow, fast, out / "samples_per_sec.png")
    if chart:
        console.print(f"Chart of samples/s over steps: {chart}")
    console.print(f"Reports: {out / 'slow_training.json'}, {out / 'fast_training.json'}")
    console.rule(f"fast_training.py trains {speedup:.1f}x the samples per second")


if __name__ == "__main__":
    main()
