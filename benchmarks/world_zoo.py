"""The DDP zoo: planted slow or uneven 2-rank runs under ``speedpack doctor`` vs their cause.

Each case of ``benchmarks/zoo/world_job.py`` is a 2-rank DDP fit (gloo, CPU, an MLP of about
1 ms a step, batch 8, 2 epochs) with one cause planted: a slow rank (its data, its step, on
another node), a slow rank that moves between epochs, uneven ranks, communication it does not
need, a model whose gradient all-reduce outweighs its compute (``comm-bound``), or a host
that keeps one rank off the CPU (``busy-host``: expected as an info, with no warning; in
``busy-host-moving`` its load moves between the ranks' cores each epoch: no warning), or a rank
that keeps pace but stalls 150 ms in 4 of its 64 batches (``stalls``; ``stalls-callback``: in a
callback of the user's on rank 0), or whose callback is slow in every batch on rank 0
(``slow-callback``: the others wait for it before their fetch). Each runs
unmodified under ``speedpack doctor --json`` in a fresh process (the two-node
case as two ``torchrun`` agents on this host, the doctor as each one's entry). A planted case is
*recalled* when the expected ``component/id`` is among the warnings and errors, *top-1* when it
is the first of them in the order the report shows; a straggler or stalls case is *named* right
when its finding names the planted rank (and node) and the planted part (for the moving case:
that the slowest rank changes between epochs). A clean run must get no warning or error at all.

The doctor's cost: the clean job plain, under the doctor and plain again, alternating, for
``--pairs`` rounds (default 5; 0 with ``--quick``), each timing its own ``trainer.fit`` and
training loop on rank 0 (wall and CPU seconds); the ratio of the medians, with the spread of the
pairs' ratios, and the A/A ratio (the plain job again over the plain job: the measurement's own
noise).

    python benchmarks/world_zoo.py [--quick] [--cases a,b] [--pairs N] [--keep DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import print_table

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
JOB = HERE / "zoo" / "world_job.py"
TIMEOUT_S = 300
TOKEN = "WORLD_ZOO_TOKEN"  # in every process a case starts, so a timeout can end them all


@dataclass(frozen=True)
class Case:
    expected: str | None  # the component/id expected first; None: clean, no warning at all
    rank: int | None = None  # a straggler case: the rank it must name
    node: int | None = None  # ... and the node
    part: str | None = None  # ... and the part ("data wait", "training step")
    moving: bool = False  # ... or that the slowest rank changes between epochs
    nodes: int = 1  # 2: two torchrun agents on this host
    info: bool = False  # the expected finding is an info: no warning or error may come


CASES: dict[str, Case] = {
    "slow-data": Case("world/straggler", rank=1, part="data wait"),
    "slow-step": Case("world/straggler", rank=1, part="training step"),
    "find-unused": Case("comm/find-unused-parameters"),
    "sync-dist-step": Case("comm/sync-dist-every-step"),
    "moving-data": Case("world/straggler", moving=True),
    "big-batch": Case("world/rank-imbalance"),
    "uneven-batches": Case("world/rank-imbalance"),
    "two-nodes": Case("world/straggler", rank=1, node=1, part="data wait", nodes=2),
    "comm-bound": Case("comm/comm-bound"),
    "busy-host": Case("world/straggler", rank=1, part="wait for a CPU", info=True),
    # The neighbours move between the ranks' cores each epoch: no warning (not "the data").
    "busy-host-moving": Case(None),
    "stalls": Case("world/stalls", rank=1, part="training step"),
    "stalls-callback": Case("world/stalls", rank=0, part="callbacks"),
    "slow-callback": Case("world/straggler", rank=0, part="callbacks"),
    "same-stream": Case("world/same-batches"),
    "clean": Case(None),
    "clean-sync-epoch": Case(None),
}
QUICK = ("slow-data", "find-unused", "sync-dist-step", "stalls", "clean")


def _env(token: str) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",  # 2 ranks on 2 cores
        TOKEN: token,
    }
    for variable in ("LIGHTNING_SPEEDPACK_NODE_ID", "NODE_RANK", "SLURM_NODEID", "GROUP_RANK"):
        env.pop(variable, None)  # the node comes from torchrun alone
    for variable in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(variable, None)
    return env


def _kill_token(token: str) -> None:
    """SIGKILL every process whose environment carries ``token``.

    ``torchrun`` starts its ranks in sessions of their own, out of reach of ``killpg``.
    """
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil comes with the dev extra
        return
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get(TOKEN) == token:
                proc.kill()
        except (psutil.Error, OSError):
            continue


def run_together(cmds: list[list[str]], timeout: float) -> list[tuple[int, str, str]]:
    """Run ``cmds`` at once, each in a session of its own; on timeout end all they started."""
    token = uuid.uuid4().hex
    env = _env(token)
    procs = [
        subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )
        for cmd in cmds
    ]
    deadline = time.monotonic() + timeout
    out: list[tuple[int, str, str]] = []
    try:
        for proc in procs:
            try:
                stdout, stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
                out.append((proc.returncode, stdout, stderr))
            except subprocess.TimeoutExpired:
                for other in procs:
                    with contextlib.suppress(OSError):
                        os.killpg(other.pid, signal.SIGKILL)
                _kill_token(token)
                stdout, stderr = proc.communicate()
                out.append((-1, stdout, f"timed out after {timeout:.0f} s\n{stderr}"))
        while len(out) < len(procs):  # the others, after a timeout
            stdout, stderr = procs[len(out)].communicate()
            out.append((-1, stdout, stderr))
    finally:
        _kill_token(token)  # nothing a case started outlives it
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _doctor(report: Path) -> list[str]:
    return [
        "-m",
        "lightning_speedpack",
        "doctor",
        "--quiet",
        "--layout",
        "log",
        "--json",
        str(report),
    ]


def _job(
    case: str, root: Path, wall_out: Path, device: str = "cpu", nodes: int | None = None
) -> list[str]:
    job = [str(JOB), "--case", case, "--root", str(root), "--wall-out", str(wall_out)]
    if device != "cpu":
        job += ["--device", device]
    return job + ([] if nodes is None else ["--nodes", str(nodes)])


def commands(
    case: str, tmp: Path, *, nodes: int | None = None, device: str = "cpu"
) -> tuple[list[list[str]], Path, Path]:
    """The commands of ``case`` under the doctor, rank 0's report and its fit seconds.

    ``nodes``, when given, runs it as that many nodes of one rank each (1: one rank alone; more:
    as many ``torchrun`` agents on this host); ``device="cuda"`` trains on the GPU
    (``world_job.py --device``).
    """
    name = case if (device, nodes) == ("cpu", None) else f"{case}-{device}-{nodes}n"
    report, wall_out, root = tmp / f"{name}.json", tmp / f"{name}.wall.json", tmp / name
    for stale in (report, wall_out):
        stale.unlink(missing_ok=True)
    job = _job(case, root, wall_out, device, nodes)
    nodes = CASES[case].nodes if nodes is None else nodes
    if nodes == 1:
        return [[sys.executable, *_doctor(report), *job]], report, wall_out
    port = _free_port()
    cmds = []
    for node in range(nodes):
        node_report = report if node == 0 else tmp / f"{name}.node{node}.json"
        torchrun = [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(nodes), "--nproc-per-node", "1",
            "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port),
        ]  # fmt: skip
        cmds.append([*torchrun, *_doctor(node_report), *job])
    return cmds, report, wall_out


def run_case(
    case: str,
    tmp: Path,
    keep: Path | None,
    *,
    nodes: int | None = None,
    device: str = "cpu",
    timeout: float = TIMEOUT_S,
) -> dict[str, Any]:
    """Run ``case`` under the doctor: its warnings in the report's order and its world."""
    from lightning_speedpack.core.findings import findings_from_dicts
    from lightning_speedpack.doctor.grouping import presented

    cmds, report, wall_out = commands(case, tmp, nodes=nodes, device=device)
    start = time.perf_counter()
    finished = run_together(cmds, timeout)
    seconds = time.perf_counter() - start
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        for node, (_, stdout, stderr) in enumerate(finished):
            (keep / f"{case}.{node}.log").write_text(stdout[-20000:] + stderr[-40000:])
        if report.exists():
            (keep / report.name).write_text(report.read_text())
    failed = [(code, err) for code, _, err in finished if code != 0]
    if failed or not report.exists():
        code, err = failed[0] if failed else (0, "no report written")
        start_at = err.find("Traceback")
        return {"case": case, "error": f"exit {code}: {err[max(0, start_at) :][-1500:]}"}
    data = json.loads(report.read_text())
    shown = presented(findings_from_dicts(data["findings"]))
    warnings = [f for f in shown if f.severity in ("warning", "error")]
    infos = [f for f in shown if f.severity == "info" and f.component == "world"]
    world = ((data.get("runs") or [{}])[-1].get("figures") or {}).get("world") or {}
    fit_s = json.loads(wall_out.read_text())["fit_s"] if wall_out.exists() else None
    return {
        "case": case,
        "warnings": [
            {
                "id": f"{f.component}/{f.id}",
                "severity": f.severity,
                "message": f.message,
                "figures": dict(f.figures or {}),
            }
            for f in warnings
        ],
        "infos": [
            {"id": f"{f.component}/{f.id}", "message": f.message, "figures": dict(f.figures or {})}
            for f in infos
        ],
        "ranks": [
            {k: r.get(k) for k in ("rank", "node", "batches", "samples", "own_ms", "wait_ms")}
            for r in world.get("ranks", [])
        ],
        "fit_s": fit_s,
        "seconds": seconds,
        "report": str(report),
    }


def judge(row: dict[str, Any]) -> dict[str, Any]:
    """Recall, top-1, named right (straggler cases) and false warnings of one row."""
    case = CASES[row["case"]]
    if "error" in row:
        miss = None if case.expected is None else False
        return {"recall": miss, "top1": miss, "named": miss, "false": 0}
    ids = [w["id"] for w in row["warnings"]]
    if case.expected is None:
        return {"recall": None, "top1": None, "named": None, "false": len(ids)}
    found = row.get("infos", []) if case.info else row["warnings"]
    named = None
    if case.expected in ("world/straggler", "world/stalls"):
        hit = next((w for w in found if w["id"] == case.expected), None)
        fig = hit["figures"] if hit else {}
        if case.moving:
            named = bool(fig.get("slowest_by_epoch"))
        else:
            named = (
                hit is not None
                and not fig.get("slowest_by_epoch")
                and fig.get("rank") == case.rank
                and (case.node is None or fig.get("node") == case.node)
                and fig.get("part") == case.part
            )
    if case.info:  # an info for the host: recalled as an info, and not one warning
        recalled = any(w["id"] == case.expected for w in found)
        return {"recall": recalled, "top1": recalled and not ids, "named": named, "false": len(ids)}
    return {
        "recall": case.expected in ids,
        "top1": bool(ids) and ids[0] == case.expected,
        "named": named,
        "false": 0,
    }


def _yes(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "**NO**")


def _named_what(row: dict[str, Any]) -> str:
    found = [*row.get("warnings", []), *row.get("infos", [])]
    hit = next((w for w in found if w["id"] in ("world/straggler", "world/stalls")), None)
    if hit is None:
        return "-"
    fig = hit["figures"]
    if fig.get("slowest_by_epoch"):
        return "moves: " + ", ".join(f"e{e}: r{r}" for e, r in fig["slowest_by_epoch"])
    return f"rank {fig.get('rank')}, node {fig.get('node')}, {fig.get('part')}"


def zoo(cases: list[str], keep: Path | None) -> dict[str, Any]:
    rows: list[list[Any]] = []
    details: list[list[Any]] = []
    results = []
    planted = recall = top1 = named_n = named_ok = false_total = 0
    with tempfile.TemporaryDirectory(prefix="speedpack-world-zoo-") as tmp:
        for name in cases:
            row = run_case(name, Path(tmp), keep)
            verdict = judge(row)
            results.append({**row, **verdict})
            case = CASES[name]
            if case.expected is not None:
                planted += 1
                recall += bool(verdict["recall"])
                top1 += bool(verdict["top1"])
            if verdict["named"] is not None:
                named_n += 1
                named_ok += bool(verdict["named"])
            false_total += verdict["false"]
            ids = [w["id"] for w in row.get("warnings", [])]
            print(
                f"{name}: {ids if 'error' not in row else row['error'][-300:]} "
                f"({row.get('seconds', 0):.0f} s)",
                file=sys.stderr,
                flush=True,
            )
            ranks = row.get("ranks") or []
            rows.append(
                [
                    name,
                    case.expected or "(clean)",
                    ", ".join(ids) or ("error" if "error" in row else "-"),
                    _yes(verdict["recall"]),
                    _yes(verdict["top1"]),
                    _yes(verdict["named"]) if verdict["named"] is not None else "-",
                    _named_what(row),
                    verdict["false"] if case.expected is None else "-",
                    " / ".join(f"{r['batches']}" for r in ranks) or "-",
                    " / ".join(f"{(r['own_ms'] or 0):.1f}" for r in ranks) or "-",
                    "-" if row.get("fit_s") is None else f"{row['fit_s']:.1f}",
                ]
            )
            if "error" in row:
                details.append([name, "error", " ".join(row["error"][-600:].split())])
            for w in row.get("warnings", []):
                text = " ".join(w["message"].replace("|", "/").split())
                details.append([name, f"{w['severity']}: {w['id']}", text])
    print_table(
        f"DDP zoo (`speedpack doctor`, 2 ranks, gloo on the CPU): recall {recall}/{planted}, "
        f"top-1 {top1}/{planted}, straggler named right {named_ok}/{named_n}, "
        f"{false_total} false warnings on clean runs",
        [
            "case",
            "expected first",
            "warnings and errors (in order)",
            "recall",
            "top-1",
            "named",
            "straggler as named",
            "false",
            "batches r0 / r1",
            "own ms r0 / r1",
            "fit s",
        ],
        rows,
    )
    print_table("Every warning and error, per case", ["case", "finding", "message"], details)
    return {
        "rows": results,
        "recall": [recall, planted],
        "top1": [top1, planted],
        "named": [named_ok, named_n],
        "false_warnings": false_total,
    }


#: The cost's variants: the plain job a second time is the measurement's own noise (A/A).
_VARIANTS = ("plain", "doctor", "plain, again")


def overhead(pairs: int, epochs: int = 2) -> dict[str, Any]:
    """The clean job's fit and training-loop seconds: plain, under the doctor, plain again.

    The three alternate (each round starts with the next of them); ``ratio`` is the doctor's
    median over the plain one's, ``a_a`` the second plain one's over the first.
    """
    os.environ["WORLD_JOB_EPOCHS"] = str(epochs)  # read by the job, in the child processes
    keys = ("fit_s", "train_s", "train_cpu_s")
    fits: dict[str, dict[str, list[float]]] = {v: {k: [] for k in keys} for v in _VARIANTS}
    with tempfile.TemporaryDirectory(prefix="speedpack-world-cost-") as tmp:
        for i in range(pairs):
            for variant in _VARIANTS[i % 3 :] + _VARIANTS[: i % 3]:
                for key, value in _timed_job(variant, Path(tmp)).items():
                    fits[variant][key].append(value)
            print(
                f"overhead round {i + 1}: "
                + ", ".join(
                    f"{v} {fits[v]['fit_s'][-1]:.2f} s (loop {fits[v]['train_s'][-1]:.2f})"
                    for v in _VARIANTS
                ),
                file=sys.stderr,
                flush=True,
            )
    rows, out = [], {}
    labelled = (
        ("fit_s", "`trainer.fit` (with rank 1's start)"),
        ("train_s", "loop"),
        ("train_cpu_s", "loop, CPU time of rank 0's process"),
    )
    for key, label in labelled:
        plain, doctor, again = (statistics.median(fits[v][key]) for v in _VARIANTS)
        pair = sorted(d / p for d, p in zip(fits["doctor"][key], fits["plain"][key], strict=True))
        out[key] = {"ratio": doctor / plain, "a_a": again / plain, "pair_ratios": pair}
        rows.append(
            [
                label,
                f"{plain:.2f}",
                f"{doctor:.2f}",
                f"**{doctor / plain:.3f}x**",
                f"{again / plain:.3f}x",
                f"{pair[0]:.2f}-{pair[-1]:.2f}x (median {statistics.median(pair):.2f}x)",
                ", ".join(f"{s:.2f}" for s in fits["plain"][key]),
                ", ".join(f"{s:.2f}" for s in fits["doctor"][key]),
            ]
        )
    print_table(
        f"The doctor's cost on the clean 2-rank job: {pairs} alternating rounds, ratio of the "
        f"medians (bound 1.05x); A/A: the plain job again over the plain job",
        [
            "seconds of",
            "plain median",
            "doctor median",
            "ratio",
            "A/A",
            "pairs' ratios",
            "plain",
            "doctor",
        ],
        rows,
    )
    return {**out, "seconds": fits}


def _timed_job(variant: str, tmp: Path) -> dict[str, float]:
    # One launch of the clean job (under the doctor for "doctor"): rank 0's clocks.
    wall_out = tmp / "wall.json"
    wall_out.unlink(missing_ok=True)
    job = _job("clean", tmp / variant.replace(", ", "-"), wall_out)
    lead = _doctor(tmp / "report.json") if variant == "doctor" else []
    ((code, _, err),) = run_together([[sys.executable, *lead, *job]], TIMEOUT_S)
    if code != 0 or not wall_out.exists():
        raise SystemExit(f"overhead: {variant} failed (exit {code}):\n{err[-2000:]}")
    measured = json.loads(wall_out.read_text())
    return {key: float(measured[key]) for key in ("fit_s", "train_s", "train_cpu_s")}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--pairs", type=int, help="overhead pairs (default 5; 0 with --quick)")
    parser.add_argument(
        "--cost-epochs", type=int, default=2, help="epochs of the clean job the cost is read on"
    )
    parser.add_argument("--keep", type=Path, help="copy each case's report and output here")
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    args = parser.parse_args()
    cases = [c for c in args.cases.split(",") if c] or list(QUICK if args.quick else CASES)
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; known: {', '.join(CASES)}")
    pairs = args.pairs if args.pairs is not None else (0 if args.quick else 5)
    start = time.perf_counter()
    result = zoo(cases, args.keep)
    if pairs > 0:
        result["overhead"] = overhead(pairs, args.cost_epochs)
    print(f"\n(world_zoo: {time.perf_counter() - start:.0f} s)")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
