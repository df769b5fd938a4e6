"""``make gpu-check``: the pack's CUDA paths measured on a real GPU, each against its own yardstick.

Usage::

    PYTHONPATH=. python3 benchmarks/gpu_check.py [--out DIR] [--dry] [--only NAME,...]
                                                  [--timeout-scale F] [--budget S]

Runs every ``benchmarks/gpu/check_*.py`` (the known ones in a fixed order, then the others by
name), each in a child process of its own (``benchmarks/gpu/child.py``) with a process group of
its own, killed as a group at the check's ``TIMEOUT_S``: a check that fails, hangs or crashes
the interpreter costs its own lines and never the rest. Prints a header (device, torch, CUDA,
driver and Lightning versions, dry or not), one line per result::

    PASS  throughput/samples_per_sec  1.21e5 samples/s vs 1.21e5 from CUDA events  (within 3%)

and a last line ``gpu-check: N passed, N failed, N skipped``; exits 1 when any line FAILs.

``DIR/gpu_check.json`` holds the header, every check's results (status, figure, bound, raw
data), duration, timeout, exit code and the last lines of its output; it is rewritten after
each check, so a run killed half-way leaves what was done. A check killed at its timeout keeps
the lines it had already handed over (``benchmarks.gpu.context.emit``).
``DIR/gpu_check.log`` holds everything the children printed. Each check writes its own files
under ``DIR/<check>/``.

Needs no venv and no install: the repository (``PYTHONPATH=.``) and the machine's own torch,
Lightning, nvidia-ml-py. Without CUDA (or with ``--dry``) every check runs on the CPU at toy
sizes, GPU-only bounds reported as SKIP with the reason: how CI exercises this script
(``tests/benchmarks/test_gpu_check.py``).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CHECKS_DIR = ROOT / "benchmarks" / "gpu"
CHILD = CHECKS_DIR / "child.py"
#: The environment variable naming the file a check's emitted lines go to (``context.emit``).
PARTIAL_ENV = "GPU_CHECK_PARTIAL"
#: The checks whose order is fixed; any other ``check_*.py`` runs after them, by name. The
#: budget cuts the last ones first: ``cache`` and ``what_if``, which passed on the H200
#: (2026-11-27), come after ``world`` and ``doctor``, whose lines were left unfinished there.
ORDER = (
    "tests", "syncs", "throughput", "copy", "oom", "nvtx", "world", "doctor", "cache", "what_if"
)  # fmt: skip
#: A check whose module gives no literal ``TIMEOUT_S`` gets these.
DEFAULT_TIMEOUT_S = {"gpu": 60.0, "dry": 120.0}
#: Seconds the whole run may take on a GPU unless ``--budget`` says otherwise (the lent machine
#: gives a command 10 minutes; this leaves time for the start and the copy back).
GPU_BUDGET_S = 480.0
#: How long before its timeout a hung check dumps every thread's stack into the log.
DUMP_BEFORE_S = 3.0
TAIL_LINES = 40


@dataclass
class Check:
    """A check module found on disk, and what its run gave."""

    name: str
    path: Path
    timeout_s: float
    timeout_note: str = ""
    results: list[dict[str, Any]] = field(default_factory=list)
    outcome: str = "not run"  # ok | failed | timeout | crash | not run
    exit_code: int | None = None
    duration_s: float | None = None
    tail: str = ""

    def record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "module": str(self.path),
            "timeout_s": self.timeout_s,
            "timeout_note": self.timeout_note,
            "outcome": self.outcome,
            "exit_code": self.exit_code,
            "duration_s": None if self.duration_s is None else round(self.duration_s, 2),
            "results": self.results,
            "tail": self.tail,
        }


def _literal(tree: ast.Module, name: str) -> Any:
    for node in tree.body:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        if value is not None and any(isinstance(t, ast.Name) and t.id == name for t in targets):
            try:
                return ast.literal_eval(value)
            except ValueError:
                return None
    return None


def discover(directory: Path, mode: str, scale: float) -> list[Check]:
    """Every ``check_*.py`` in ``directory``: known names in :data:`ORDER`, then by name.

    ``NAME`` and ``TIMEOUT_S`` are read from the source (``ast``), so the runner never imports
    a check (nor torch): a module without a literal ``TIMEOUT_S`` gets :data:`DEFAULT_TIMEOUT_S`.
    """
    found: list[Check] = []
    for path in sorted(directory.glob("check_*.py")):
        stem_name = path.stem.removeprefix("check_")
        try:
            tree = ast.parse(path.read_text(), filename=str(path))
        except SyntaxError:
            tree = ast.Module(body=[], type_ignores=[])
        name = _literal(tree, "NAME")
        timeouts = _literal(tree, "TIMEOUT_S")
        note = ""
        if isinstance(timeouts, dict) and isinstance(timeouts.get(mode), (int, float)):
            timeout = float(timeouts[mode])
        else:
            timeout = DEFAULT_TIMEOUT_S[mode]
            note = f"no literal TIMEOUT_S[{mode!r}] in the module: the runner's default"
        found.append(
            Check(
                name=name if isinstance(name, str) else stem_name,
                path=path,
                timeout_s=round(timeout * scale, 1),
                timeout_note=note,
            )
        )
    rank = {name: i for i, name in enumerate(ORDER)}
    return sorted(found, key=lambda c: (rank.get(c.name, len(ORDER)), c.name))


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"  # the log keeps up with a check that is killed later
    env.setdefault("PYTHONFAULTHANDLER", "1")
    return env


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's process group (its DataLoader workers, its pytest, ...)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def run_child(
    args: Sequence[str], log_path: Path, timeout_s: float, extra_env: dict[str, str] | None = None
) -> tuple[int | None, bool, float]:
    """Run ``child.py ARGS`` in a session of its own, output appended to ``log_path``.

    Returns ``(exit code, timed out, seconds)``; the whole group is killed at ``timeout_s`` and,
    after a normal exit, whatever the child left behind is killed too.
    """
    start = time.perf_counter()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, str(CHILD), *args],
            cwd=ROOT,
            env={**_child_env(), "GPU_CHECK_TIMEOUT_S": f"{timeout_s:g}", **(extra_env or {})},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        timed_out = False
        try:
            code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            code = proc.wait()
        except BaseException:  # Ctrl-C: take the check down with us
            _kill_group(proc)
            proc.wait()
            raise
        _kill_group(proc)  # leftovers of a check that exited
    return code, timed_out, time.perf_counter() - start


def _tail(log_path: Path, offset: int, lines: int = TAIL_LINES) -> str:
    with open(log_path, "rb") as log:
        log.seek(offset)
        text = log.read().decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def run_one(check: Check, ctx: dict[str, Any], out: Path, log_path: Path) -> None:
    """Run ``check`` in its child; fill in its results, or one FAIL line saying what went wrong."""
    result_path = out / f".{check.name}.result.json"
    partial_path = out / f".{check.name}.partial.jsonl"
    result_path.unlink(missing_ok=True)
    partial_path.unlink(missing_ok=True)
    with open(log_path, "ab") as log:
        log.write(
            f"\n===== {check.name} ({check.path.name}, timeout {check.timeout_s:g} s)"
            " =====\n".encode()
        )
        offset = log.tell()
    args = [
        "run",
        str(check.path),
        json.dumps({**ctx, "out": str(out / check.name)}),
        str(result_path),
        "--dump-after",
        str(max(check.timeout_s - DUMP_BEFORE_S, check.timeout_s * 0.8)),
    ]
    code, timed_out, seconds = run_child(
        args, log_path, check.timeout_s, {PARTIAL_ENV: str(partial_path)}
    )
    check.exit_code, check.duration_s = code, seconds
    check.tail = _tail(log_path, offset)
    payload: dict[str, Any] | None = None
    if not timed_out and result_path.exists():
        try:
            payload = json.loads(result_path.read_text())
        except json.JSONDecodeError:
            payload = None
    partial = read_partial(partial_path)
    if timed_out:
        check.outcome = "timeout"
        check.results = [
            *partial,
            _runner_fail(check, f"timed out after {check.timeout_s:g} s (process group killed)"),
        ]
    elif payload is None or not isinstance(payload.get("results"), list):
        check.outcome = "crash"
        check.results = [
            *partial,
            _runner_fail(check, f"crashed: {_describe_exit(code)}, no results written"),
        ]
    else:
        check.outcome = "ok" if code == 0 else "failed"
        check.results = payload["results"]
    result_path.unlink(missing_ok=True)
    partial_path.unlink(missing_ok=True)


def read_partial(path: Path) -> list[dict[str, Any]]:
    """The well-formed lines a check emitted before it was killed (``context.emit``), in order."""
    if not path.exists():
        return []
    found: list[dict[str, Any]] = []
    for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            entry = json.loads(raw)
        except json.JSONDecodeError:
            continue  # the line being written when the kill came
        if (
            isinstance(entry, dict)
            and entry.get("status") in ("PASS", "FAIL", "SKIP")
            and all(isinstance(entry.get(k), str) for k in ("check", "figure", "bound"))
        ):
            found.append({**entry, "data": entry.get("data") or {}})
    return found


def _runner_fail(check: Check, figure: str) -> dict[str, Any]:
    return {
        "check": check.name,
        "status": "FAIL",
        "figure": figure,
        "bound": f"finishes within {check.timeout_s:g} s",
        "data": {},
    }


def _child_module() -> Any:
    """``child.py`` imported by path (its ``versions()`` reads no torch)."""
    spec = importlib.util.spec_from_file_location("gpu_check_child", CHILD)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {CHILD}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def header(forced_dry: bool, out: Path, log_path: Path) -> dict[str, Any]:
    """The run's facts: from a probe child unless dry (CUDA never starts in this process)."""
    info: dict[str, Any] = {**_child_module().versions(), "cuda_available": None}
    if not forced_dry:
        probe_path = out / ".probe.json"
        probe_path.unlink(missing_ok=True)
        with open(log_path, "ab") as log:
            log.write(b"\n===== probe (device and versions) =====\n")
        code, timed_out, _ = run_child(["probe", str(probe_path)], log_path, 120.0)
        if code == 0 and probe_path.exists():
            info.update(json.loads(probe_path.read_text()))
            probe_path.unlink()
        else:
            info["probe_error"] = "timed out" if timed_out else _describe_exit(code)
    info["dry"] = forced_dry or not info.get("cuda_available")
    return info


def _header_lines(info: dict[str, Any], forced_dry: bool) -> list[str]:
    lines = []
    if info["dry"] and not forced_dry:
        why = info.get("probe_error") or "torch.cuda.is_available() is False"
        lines.append(f"gpu-check: no CUDA device ({why}): running dry (CPU, toy sizes)")
    elif info["dry"]:
        lines.append("gpu-check: --dry: running dry (CPU, toy sizes); GPU bounds are SKIP")
    else:
        lines.append(
            f"gpu-check: GPU run (not dry) on {info.get('device')} ({info.get('memory_gib')} GiB, "
            f"sm {info.get('capability')}; {info.get('device_count')} visible)"
        )
    lines.append(
        f"  torch {info.get('torch')}  CUDA {info.get('cuda_build') or '-'}  "
        f"cuDNN {info.get('cudnn') or '-'}  driver {info.get('driver') or '-'}  "
        f"pytorch-lightning {info.get('pytorch_lightning')}  lightning "
        f"{info.get('lightning') or '-'}  Python {info.get('python')}"
    )
    return lines


def format_line(entry: dict[str, Any]) -> str:
    """``PASS  check  figure  (bound)``."""
    return f"{entry['status']:<4}  {entry['check']:<30}  {entry['figure']}  ({entry['bound']})"


def summary(checks: Sequence[Check]) -> dict[str, int]:
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    key = {"PASS": "passed", "FAIL": "failed", "SKIP": "skipped"}
    for check in checks:
        for entry in check.results:
            counts[key[entry["status"]]] += 1
    return counts


def write_report(
    path: Path, info: dict[str, Any], checks: Sequence[Check], started: float, finished: bool
) -> None:
    payload = {
        "header": info,
        "dry": info["dry"],
        "finished": finished,
        "wall_s": round(time.perf_counter() - started, 1),
        "timeouts_total_s": round(sum(c.timeout_s for c in checks), 1),
        "summary": summary(checks),
        "checks": [c.record() for c in checks],
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu-check-output"))
    parser.add_argument("--dry", action="store_true", help="CPU and toy sizes, even with CUDA")
    parser.add_argument("--only", default="", help="comma-separated check names")
    parser.add_argument("--timeout-scale", type=float, default=1.0, help="scales every timeout")
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help=f"seconds for the whole run (default {GPU_BUDGET_S:g} on a GPU, none dry): a "
        "check gets at most what is left, and one that cannot start is a FAIL line",
    )
    parser.add_argument("--checks-dir", type=Path, default=CHECKS_DIR, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "gpu_check.log"
    log_path.write_bytes(b"")
    json_path = out / "gpu_check.json"

    info = header(args.dry, out, log_path)
    dry = bool(info["dry"])
    for line in _header_lines(info, args.dry):
        print(line, flush=True)
    mode = "dry" if dry else "gpu"
    checks = discover(args.checks_dir, mode, args.timeout_scale)
    wanted = [n for n in args.only.split(",") if n]
    if wanted:
        unknown = sorted(set(wanted) - {c.name for c in checks})
        if unknown:
            print(
                f"gpu-check: unknown check(s) {', '.join(unknown)}; found "
                f"{', '.join(c.name for c in checks)}",
                file=sys.stderr,
            )
            return 2
        checks = [c for c in checks if c.name in wanted]
    budget = args.budget if args.budget is not None else (None if dry else GPU_BUDGET_S)
    print(
        f"  checks: {', '.join(c.name for c in checks)}; timeouts sum to "
        f"{sum(c.timeout_s for c in checks):g} s"
        + (f" (budget {budget:g} s)" if budget is not None else ""),
        flush=True,
    )
    info["checks_dir"] = str(args.checks_dir)
    info["budget_s"] = budget
    ctx = {"device": "cpu" if dry else "cuda", "dry": dry}
    write_report(json_path, info, checks, started, finished=False)
    for check in checks:
        left = None if budget is None else budget - (time.perf_counter() - started)
        if left is not None and left < min(check.timeout_s, 20.0):
            check.outcome = "not run"
            check.results = [
                {
                    "check": check.name,
                    "status": "FAIL",
                    "figure": f"not run: {max(left, 0):.0f} s left of the {budget:g} s budget",
                    "bound": "every check runs",
                    "data": {},
                }
            ]
        else:
            if left is not None and left < check.timeout_s:
                check.timeout_note = f"cut from {check.timeout_s:g} s to the budget left"
                check.timeout_s = round(left, 1)
            run_one(check, ctx, out, log_path)
        for entry in check.results:
            print(format_line(entry), flush=True)
        write_report(json_path, info, checks, started, finished=False)
    write_report(json_path, info, checks, started, finished=True)
    counts = summary(checks)
    print(
        f"gpu-check: wall {time.perf_counter() - started:.0f} s; results in {json_path}, "
        f"children's output in {log_path}",
        flush=True,
    )
    print(
        f"gpu-check: {counts['passed']} passed, {counts['failed']} failed, "
        f"{counts['skipped']} skipped",
        flush=True,
    )
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
