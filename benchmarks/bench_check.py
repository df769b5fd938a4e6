"""``make bench-check``: each headline figure, measured quickly, against its bound.

The bounds live in one checked-in file, ``benchmarks/bounds.toml``: per figure its bound, its
direction (``max``: the figure may not rise above it; ``min``: may not fall below), a tolerance
for this machine's noise (in the figure's own units), its kind, the command that measures it in
full and where and when the bound was earned. Kinds:

- ``memory``: PSS over a payload; steady from run to run;
- ``count``: counts and accounting shares (a zoo's recall and false warnings, verdicts right,
  the ledger's gap); steady unless a finding itself regressed;
- ``timing``: ratios of times; they need a quiet machine.

Each group of figures is measured in a fresh process (``--measure GROUP``), one group after
another, by the benchmark scripts' own quick functions. Prints one line per figure::

    PASS name: figure vs bound (tolerance) -- command

and exits 1 when any figure FAILs (a figure that could not be measured FAILs too).

    python benchmarks/bench_check.py [--stable] [--only a,b] [--list] [--json PATH]

``--logs DIR`` keeps each group's own output (its tables, a line per zoo case) in ``DIR``.
``--stable`` checks the memory and count figures only (CI runs it); without it every figure
is checked (a developer runs it before stopping). A bound moves only with a note in
BENCHMARKS.md saying why (see DEVELOPERS.md).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BOUNDS = HERE / "bounds.toml"
KINDS = ("memory", "count", "timing")
STABLE_KINDS = ("memory", "count")
DIRECTIONS = ("max", "min")
GROUP_TIMEOUT_S = 1200
#: the wall zoo's cases the check runs (two clean runs and five plantings of distinct causes)
WALL_CASES = (
    "clean",
    "clean-workers",
    "checkpoint-every-step",
    "tiny-batch",
    "slow-logger",
    "slow-callback",
    "slow-loader",
)
#: where each group's own output goes (``--logs``): the benchmarks' tables and per-case lines
LOG_DIR: Path | None = None
REPRODUCE = ".venv/bin/python benchmarks/bench_check.py --only {name}"
#: group -> what its child printed (the zoos print a line per case): shown under a FAIL, so a
#: CI log says which case and which finding failed a count
GROUP_OUTPUT: dict[str, str] = {}
#: how much of a failed group's output is shown
OUTPUT_LINES, OUTPUT_LINE_CHARS = 24, 400


@dataclass(frozen=True)
class Bound:
    """One figure's entry in ``bounds.toml``."""

    name: str
    kind: str
    direction: str
    bound: float
    tolerance: float
    command: str
    measured: str
    note: str = ""
    #: A regression seen and not yet fixed, with its issue ("issue 38: ..."): the figure is still
    #: measured and printed, as OPEN instead of FAIL, so the run stays usable in CI while the
    #: regression stays in sight; once the figure is back within its bound the line says so.
    open_regression: str = ""

    @property
    def limit(self) -> float:
        """The value past which the figure FAILs: the bound widened by the tolerance."""
        if self.direction == "max":
            return self.bound + self.tolerance
        return self.bound - self.tolerance


@dataclass(frozen=True)
class Result:
    """A figure judged against its bound."""

    name: str
    kind: str
    status: str  # PASS, FAIL, or OPEN (past the bound, a regression with an open issue)
    value: float | None
    bound: float
    direction: str
    tolerance: float
    limit: float
    command: str
    error: str = ""
    open_regression: str = ""


# ---------------------------------------------------------------------- the bounds file


def load_bounds(path: Path = BOUNDS) -> list[Bound]:
    """Parse and validate ``bounds.toml``: a ``[[figure]]`` table per figure.

    Raises:
        ValueError: an entry lacks a field, has a field of the wrong type or value, or repeats
            a name.
    """
    try:  # the standard library's since Python 3.11 (the package itself supports 3.10)
        tomllib: Any = importlib.import_module("tomllib")
    except ModuleNotFoundError:  # pragma: no cover - the venv runs 3.11
        raise SystemExit("benchmarks/bench_check.py needs Python 3.11 or later (tomllib)") from None
    data = tomllib.loads(path.read_text())
    entries = data.get("figure")
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path}: no [[figure]] entries")
    bounds, seen = [], set()
    for i, entry in enumerate(entries):
        where = f"{path.name}: figure {i + 1} ({entry.get('name', '?')})"
        for key, types in (
            ("name", str),
            ("kind", str),
            ("direction", str),
            ("bound", (int, float)),
            ("tolerance", (int, float)),
            ("command", str),
            ("measured", str),
        ):
            if not isinstance(entry.get(key), types) or isinstance(entry.get(key), bool):
                raise ValueError(f"{where}: `{key}` missing or of the wrong type")
        unknown = set(entry) - set(Bound.__dataclass_fields__)
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {sorted(unknown)}")
        if entry["kind"] not in KINDS:
            raise ValueError(f"{where}: `kind` must be one of {KINDS}, got {entry['kind']!r}")
        if entry["direction"] not in DIRECTIONS:
            raise ValueError(
                f"{where}: `direction` must be one of {DIRECTIONS}, got {entry['direction']!r}"
            )
        if not isinstance(entry.get("open_regression", ""), str):
            raise ValueError(f"{where}: `open_regression` must be a str (the issue and why)")
        if entry["tolerance"] < 0:
            raise ValueError(f"{where}: `tolerance` must be >= 0, got {entry['tolerance']}")
        if entry["name"] in seen:
            raise ValueError(f"{where}: the name is used twice")
        seen.add(entry["name"])
        bounds.append(
            Bound(
                **{**entry, "bound": float(entry["bound"]), "tolerance": float(entry["tolerance"])}
            )
        )
    return bounds


# ---------------------------------------------------------------------- judging


def judge(bound: Bound, value: float | None, error: str = "") -> Result:
    """PASS when ``value`` is within the bound widened by its tolerance; FAIL otherwise.

    A figure past its bound whose entry names an ``open_regression`` is OPEN, not FAIL (a figure
    that could not be measured FAILs all the same).
    """
    ok = value is not None and math.isfinite(value) and not error
    if ok and value is not None:
        ok = value <= bound.limit if bound.direction == "max" else value >= bound.limit
    if value is None and not error:
        error = "not measured"
    return Result(
        name=bound.name,
        kind=bound.kind,
        status="PASS" if ok else ("OPEN" if bound.open_regression and not error else "FAIL"),
        value=value,
        bound=bound.bound,
        direction=bound.direction,
        tolerance=bound.tolerance,
        limit=bound.limit,
        command=bound.command,
        error=error,
        open_regression=bound.open_regression,
    )


def _num(x: float) -> str:
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.4g}"


def format_line(result: Result) -> str:
    """``PASS/FAIL name: figure vs bound (tolerance) -- command``; a FAIL also says the limit."""
    sign = "<=" if result.direction == "max" else ">="
    figure = "n/a" if result.value is None else _num(result.value)
    line = (
        f"{result.status} {result.name}: {figure} vs {sign} {_num(result.bound)} "
        f"(tolerance {_num(result.tolerance)}) -- {result.command}"
    )
    if result.status == "FAIL":
        why = result.error or f"past the limit {_num(result.limit)}"
        line += f"\n     {why}; reproduce: {REPRODUCE.format(name=result.name)}"
    elif result.status == "OPEN":
        line += (
            f"\n     past the limit {_num(result.limit)}: an open regression, "
            f"{result.open_regression}; reproduce: {REPRODUCE.format(name=result.name)}"
        )
    elif result.open_regression:
        line += "\n     back within its bound: remove `open_regression` from bounds.toml"
    return line


# ---------------------------------------------------------------------- the groups


def _benchmarks_importable() -> None:
    for path in (str(HERE), str(ROOT)):
        if path not in sys.path:
            sys.path.insert(0, path)


def _cache_memory() -> dict[str, float]:
    import cache

    figures = cache.quick_figures("memory")
    return {f"cache-small-pss-{w}w": figures[f"small_pss_{w}w"] for w in (2, 4)}


def _cache_timing() -> dict[str, float]:
    import cache

    figures = cache.quick_figures("timing")
    return {
        "cache-epoch2-speedup": figures["jpeg_speedup_0w"],
        "stream-epoch2-over-floor": figures["stream_over_floor"],
    }


def _wall_zoo() -> dict[str, float]:
    import wall_zoo

    recall = top1 = false = 0
    gaps: list[float] = []
    with tempfile.TemporaryDirectory(prefix="speedpack-bench-check-") as tmp:
        for case in WALL_CASES:
            # The clean runs at full scale, as their 0 was earned: at half scale the workers'
            # start-up is a fifth of a 1.7 s fit and the X-ray rightly sees the wait.
            scale = 1.0 if case.startswith("clean") else 0.5
            row = wall_zoo.run_case(case, scale, Path(tmp))
            verdict = wall_zoo.judge(row)
            recall += bool(verdict["recall"])
            top1 += bool(verdict["top1"])
            false += verdict["false"]
            gaps.append(math.inf if verdict["gap"] is None else verdict["gap"])  # no ledger
            # the warnings first: a FAIL shows these lines cut to OUTPUT_LINE_CHARS
            warned = [
                (f[1], " ".join(f[2].split())[:120])
                for f in row.get("findings", [])
                if f[0] != "info"
            ]
            found = warned if "error" not in row else row["error"][-300:]
            print(f"wall zoo {case}: {verdict} warnings {found}", file=sys.stderr, flush=True)
    return {
        "wall-zoo-recall": recall,
        "wall-zoo-top1": top1,
        "wall-zoo-false-warnings": false,
        "ledger-gap-pct": max(gaps),
    }


def _world_zoo() -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="speedpack-bench-check-") as tmp:
        out = Path(tmp) / "world.json"
        cmd = [sys.executable, str(HERE / "world_zoo.py"), "--quick", "--json", str(out)]
        proc = subprocess.run(cmd, check=False, cwd=ROOT)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"world_zoo.py --quick exited {proc.returncode}")
        data = json.loads(out.read_text())
    return {
        "world-zoo-recall": data["recall"][0],
        "world-zoo-false-warnings": data["false_warnings"],
    }


def _verdicts() -> dict[str, float]:
    import verdicts

    right = false = 0
    with tempfile.TemporaryDirectory(prefix="speedpack-bench-check-") as tmp:
        for case in verdicts.CASES:
            ok, wrong = verdicts.judge(verdicts.run_case(case, 320, 3, Path(tmp)))
            right += ok
            false += wrong
            print(f"verdict zoo {case}: right={ok} false={wrong}", file=sys.stderr, flush=True)
    return {"xray-verdicts-right": right, "xray-verdicts-false-warnings": false}


def _what_if() -> dict[str, float]:
    import what_if

    figures = what_if.quick_figures()
    out = {"whatif-applied-gain": figures["hand_timed"]}
    if "num_workers_gain" in figures:
        out["whatif-num-workers-gain"] = figures["num_workers_gain"]
        out["whatif-measured-vs-hand-timed"] = figures["measured_over_hand_timed"]
    if "cache_gain" in figures:
        out["whatif-cache-gain"] = figures["cache_gain"]
    return out


def _doctor_cost() -> dict[str, float]:
    import doctor_overhead

    figures = doctor_overhead.quick_figures()
    print(f"doctor cost: A/A {figures['a_a']:.3f}", file=sys.stderr, flush=True)
    return {"doctor-cost": figures["default"]}


def _doctor_lines() -> dict[str, float]:
    import doctor_lines

    return doctor_lines.quick_figures()


#: Rounds of world_cost.py: its ratio of the medians over 41 rounds read 1.032x-1.065x in nine
#: runs over three sessions (A/A 0.956x-1.001x), where 5 pairs of separate launches of one code
#: read 1.083x-1.467x.
WORLD_COST_ROUNDS = 41


def _world_cost() -> dict[str, float]:
    # The clean 2-rank job (16 epochs of 32 steps), plain, under the doctor and plain again,
    # alternated inside one launch of two ranks: the launches' own spread is left out.
    with tempfile.TemporaryDirectory(prefix="speedpack-bench-check-") as tmp:
        out = Path(tmp) / "world-cost.json"
        cmd = [sys.executable, str(HERE / "world_cost.py"), "--rounds", str(WORLD_COST_ROUNDS)]
        cmd += ["--json", str(out)]
        proc = subprocess.run(cmd, check=False, cwd=ROOT)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"world_cost.py exited {proc.returncode}")
        cost = json.loads(out.read_text())
    wall, cpu = cost["wall"], cost["cpu"]
    print(
        f"ddp doctor cost: loop {wall['doctor']['ratio']:.3f} (paired "
        f"{wall['doctor']['paired']:.3f}, A/A {wall['plain, again']['ratio']:.3f}), loop CPU time "
        f"{cpu['doctor']['ratio']:.3f} (A/A {cpu['plain, again']['ratio']:.3f})",
        file=sys.stderr,
        flush=True,
    )
    return {"ddp-doctor-loop-cost": wall["doctor"]["ratio"]}


#: group -> (the function measuring its figures, the figures it gives)
GROUPS: dict[str, tuple[Callable[[], dict[str, float]], tuple[str, ...]]] = {
    "cache-memory": (_cache_memory, ("cache-small-pss-2w", "cache-small-pss-4w")),
    "wall-zoo": (
        _wall_zoo,
        ("wall-zoo-recall", "wall-zoo-top1", "wall-zoo-false-warnings", "ledger-gap-pct"),
    ),
    "world-zoo": (_world_zoo, ("world-zoo-recall", "world-zoo-false-warnings")),
    "verdicts": (_verdicts, ("xray-verdicts-right", "xray-verdicts-false-warnings")),
    "cache-timing": (_cache_timing, ("cache-epoch2-speedup", "stream-epoch2-over-floor")),
    "what-if": (
        _what_if,
        (
            "whatif-applied-gain",
            "whatif-num-workers-gain",
            "whatif-cache-gain",
            "whatif-measured-vs-hand-timed",
        ),
    ),
    "doctor-cost": (_doctor_cost, ("doctor-cost",)),
    "doctor-lines": (_doctor_lines, ("doctor-lines-per-step",)),
    "world-cost": (_world_cost, ("ddp-doctor-loop-cost",)),
}
GROUP_OF = {figure: group for group, (_, figures) in GROUPS.items() for figure in figures}


def measure_group(group: str, out: Path) -> None:
    """Run one group in this process and write its figures to ``out`` (the child's side)."""
    _benchmarks_importable()
    os.chdir(ROOT)
    figures = GROUPS[group][0]()
    out.write_text(json.dumps(figures))


Measurer = Callable[[str], tuple[dict[str, float], str]]


def measure_in_child(group: str) -> tuple[dict[str, float], str]:
    """Run ``group`` in a fresh process: its figures, or an error (with the output's tail)."""
    with tempfile.TemporaryDirectory(prefix="speedpack-bench-check-") as tmp:
        out = Path(tmp) / "figures.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--measure", group, "--out", str(out)]
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, check=False, timeout=GROUP_TIMEOUT_S, cwd=ROOT
            )
        except subprocess.TimeoutExpired:
            return {}, f"group {group} timed out after {GROUP_TIMEOUT_S} s"
        GROUP_OUTPUT[group] = proc.stdout + proc.stderr
        if LOG_DIR is not None:
            LOG_DIR.mkdir(parents=True, exist_ok=True)
            (LOG_DIR / f"{group}.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0 or not out.exists():
            tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-6:])
            return {}, f"group {group} exited {proc.returncode}: {tail[-800:]}"
        return json.loads(out.read_text()), ""


def check(
    bounds: Sequence[Bound], measure: Measurer = measure_in_child, echo: bool = True
) -> tuple[list[Result], dict[str, float]]:
    """Measure every group the ``bounds`` need, once each; judge every figure."""
    results: list[Result] = []
    seconds: dict[str, float] = {}
    by_group: dict[str, list[Bound]] = {}
    for b in bounds:
        by_group.setdefault(GROUP_OF[b.name], []).append(b)
    for group, members in by_group.items():
        start = time.perf_counter()
        figures, error = measure(group)
        seconds[group] = time.perf_counter() - start
        if echo:
            print(f"({group}: {seconds[group]:.0f} s)", flush=True)
        judged = [judge(b, figures.get(b.name), error) for b in members]
        results += judged
        if echo:
            for result in judged:
                print(format_line(result), flush=True)
            if any(r.status == "FAIL" for r in judged) and GROUP_OUTPUT.get(group):
                print(output_tail(group, GROUP_OUTPUT[group]), flush=True)
    return results, seconds


def output_tail(group: str, output: str) -> str:
    """The last lines a failed group printed, indented under its FAIL lines (long ones cut)."""
    lines = [line for line in output.strip().splitlines() if line.strip()][-OUTPUT_LINES:]
    cut = [
        line if len(line) <= OUTPUT_LINE_CHARS else line[:OUTPUT_LINE_CHARS] + " ..."
        for line in lines
    ]
    return "\n".join(
        [f"     what {group} printed (last {len(cut)} lines):", *(f"     | {line}" for line in cut)]
    )


def select(bounds: Iterable[Bound], stable: bool, only: str) -> list[Bound]:
    """The bounds to check: ``--only`` names (figures or groups), then ``--stable`` kinds."""
    chosen = list(bounds)
    if only:
        names = {n.strip() for n in only.split(",") if n.strip()}
        known = {b.name for b in chosen} | set(GROUPS)
        unknown = sorted(names - known)
        if unknown:
            raise SystemExit(f"unknown figure(s) or group(s) {unknown}; see --list")
        chosen = [b for b in chosen if b.name in names or GROUP_OF[b.name] in names]
    if stable:
        chosen = [b for b in chosen if b.kind in STABLE_KINDS]
    return chosen


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--stable", action="store_true", help="memory and count figures only")
    parser.add_argument("--only", default="", help="comma-separated figure or group names")
    parser.add_argument("--list", action="store_true", help="list the figures and their bounds")
    parser.add_argument("--json", type=Path, help="write every figure's result here")
    parser.add_argument("--logs", type=Path, help="keep each group's own output in this folder")
    parser.add_argument("--bounds", type=Path, default=BOUNDS, help=argparse.SUPPRESS)
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # the child's side
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        measure_group(args.measure, args.out)
        return 0
    global LOG_DIR
    LOG_DIR = args.logs
    bounds = load_bounds(args.bounds)
    missing = sorted(b.name for b in bounds if b.name not in GROUP_OF)
    if missing:
        raise SystemExit(f"{args.bounds.name}: no group measures {missing}")
    chosen = select(bounds, args.stable, args.only)
    if args.list:
        for b in chosen:
            sign = "<=" if b.direction == "max" else ">="
            print(
                f"{b.name} [{b.kind}, {GROUP_OF[b.name]}]: {sign} {_num(b.bound)} "
                f"(tolerance {_num(b.tolerance)}) -- {b.command}"
            )
        return 0
    start = time.perf_counter()
    results, seconds = check(chosen, measure=measure_in_child)
    total = time.perf_counter() - start
    failed = [r for r in results if r.status == "FAIL"]
    passed = sum(r.status == "PASS" for r in results)
    print(
        f"\n{passed} of {len(results)} figures within their bounds "
        f"({total:.0f} s); bounds: {shlex.quote(str(args.bounds))}"
    )
    if failed:
        print("FAILED: " + ", ".join(r.name for r in failed))
    still_open = [r.name for r in results if r.status == "OPEN"]
    if still_open:
        print("OPEN regressions (past their bounds, issue open): " + ", ".join(still_open))
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "results": [asdict(r) for r in results],
                    "group_seconds": seconds,
                    "seconds": total,
                },
                indent=2,
            )
        )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
