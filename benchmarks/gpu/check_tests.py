"""GPU check ``tests``: the suite's ``@pytest.mark.cuda`` tests, run on the device.

``python -m pytest tests/gpu/test_cuda_paths.py -m cuda -rA --tb=short -p no:cacheprovider``
with the repository's own pytest settings (``filterwarnings = error``, doctests), a per-test
timeout, a JUnit XML report and ``benchmarks/gpu/_pytest_lines.py``, a plugin that writes each
test's outcome and short traceback to a file the moment it is known. pytest's whole output goes
to the log; the result's ``data`` holds every failing test's name and short traceback, from the
JUnit report when pytest wrote one, else from the plugin's lines, else parsed from the output
(a pytest that dies before its summary still says what failed). On a GPU every collected test
must pass (a test skipped there is a FAIL: the conftest hook that skips them without CUDA fired
on a GPU), and pytest must exit 0. Dry, the same command runs with ``CUDA_VISIBLE_DEVICES``
empty: every test is collected and skipped, and the line says so (SKIP), so the check's own
plumbing runs in CI. What the tests cover is in the test file's docstring.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from benchmarks.gpu.context import Context, Status, result

__all__ = ["NAME", "TIMEOUT_S", "run"]

NAME = "tests"
TIMEOUT_S = {"gpu": 50.0, "dry": 90.0}

ROOT = Path(__file__).resolve().parents[2]
TEST_FILE = "tests/gpu/test_cuda_paths.py"


PER_TEST_TIMEOUT_S = 20
#: pytest's ``-q`` progress line: one character per test phase report.
_PROGRESS = re.compile(r"^[.FEsxX]+(\s+\[\s*\d+%\])?$")


def read_junit(path: Path) -> dict[str, Any]:
    """Counts, each test's outcome and each failure's short traceback, from a JUnit XML report."""
    root = ET.parse(path).getroot()
    cases: dict[str, str] = {}
    failures: dict[str, str] = {}
    for case in root.iter("testcase"):
        name = case.get("name", "?")
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                # A teardown error after a failure: the failure stays the outcome.
                if outcome != "failed":
                    outcome = "failed" if child.tag == "failure" else "error"
                text = (child.get("message") or "") + "\n" + (child.text or "")
                failures[name] = (failures.get(name, "") + "\n" + text).strip()[-3000:]
            elif child.tag == "skipped" and outcome == "passed":
                outcome = "skipped"
        cases[name] = outcome
    counts = {
        k: sum(1 for v in cases.values() if v == k)
        for k in ("passed", "failed", "error", "skipped")
    }
    return {"counts": counts, "cases": cases, "failures": failures}


def read_lines(path: Path) -> dict[str, Any]:
    """The same as :func:`read_junit`, from the plugin's lines (``_pytest_lines.py``)."""
    cases: dict[str, str] = {}
    failures: dict[str, str] = {}
    finished: int | None = None
    if path.exists():
        for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                entry = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if "sessionfinish" in entry:
                finished = entry["sessionfinish"]
                continue
            name = str(entry.get("nodeid", "?")).rsplit("::", 1)[-1]
            outcome = str(entry.get("outcome"))
            if outcome in ("failed", "error"):
                if cases.get(name) != "failed":
                    cases[name] = outcome
                text = f"[{entry.get('when')}] {entry.get('longrepr', '')}"
                for section, content in entry.get("sections") or []:
                    text += f"\n--- {section}\n{content}"
                failures[name] = (failures.get(name, "") + "\n" + text).strip()[-3000:]
            elif entry.get("when") == "call" or outcome == "skipped":
                cases.setdefault(name, outcome)
    counts = {
        k: sum(1 for v in cases.values() if v == k)
        for k in ("passed", "failed", "error", "skipped")
    }
    return {"counts": counts, "cases": cases, "failures": failures, "sessionfinish": finished}


def parse_output(text: str) -> dict[str, Any]:
    """What pytest's ``-rA --tb=short`` output says failed: names and short tracebacks."""
    failures: dict[str, str] = {}
    for match in re.finditer(r"^(FAILED|ERROR) (\S+)(?: - (.*))?$", text, re.MULTILINE):
        failures[match.group(2).rsplit("::", 1)[-1]] = match.group(3) or match.group(1)
    # The short tracebacks: "____ test_name ____" blocks up to the next header.
    for match in re.finditer(
        r"^_{3,} (?:ERROR (?:at \w+ of )?)?(\S+) _{3,}$\n(.*?)(?=^_{3,} |^={3,} )",
        text,
        re.MULTILINE | re.DOTALL,
    ):
        name = match.group(1).rsplit("::", 1)[-1]
        failures[name] = (match.group(2).strip() + "\n" + failures.get(name, "")).strip()[-3000:]
    progress = "".join(
        line.split()[0] for line in text.splitlines() if _PROGRESS.match(line.strip())
    )
    return {"failures": failures, "progress": progress}


def _gist(failure: str) -> list[str]:
    """A failure's first line (the error and an assertion's message) and its last, if other."""
    lines = [line.strip() for line in failure.strip().splitlines() if line.strip()] or ["?"]
    return [lines[0][:500]] + ([lines[-1][:200]] if len(lines) > 1 else [])


def _command(junit: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pytest",
        TEST_FILE,
        "-m",
        "cuda",
        "-p",
        "no:cacheprovider",
        "-p",
        "benchmarks.gpu._pytest_lines",
        "-rA",
        "--tb=short",
        "--timeout",
        str(PER_TEST_TIMEOUT_S),
        f"--junitxml={junit}",
    ]


def run(ctx: Context) -> list[dict[str, Any]]:
    junit = ctx.out_dir / "junit.xml"
    lines_path = ctx.out_dir / "pytest_lines.jsonl"
    output_path = ctx.out_dir / "pytest_output.txt"
    for path in (junit, lines_path, output_path):
        path.unlink(missing_ok=True)
    cmd = _command(junit)
    env = {**os.environ, "GPU_CHECK_PYTEST_LINES": str(lines_path)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    if ctx.dry:
        env["CUDA_VISIBLE_DEVICES"] = ""  # dry never touches a device, even on a GPU machine
    limit = TIMEOUT_S["dry" if ctx.dry else "gpu"] - 8
    timed_out = False
    try:
        proc = subprocess.run(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            timeout=limit,
            check=False,
        )
        output, code = proc.stdout, proc.returncode
    except subprocess.TimeoutExpired as err:
        raw = err.stdout or b""
        output = raw if isinstance(raw, str) else raw.decode(errors="replace")
        code, timed_out = None, True
    print(f"$ {' '.join(cmd)}\n{output}\n[pytest exit code {code}]", flush=True)
    output_path.write_text(output)
    parsed = parse_output(output)
    if junit.exists():
        report, source = read_junit(junit), "junit"
    else:
        report, source = read_lines(lines_path), "plugin lines"
        if not report["cases"] and parsed["failures"]:
            report["failures"], source = parsed["failures"], "pytest output"
    report.setdefault("sessionfinish", None)
    counts, cases = report["counts"], report["cases"]
    total = sum(counts.values())
    bad = sorted(
        set(report["failures"]) | {n for n, o in cases.items() if o in ("failed", "error")}
    )
    data = {
        **report,
        "exit_code": code,
        "source": source,
        "progress": parsed["progress"],
        "output_tail": output[-6000:],
        "output_file": str(output_path),
    }
    summary = ", ".join(f"{n} {k}" for k, n in counts.items() if n)
    if timed_out:
        return [
            result(
                NAME, "FAIL", f"pytest ran past {limit:g} s; {summary}: {bad}", "all pass", **data
            )
        ]
    if bad:
        tb = "; ".join(f"{n}: {_gist(report['failures'].get(n, ''))}" for n in bad)
        return [
            result(
                NAME,
                "FAIL",
                f"{summary or 'no counts'} (exit {code}, from {source}): {tb}"[:1400],
                "all pass",
                **data,
            )
        ]
    if total == 0:
        return [
            result(
                NAME,
                "FAIL",
                f"no cuda test collected (exit {code}): {output[-300:]}",
                "all pass",
                **data,
            )
        ]
    if ctx.dry:
        status: Status = "SKIP" if counts["skipped"] == total else "FAIL"
        return [
            result(
                NAME,
                status,
                f"no CUDA: {counts['skipped']} of {total} cuda tests collected and skipped",
                "all pass on a GPU",
                **data,
            )
        ]
    final: Status = "PASS" if counts["passed"] == total and code == 0 else "FAIL"
    figure = f"{counts['passed']} of {total} cuda tests passed"
    if counts["passed"] != total:
        figure += f" ({summary}: skipped on a GPU)"
    elif code != 0:
        figure += f", but pytest exited {code} (from {source})"
    return [result(NAME, final, figure, "all pass", **data)]
