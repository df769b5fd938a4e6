"""``make demo``: the doctor on a slow training script and on the same job fixed with the pack.

Runs ``speedpack doctor --what-if`` on ``slow_training.py`` and then on ``fast_training.py``
(same model, same JPEG files, same epochs), each in its own process, and prints:

* the what-if table of the slow script: each remedy :class:`~lightning_speedpack.WhatIf` tried
  on its model and data before the first step, today's setting, the candidate, samples/s
  before -> after, the gain with its spread over the rounds, and the verdict;
* the worker settings ``fast_training.py``'s own ``WhatIf(apply=[...])`` measured and applied
  for its fit (``--what-if`` reuses that instance: it only adds its results to the report);
* the doctor's findings for the slow script, each with where it is and the fix;
* ``speedpack compare`` on the two reports: a side-by-side table (wall time, samples/s, data
  wait, syncs per step, retained graphs, batch size, peak RSS, each with its ratio to the slow
  run), the findings the fix made disappear, and a PNG chart of samples/s over steps;
* the HTML pages (``speedpack doctor --html``, ``speedpack compare --html``): one per run and
  the comparison, and a screenshot of the slow run's page when headless Chromium is installed;
* where each offline W&B run lives and the ``wandb sync`` command that uploads it;
* the speed-up.

Usage: ``python examples/demo.py [--out demo-output] [--images 2000] [--epochs 10]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

HERE = Path(__file__).resolve().parent
# Wide enough for the findings table when the output is a log file or CI, not a terminal.
console = Console(width=None if sys.stdout.isatty() else 160)


def run_doctor(
    script: str,
    out: Path,
    data_dir: Path,
    args: argparse.Namespace,
    flags: Sequence[str] = (),
) -> dict[str, Any]:
    """Run ``speedpack doctor [flags]`` on one example; return its JSON report."""
    report = out / f"{Path(script).stem}.json"
    page = out / f"{Path(script).stem}.html"
    log = out / f"{Path(script).stem}.log"
    cmd = [
        sys.executable,
        "-m",
        "lightning_speedpack",
        "doctor",
        *flags,
        "--json",
        str(report),
        "--html",
        str(page),
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
    shown = " ".join([*flags, f"examples/{script}"])
    console.print(f"[bold]$ speedpack doctor {shown} ...[/] (log: {log})")
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
    """The slow script's findings as the doctor shows them: alike ones folded, GPU advice last."""
    from lightning_speedpack.core.findings import findings_from_dicts
    from lightning_speedpack.doctor.grouping import presented

    table = Table(title="What slows slow_training.py down", show_lines=True)
    table.add_column("severity", no_wrap=True)
    table.add_column("finding", ratio=3)
    table.add_column("where", ratio=1, overflow="fold")
    table.add_column("fix", ratio=2)
    for f in presented(findings_from_dicts(report["findings"])):
        severity = f"{f.severity}, on {f.pays_on}" if f.pays_on else f.severity
        table.add_row(
            severity, f"[bold]{f.component}/{f.id}[/]\n{f.message}", f.location or "", f.fix or ""
        )
    console.print(table)


#: The colour of each what-if verdict; other verdicts ("not applicable", "not tried") are dim.
VERDICT_STYLES = {
    "apply": "bold green",
    "uncertain": "yellow",
    "no gain here": "default",
    "changes the numerics": "red",
}


def print_what_if(report: dict[str, Any], script: str) -> None:
    """The what-if table of the run's last fit: each remedy tried, before -> after, the verdict."""
    figure = next(
        (r["figures"]["what_if"] for r in reversed(report["runs"]) if "what_if" in r["figures"]),
        None,
    )
    if figure is None:
        console.print(f"No what-if table in the report of {script} (no fit reached its trials).")
        return
    seconds = figure.get("trial_seconds")
    table = Table(
        title=f"What if: each remedy tried on {script}'s own model and data",
        caption=None if seconds is None else f"trials: {seconds:.1f} s before the first step",
    )
    table.add_column("knob", no_wrap=True)
    table.add_column("today", overflow="fold")
    table.add_column("candidate", overflow="fold")
    table.add_column("before -> after samples/s", justify="right", no_wrap=True)
    table.add_column("gain (spread)", justify="right", no_wrap=True)
    table.add_column("verdict", ratio=1)
    for row in figure["rows"]:
        r = dict(zip(figure["columns"], row, strict=True))
        ceilings = "-"
        if r["before"] is not None and r["after"] is not None:
            ceilings = f"{r['before']:,.0f} -> {r['after']:,.0f}"
        gain = "-"
        if r["gain"] is not None:
            gain = f"{r['gain']:.2f}x"
            if r["gain_low"] is not None and r["gain_high"] is not None:
                gain += f" ({r['gain_low']:.2f}-{r['gain_high']:.2f})"
        verdict = f"[{VERDICT_STYLES.get(r['verdict'], 'dim')}]{r['verdict']}[/]"
        notes = [r["note"]] if r["note"] else []
        if r["numerics"] is not None and r["verdict"] != "apply":
            notes.insert(0, f"loss moved {r['numerics']:.2g}")
        if notes:
            verdict += f"\n[dim]{escape('; '.join(notes))}[/]"
        today, candidate = escape(str(r["today"])), escape(str(r["candidate"] or "-"))
        table.add_row(r["knob"], today, candidate, ceilings, gain, verdict)
    console.print(table)


def print_applied(report: dict[str, Any], script: str) -> None:
    """What the script's own ``WhatIf(apply=[...])`` applied for its fit, and what it did not."""
    figure = next(
        (r["figures"]["what_if"] for r in reversed(report["runs"]) if "what_if" in r["figures"]),
        None,
    )
    if figure is None:
        console.print(f"{script}: no what-if results in its report.")
        return
    applied = figure["applied"]
    if applied:
        settings = ", ".join(f"{knob}={value}" for knob, value in applied.items())
        console.print(f"[bold]{script}[/]: WhatIf applied {settings} for the fit (measured)")
    for row in figure["rows"]:
        r = dict(zip(figure["columns"], row, strict=True))
        if r["knob"] in applied:
            continue
        why = f"{r['verdict']}: {r['note']}" if r["note"] else r["verdict"]
        console.print(f"[bold]{script}[/]: {r['knob']} left at {r['today']} ({escape(why)})")


def print_wandb_runs(out: Path, since: float) -> None:
    """Where each offline W&B run of this demo lives and how to upload it.

    Runs an earlier ``make demo`` left in the same folder are not listed (``since``: when
    this one started, as ``time.time()``).
    """
    runs = sorted(p for p in out.glob("**/wandb/offline-run-*") if p.stat().st_mtime >= since)
    if not runs:
        console.print("No W&B runs were written (is wandb installed? `pip install .[wandb]`).")
        return
    console.print("[bold]W&B offline runs[/] (upload with `wandb sync`):")
    for run in runs:
        console.print(f"  wandb sync {run}", soft_wrap=True)


def compare_runs(out: Path) -> float:
    """``speedpack compare`` on both reports: the table, the chart; returns the speed-up."""
    from lightning_speedpack.doctor.compare import main as speedpack_compare

    reports = [out / "slow_training.json", out / "fast_training.json"]
    chart, comparison = out / "samples_per_sec.png", out / "comparison.json"
    page = out / "comparison.html"
    args = [
        *map(str, reports),
        "--plot",
        str(chart),
        "--json",
        str(comparison),
        "--html",
        str(page),
    ]
    console.print(f"[bold]$ speedpack compare {' '.join(args)}[/]", soft_wrap=True)
    code = speedpack_compare(args)
    if code != 0:
        raise SystemExit(f"speedpack compare failed (exit {code})")
    ratios = json.loads(comparison.read_text())["figures"]["samples_per_sec"]["ratio_to_first"]
    return float(ratios[1])


def screenshot(page: Path, png: Path) -> Path | None:
    """A PNG of the top of ``page`` in headless Chromium (the README's picture), if one is here."""
    from lightning_speedpack.doctor.html.chromium import screenshot as take

    try:
        taken = take(page, png)
    except (FileNotFoundError, RuntimeError, OSError) as err:  # no browser: the pages are there
        console.print(f"No screenshot of {page.name}: {escape(str(err))}")
        return None
    console.print(f"Screenshot of {page.name}: {taken}")
    return taken


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("demo-output"))
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    data_dir = out / "jpegs"
    sys.path.insert(0, str(HERE))
    from jpeg_common import write_jpegs

    console.rule("[bold]lightning-speedpack demo")
    console.print(
        f"Writing {args.images} synthetic JPEGs to {data_dir} (once, shared by both runs)"
    )
    write_jpegs(data_dir, args.images)
    # 30 s of trials (the doctor's `--what-if` alone gives them 60 s).
    slow = run_doctor("slow_training.py", out, data_dir, args, flags=["--what-if-budget", "30"])
    fast = run_doctor("fast_training.py", out, data_dir, args, flags=["--what-if"])
    print_what_if(slow, "slow_training.py")
    print_applied(fast, "fast_training.py")
    print_findings(slow)
    speedup = compare_runs(out)
    print_wandb_runs(out, started)
    console.print(f"Reports: {out / 'slow_training.json'}, {out / 'fast_training.json'}")
    pages = [out / f"{name}.html" for name in ("slow_training", "fast_training", "comparison")]
    console.print("Pages (open in a browser): " + ", ".join(map(str, pages)))
    screenshot(pages[0], out / "slow_training.png")
    console.rule(f"fast_training.py trains {speedup:.1f}x the samples per second")


if __name__ == "__main__":
    main()
