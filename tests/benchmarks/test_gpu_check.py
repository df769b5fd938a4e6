"""``benchmarks/gpu_check.py`` (``make gpu-check``): the runner's isolation, and a whole dry run.

The dry run is what CI can do without a GPU: every check at toy sizes on the CPU, GPU-only
bounds reported as SKIP. The isolation test points the runner at fake checks that hang, crash the
interpreter and raise, and shows each costs its own line only.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers.procs import run_in_session

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"

FAKES = {
    "check_ok.py": """
NAME = "ok"
TIMEOUT_S = {"gpu": 30.0, "dry": 30.0}

def run(ctx):
    return [{"check": "ok/one", "status": "PASS", "figure": "1 of 1", "bound": "all", "data": {}}]
""",
    "check_hang.py": """
import subprocess, time
from pathlib import Path

NAME = "hang"
TIMEOUT_S = {"gpu": 3.0, "dry": 3.0}

from benchmarks.gpu.context import emit

def run(ctx):
    emit({"check": "hang/before", "status": "PASS", "figure": "made", "bound": "kept", "data": {}})
    child = subprocess.Popen(["sleep", "300"])
    (ctx.out_dir / "grandchild.pid").write_text(str(child.pid))
    print("hanging now", flush=True)
    time.sleep(600)
    return []
""",
    "check_crash.py": """
import ctypes

NAME = "crash"
TIMEOUT_S = {"gpu": 30.0, "dry": 30.0}

def run(ctx):
    print("about to crash", flush=True)
    ctypes.string_at(0)
    return []
""",
    "check_raise.py": """
NAME = "raise"
TIMEOUT_S = {"gpu": 30.0, "dry": 30.0}

def run(ctx):
    raise ValueError("planted")
""",
}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _gone(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
def test_a_check_that_hangs_crashes_or_raises_costs_its_own_line_only(tmp_path: Path) -> None:
    checks = tmp_path / "checks"
    checks.mkdir()
    for name, source in FAKES.items():
        (checks / name).write_text(source)
    out = tmp_path / "out"
    cmd = [sys.executable, str(SCRIPT), "--dry", "--out", str(out), "--checks-dir", str(checks)]
    proc = run_in_session(cmd, timeout=90, cwd=ROOT, env=_env())
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert "--dry" in lines[0]
    results = [line for line in lines if re.match(r"^(PASS|FAIL|SKIP) ", line)]
    # known names first (none here), then by name: crash, hang, ok, raise
    assert [line.split()[:2] for line in results] == [
        ["FAIL", "crash"],
        ["PASS", "hang/before"],  # emitted before the hang: kept through the kill
        ["FAIL", "hang"],
        ["PASS", "ok/one"],
        ["FAIL", "raise"],
    ], proc.stdout
    assert "crashed: killed by SIGSEGV" in results[0]
    assert "timed out after 3 s" in results[2]
    assert "raised ValueError: planted" in results[4]
    assert lines[-1] == "gpu-check: 2 passed, 3 failed, 0 skipped"

    report = json.loads((out / "gpu_check.json").read_text())
    assert report["finished"]
    assert report["dry"]
    outcome = {c["name"]: c["outcome"] for c in report["checks"]}
    assert outcome == {"crash": "crash", "hang": "timeout", "ok": "ok", "raise": "failed"}
    by_name = {c["name"]: c for c in report["checks"]}
    assert "about to crash" in by_name["crash"]["tail"]
    assert "Segmentation fault" in by_name["crash"]["tail"]
    assert "hanging now" in by_name["hang"]["tail"]
    assert "time.sleep(600)" in by_name["hang"]["tail"] or "in run" in by_name["hang"]["tail"]
    assert "ValueError: planted" in by_name["raise"]["results"][0]["data"]["traceback"]
    assert by_name["hang"]["timeout_s"] == 3.0
    log = (out / "gpu_check.log").read_text()
    assert "===== hang" in log
    assert "about to crash" in log
    # the hung check's own child was killed with its process group
    pid = int((out / "hang" / "grandchild.pid").read_text())
    assert _gone(pid), f"the hung check's child {pid} outlived it"
    assert not proc.leftovers


def test_only_runs_the_named_checks_and_rejects_unknown_ones(tmp_path: Path) -> None:
    checks = tmp_path / "checks"
    checks.mkdir()
    (checks / "check_ok.py").write_text(FAKES["check_ok.py"])
    (checks / "check_raise.py").write_text(FAKES["check_raise.py"])
    base = [sys.executable, str(SCRIPT), "--dry", "--checks-dir", str(checks)]
    proc = run_in_session([*base, "--out", str(tmp_path / "a"), "--only", "ok"], 60, env=_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == "gpu-check: 1 passed, 0 failed, 0 skipped"
    proc = run_in_session([*base, "--out", str(tmp_path / "b"), "--only", "nope"], 60, env=_env())
    assert proc.returncode == 2
    assert "unknown check(s) nope" in proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_the_dry_run_passes_and_reports_every_check(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_in_session(
        [sys.executable, str(SCRIPT), "--dry", "--out", str(out)], timeout=450, cwd=ROOT, env=_env()
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert "dry" in lines[0]
    assert not [line for line in lines if line.startswith("FAIL")], proc.stdout
    assert re.fullmatch(r"gpu-check: \d+ passed, 0 failed, \d+ skipped", lines[-1]), lines[-1]

    report = json.loads((out / "gpu_check.json").read_text())
    assert report["finished"]
    assert report["dry"]
    modules = sorted(p.stem.removeprefix("check_") for p in SCRIPT.parent.glob("gpu/check_*.py"))
    assert sorted(c["name"] for c in report["checks"]) == modules
    for check in report["checks"]:
        assert check["outcome"] == "ok", check
        assert check["results"], check["name"]
        for entry in check["results"]:
            assert entry["status"] in ("PASS", "SKIP"), entry
            assert entry["figure"], entry
            assert entry["bound"], entry
            assert isinstance(entry["data"], dict)
    assert (out / "gpu_check.log").stat().st_size > 0


PYTEST_OUTPUT = """\
..E.FF                                                                   [100%]
==================================== ERRORS ====================================
_____________________ ERROR at setup of test_nvml_reads ______________________
tests/gpu/test_cuda_paths.py:130: in test_nvml_reads
    import pynvml
E   FutureWarning: The pynvml package is deprecated.
=================================== FAILURES ===================================
________________________________ test_real_oom _________________________________
tests/gpu/test_cuda_paths.py:170: in test_real_oom
    assert torch.cuda.memory_allocated() == before
E   assert 512 == 0
=========================== short test summary info ============================
FAILED tests/gpu/test_cuda_paths.py::test_real_oom - assert 512 == 0
ERROR tests/gpu/test_cuda_paths.py::test_nvml_reads - FutureWarning: The pynvml
"""


def test_the_tests_check_reads_failures_from_output_and_from_its_plugin_lines(
    tmp_path: Path,
) -> None:
    from benchmarks.gpu import check_tests

    parsed = check_tests.parse_output(PYTEST_OUTPUT)
    assert parsed["progress"] == "..E.FF"
    assert sorted(parsed["failures"]) == ["test_nvml_reads", "test_real_oom"]
    assert "assert 512 == 0" in parsed["failures"]["test_real_oom"]
    assert "import pynvml" in parsed["failures"]["test_nvml_reads"]

    lines = tmp_path / "lines.jsonl"
    entries = [
        {"nodeid": "t.py::test_a", "when": "call", "outcome": "passed", "longrepr": ""},
        {"nodeid": "t.py::test_b", "when": "call", "outcome": "failed", "longrepr": "E boom"},
        {"nodeid": "t.py::test_b", "when": "teardown", "outcome": "error", "longrepr": "E td"},
        {"nodeid": "t.py::test_c", "when": "setup", "outcome": "error", "longrepr": "E fx"},
    ]
    lines.write_text("\n".join(json.dumps(e) for e in entries) + "\n{half a li")
    report = check_tests.read_lines(lines)
    assert report["cases"] == {"test_a": "passed", "test_b": "failed", "test_c": "error"}
    assert report["counts"] == {"passed": 1, "failed": 1, "error": 1, "skipped": 0}
    assert "E boom" in report["failures"]["test_b"]
    assert "E td" in report["failures"]["test_b"]
    assert report["sessionfinish"] is None  # pytest never reached its end
