"""GPU check ``world``: the doctor's per-rank report (issue 37) on DDP jobs that train on a GPU.

Each run is ``benchmarks/zoo/world_job.py --device cuda`` (the DDP zoo's MLP, batch 8, 2 epochs
of 32 batches a rank, one planted cause) unmodified under ``python -m lightning_speedpack doctor
--json``, started and judged by ``benchmarks/world_zoo.py`` as its own zoo does. The lines:

- ``world/nccl-one-rank``: one rank, ``strategy="ddp"`` on the GPU, so NCCL: the doctor's run
  ends (exit 0, a report), gives no ``world/`` or ``comm/`` warning on the clean job, and the comm
  figures read from DDP's own runtime statistics (timed by the reducer with CUDA events on a GPU)
  are there and coherent: ``0 <= comm_wait_fraction <= 1``, backward compute shorter than the
  step. The advisor's GPU rules (this fp32 MLP with 10 classes, from a pageable loader, draws
  ``precision``, ``layer-dims-multiple`` and ``pin-memory``) are not this check's: its figure
  lists them.
- ``world/gpu-straggler-data``, ``world/gpu-straggler-step``: two ``torchrun`` agents on this
  host (one rank each, both on ``cuda:0``, gloo: NCCL refuses two ranks of one communicator on
  one GPU); rank 1 sleeps 4 ms a sample in its dataset, or 30 ms in its ``training_step``. The
  first warning must be ``world/straggler`` naming rank 1 and its part (``data wait``, ``training
  step``): the CUDA step of rank 0, queued asynchronously, must not take the blame.
- ``world/gpu-clean``: the same two ranks with nothing planted: no ``world/`` or ``comm/``
  warning.

What this does not reach: NCCL between two ranks (needs two GPUs), so the pack's point-to-point
gather of each rank's figures has run over gloo only; one rank gathers nothing.

Exercised on the CPU (``--dry``): the one-rank job (gloo, its NCCL bound SKIP) and the data
straggler as two nodes; the step straggler and the clean pair are SKIP there (the CPU zoo,
``benchmarks/world_zoo.py``, covers them).
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.gpu.context import Context, emit, result

__all__ = ["NAME", "TIMEOUT_S", "run"]

NAME = "world"
TIMEOUT_S = {"gpu": 150.0, "dry": 150.0}

#: Seconds one case (both agents) may take before it is killed and counted as failed. On the
#: H200 (2026-11-27) a case took about 30 s: two processes importing torch and Lightning and
#: starting CUDA, then a fit of about 1 s.
CASE_TIMEOUT_S = {"gpu": 45.0, "dry": 60.0}
#: A case starts only while its whole timeout still fits this many seconds before TIMEOUT_S, so
#: the check returns its lines instead of being killed with a case half run.
MARGIN_S = 5.0
STRAGGLERS = {
    "world/gpu-straggler-data": ("two-nodes", "data wait"),
    "world/gpu-straggler-step": ("slow-step", "training step"),
}
#: The findings this check judges: the DDP ones (the advisor's GPU rules are other checks').
DDP_FINDINGS = ("world/", "comm/")


def _zoo() -> Any:
    """``benchmarks/world_zoo.py`` (a script with its own sys.path entry, not a package)."""
    here = str(Path(__file__).resolve().parents[1])
    if here not in sys.path:
        sys.path.insert(0, here)
    import world_zoo

    return world_zoo


def _find(data: Any, key: str) -> dict[str, Any] | None:
    """The first mapping under ``data`` that holds ``key``."""
    if isinstance(data, dict):
        if key in data:
            return data
        children: Any = data.values()
    elif isinstance(data, list):
        children = data
    else:
        return None
    for child in children:
        found = _find(child, key)
        if found is not None:
            return found
    return None


def _warnings(row: dict[str, Any]) -> str:
    return ", ".join(w["id"] for w in row.get("warnings", [])) or "none"


def _bound(check: str) -> str:
    """The bound ``check`` is held to (for its SKIP lines too)."""
    if check == "world/nccl-one-rank":
        return (
            "exit 0, a report, no world/ or comm/ warning; comm figures from DDP's statistics: "
            "0 <= comm_wait_fraction <= 1, backward compute < step"
        )
    if check == "world/gpu-clean":
        return "no world/ or comm/ warning"
    return f"first warning world/straggler: rank 1, part {STRAGGLERS[check][1]!r}"


def _ddp_warnings(row: dict[str, Any]) -> list[str]:
    return [w["id"] for w in row.get("warnings", []) if w["id"].startswith(DDP_FINDINGS)]


def _one_rank(ctx: Context, zoo: Any, tmp: Path, keep: Path, timeout: float) -> dict[str, Any]:
    check = "world/nccl-one-rank"
    bound = _bound(check)
    row = zoo.run_case("clean", tmp, keep, nodes=1, device=ctx.device, timeout=timeout)
    if "error" in row:
        return result(check, "FAIL", f"the doctor's run failed: {row['error'][-600:]}", bound)
    report = json.loads(Path(row["report"]).read_text())
    comm = _find(report, "comm_source") or _find(report, "comm_not_measured") or {}
    fraction = comm.get("comm_wait_fraction")
    backward = comm.get("backward_compute_ms")
    step_ms = comm.get("step_ms", (_find(report, "step_ms") or {}).get("step_ms"))
    coherent = (
        isinstance(fraction, (int, float))
        and 0.0 <= fraction <= 1.0
        and isinstance(backward, (int, float))
        and (not isinstance(step_ms, (int, float)) or backward < step_ms)
    )
    source = comm.get("comm_source") or comm.get("comm_not_measured")
    figure = (
        f"warnings: {_warnings(row)}; comm_wait_fraction {fraction}, backward compute "
        f"{backward} ms, step {step_ms} ms ({source}); fit {row.get('fit_s') or math.nan:.2f} s"
    )
    data = {"row": row, "comm": comm, "step_ms": step_ms}
    clean = not _ddp_warnings(row)
    if ctx.dry:
        status = "PASS" if clean else "FAIL"
        dry_bound = "exit 0, a report, no world/ or comm/ warning"
        return result(check, status, f"dry (gloo, CPU): {figure}", dry_bound, **data)
    status = "PASS" if clean and coherent else "FAIL"
    return result(check, status, f"NCCL: {figure}", bound, **data)


def _straggler(
    ctx: Context, zoo: Any, check: str, tmp: Path, keep: Path, timeout: float
) -> dict[str, Any]:
    case, part = STRAGGLERS[check]
    bound = _bound(check)
    row = zoo.run_case(case, tmp, keep, nodes=2, device=ctx.device, timeout=timeout)
    if "error" in row:
        return result(check, "FAIL", f"the doctor's run failed: {row['error'][-600:]}", bound)
    first = (row["warnings"] or [{}])[0]
    fig = first.get("figures") or {}
    ok = first.get("id") == "world/straggler" and fig.get("rank") == 1 and fig.get("part") == part
    ranks = "; ".join(
        f"rank {r['rank']} own {r.get('own_ms')} ms wait {r.get('wait_ms')} ms"
        for r in row.get("ranks", [])
    )
    figure = (
        f"first: {first.get('id', 'none')} rank {fig.get('rank')} part {fig.get('part')!r} "
        f"({_warnings(row)}); {ranks}"
    )
    return result(check, "PASS" if ok else "FAIL", figure, bound, row=row)


def _clean(ctx: Context, zoo: Any, tmp: Path, keep: Path, timeout: float) -> dict[str, Any]:
    check = "world/gpu-clean"
    row = zoo.run_case("clean", tmp, keep, nodes=2, device=ctx.device, timeout=timeout)
    if "error" in row:
        failed = f"the doctor's run failed: {row['error'][-600:]}"
        return result(check, "FAIL", failed, _bound(check))
    status = "PASS" if not _ddp_warnings(row) else "FAIL"
    return result(check, status, f"warnings: {_warnings(row)}", _bound(check), row=row)


def run(ctx: Context) -> list[dict[str, Any]]:
    """The doctor's world on GPU DDP jobs (see the module's docstring)."""
    zoo = _zoo()
    mode = "dry" if ctx.dry else "gpu"
    timeout = CASE_TIMEOUT_S[mode]
    deadline = TIMEOUT_S[mode] - MARGIN_S - timeout  # the last moment a case may start
    keep = ctx.out_dir  # each case's logs and report
    started = time.perf_counter()
    lines: list[dict[str, Any]] = []
    plan: list[str] = ["world/nccl-one-rank", "world/gpu-straggler-data"]
    if not ctx.dry:
        plan += ["world/gpu-straggler-step", "world/gpu-clean"]
    with tempfile.TemporaryDirectory(prefix="speedpack-gpu-world-") as name:
        tmp = Path(name)
        for check in plan:
            if time.perf_counter() - started > deadline:
                skipped = result(check, "SKIP", "not run: the check's time ran out", _bound(check))
                lines.append(emit(skipped))
                continue
            if check == "world/nccl-one-rank":
                line = _one_rank(ctx, zoo, tmp, keep, timeout)
            elif check == "world/gpu-clean":
                line = _clean(ctx, zoo, tmp, keep, timeout)
            else:
                line = _straggler(ctx, zoo, check, tmp, keep, timeout)
            lines.append(emit(line))
    if ctx.dry:
        for check in ("world/gpu-straggler-step", "world/gpu-clean"):
            reason = "dry: the CPU zoo (benchmarks/world_zoo.py) runs these; run on the GPU"
            lines.append(result(check, "SKIP", reason, _bound(check)))
    return lines
