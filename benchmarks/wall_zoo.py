"""The wall-time zoo: planted slow runs under ``speedpack doctor``, findings vs the planted cause.

Each case of ``benchmarks/zoo/wall_job.py`` plants one cause of a slow fit outside the model's
arithmetic (a checkpoint every step, a slow logger, workers restarted every epoch, ...) and
runs unmodified under ``speedpack doctor`` (the default set) in a fresh process. A planted case
is *recalled* when the doctor raises the planted finding as a warning, *top-1* when it is the
first warning; a clean run must get no warning at all (each one is a false warning). The job
times its own ``trainer.fit`` (``perf_counter`` around the call); the ledger check compares it
with the doctor's wall-time ledger (``figures["wall_time"]["total_s"]``), which should account
for the whole fit: the gap is ``|ledger - fit| / fit``.

``--cost`` times each planting instead, without the doctor: the same job with the planting and
with it fixed (``--unplanted``), alternating, and prints the planted run's wall time over the
fixed one's.

    python benchmarks/wall_zoo.py [--quick] [--cases a,b] [--rounds N] [--cost] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import print_table

HERE = Path(__file__).resolve().parent
JOB = HERE / "zoo" / "wall_job.py"
#: case -> the finding ids that name its planted cause (the first is the one shown); () is clean
CASES: dict[str, tuple[str, ...]] = {
    "clean": (),
    "clean-workers": (),
    "checkpoint-every-step": ("checkpoint-time",),
    "validation-heavy": ("validation-time",),
    "threads-oversubscribed": ("cpu-threads",),
    "tiny-batch": ("small-batch",),
    "slow-logger": ("logging-time",),
    "epoch-starts": ("epoch-start-time",),
    "slow-callback": ("callback-time",),
    "anomaly": ("anomaly-detection",),
    "profiler-on": ("profiler-on",),
    "slow-loader": ("data-wait", "data-bound"),
    "slow-progress-bar": ("logging-time",),
    "checkpoint-on-validation": ("checkpoint-time",),
    "slow-val-callback": ("callback-time",),
}
#: a callback-time finding must name the planted callback
CALLBACK_NAMES = {"slow-callback": "SlowCallback", "slow-val-callback": "SlowValCallback"}
LEDGER_GOAL = 2.0  # percent
TIMEOUT_S = 900


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
    }


def run_case(case: str, scale: float, tmp: Path, keep: Path | None = None) -> dict[str, Any]:
    """Run ``case`` under the doctor; the warnings, the ledger and the job's own fit time."""
    report, wall_out, root = tmp / f"{case}.json", tmp / f"{case}.wall.json", tmp / case
    for stale in (report, wall_out):
        stale.unlink(missing_ok=True)
    cmd = [
        sys.executable, "-m", "lightning_speedpack", "doctor", "--quiet",
        "--json", str(report), str(JOB), "--case", case,
        "--wall-out", str(wall_out), "--root", str(root), "--scale", str(scale),
    ]  # fmt: skip
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, check=False, env=_env(), timeout=TIMEOUT_S
        )
        code, stderr = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as exc:
        code, stderr = -1, f"timed out after {TIMEOUT_S} s: {exc.stderr!r}"[-2000:]
    seconds = time.perf_counter() - start
    if code != 0 or not report.exists():
        return {"case": case, "error": f"exit {code}: {stderr[-2000:]}", "seconds": seconds}
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        (keep / report.name).write_text(report.read_text())
        (keep / f"{case}.log").write_text(proc.stdout[-20000:] + proc.stderr[-20000:])
    data = json.loads(report.read_text())
    warnings = [f for f in data["findings"] if f["severity"] in ("warning", "error")]
    runs = data.get("runs") or [{}]
    ledger = (runs[-1].get("figures") or {}).get("wall_time")
    fit_s = json.loads(wall_out.read_text())["fit_s"] if wall_out.exists() else None
    return {
        "case": case,
        "warnings": [f["id"] for f in warnings],
        "callbacks": [f.get("figures", {}).get("callback") for f in warnings],
        "findings": [(f["severity"], f["id"], f["message"]) for f in data["findings"]],
        "ledger": ledger,
        "fit_s": fit_s,
        "seconds": seconds,
    }


def judge(row: dict[str, Any]) -> dict[str, Any]:
    """Recall, top-1, false warnings and the ledger gap of one row."""
    planted = CASES[row["case"]]
    if "error" in row:
        miss = False if planted else None
        return {"recall": miss, "top1": miss, "false": 0, "gap": None}
    warnings = row["warnings"]
    hits = [i for i, w in enumerate(warnings) if w in planted]
    name = CALLBACK_NAMES.get(row["case"])
    if name is not None:  # the callback-time finding must name the planted callback
        hits = [i for i in hits if row["callbacks"][i] == name]
    gap = None
    if row["ledger"] is not None and row["fit_s"]:
        gap = abs(row["ledger"]["total_s"] - row["fit_s"]) / row["fit_s"] * 100
    return {
        "recall": bool(hits) if planted else None,
        "top1": (bool(hits) and hits[0] == 0) if planted else None,
        "false": 0 if planted else len(warnings),
        "gap": gap,
    }


def _yes(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "**NO**")


def _parts(ledger: dict[str, Any] | None) -> str:
    if ledger is None:
        return "n/a"
    parts = sorted(ledger.get("fractions", {}).items(), key=lambda kv: -kv[1])
    shown = [f"{k} {v:.0%}" for k, v in parts if v >= 0.05][:3]
    callbacks = ledger.get("callbacks") or {}
    if callbacks and ledger.get("fractions", {}).get("callbacks", 0) >= 0.05:
        top, seconds = next(iter(callbacks.items()))
        shown.append(f"({top} {seconds / max(ledger['total_s'], 1e-9):.0%})")
    return ", ".join(shown)


def zoo(cases: list[str], rounds: int, scale: float, keep: Path | None = None) -> None:
    rows: list[list[Any]] = []
    details: list[list[Any]] = []
    recall = top1 = planted_n = false_total = 0
    gaps: list[float] = []
    with tempfile.TemporaryDirectory(prefix="speedpack-wall-zoo-") as tmp:
        for rnd in range(rounds):
            for case in cases:
                row = run_case(case, scale, Path(tmp), keep)
                verdict = judge(row)
                if CASES[case]:
                    planted_n += 1
                    recall += bool(verdict["recall"])
                    top1 += bool(verdict["top1"])
                false_total += verdict["false"]
                if verdict["gap"] is not None:
                    gaps.append(verdict["gap"])
                print(
                    f"[round {rnd + 1}] {case}: {row.get('warnings', row.get('error'))} "
                    f"gap={verdict['gap']}",
                    file=sys.stderr,
                    flush=True,
                )
                gap = "n/a" if verdict["gap"] is None else f"{verdict['gap']:.2f}"
                ledger = row.get("ledger")
                rows.append(
                    [
                        *([rnd + 1] if rounds > 1 else []),
                        case,
                        ", ".join(CASES[case]) or "(clean)",
                        ", ".join(row.get("warnings", [])) or ("error" if "error" in row else "-"),
                        _yes(verdict["recall"]),
                        _yes(verdict["top1"]),
                        verdict["false"] if not CASES[case] else "-",
                        "-" if row.get("fit_s") is None else f"{row['fit_s']:.1f}",
                        "n/a" if ledger is None else f"{ledger['total_s']:.1f}",
                        gap,
                        _parts(ledger),
                    ]
                )
                if "error" in row:
                    details.append([case, "error", row["error"][-600:].replace("\n", " ")])
                for severity, id_, message in row.get("findings", []):
                    if severity != "info":
                        text = " ".join(message.replace("|", "/").split())
                        details.append([case, f"{severity}: {id_}", text])
    worst = f"{max(gaps):.2f}%" if gaps else "n/a (no wall_time ledger in the report)"
    print_table(
        f"Wall-time zoo (`speedpack doctor`, scale {scale:g}): recall {recall}/{planted_n}, "
        f"top-1 {top1}/{planted_n}, {false_total} false warnings on clean runs, "
        f"max ledger gap {worst} (goal {LEDGER_GOAL:g}%)",
        [
            *(["round"] if rounds > 1 else []),
            "case",
            "planted",
            "warnings (in order)",
            "recall",
            "top-1",
            "false",
            "fit s",
            "ledger s",
            "gap %",
            "ledger's largest parts",
        ],
        rows,
    )
    print_table("Every warning, per case", ["case", "finding", "message"], details)


def cost(cases: list[str], rounds: int, scale: float) -> None:
    """Each planting's cost, without the doctor: fit seconds planted vs fixed, alternating."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="speedpack-wall-cost-") as tmp:
        for case in cases:
            if not CASES[case]:
                continue
            fits: dict[str, list[float]] = {"planted": [], "fixed": []}
            for rnd in range(rounds):
                order = ["planted", "fixed"] if rnd % 2 == 0 else ["fixed", "planted"]
                for variant in order:
                    out = Path(tmp) / f"{case}-{variant}.json"
                    cmd = [
                        sys.executable, str(JOB), "--case", case, "--wall-out", str(out),
                        "--root", str(Path(tmp) / f"{case}-{variant}"), "--scale", str(scale),
                        *(["--unplanted"] if variant == "fixed" else []),
                    ]  # fmt: skip
                    proc = subprocess.run(
                        cmd, capture_output=True, text=True, env=_env(), timeout=TIMEOUT_S
                    )
                    if proc.returncode != 0:
                        raise SystemExit(f"{case} {variant} failed:\n{proc.stderr[-2000:]}")
                    fits[variant].append(json.loads(out.read_text())["fit_s"])
            planted, fixed = statistics.median(fits["planted"]), statistics.median(fits["fixed"])
            print(f"{case}: planted {planted:.2f} s, fixed {fixed:.2f} s", file=sys.stderr)
            rows.append(
                [case, f"{planted:.2f}", f"{fixed:.2f}", f"{planted / fixed:.2f}",
                 f"{1 - fixed / planted:.0%}"]
            )  # fmt: skip
    print_table(
        f"What each planting costs (no doctor; median of {rounds} alternating fits, scale "
        f"{scale:g})",
        ["case", "planted fit s", "fixed fit s", "planted / fixed", "share of the planted run"],
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="half-length runs")
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--cost", action="store_true", help="time each planting, no doctor")
    parser.add_argument("--keep", type=Path, help="copy each case's doctor JSON and output here")
    args = parser.parse_args()
    cases = [c for c in args.cases.split(",") if c] or list(CASES)
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; known: {', '.join(CASES)}")
    scale = 0.5 if args.quick else 1.0
    if args.cost:
        cost(cases, max(args.rounds, 1), scale)
    else:
        zoo(cases, args.rounds, scale, args.keep)


if __name__ == "__main__":
    main()
