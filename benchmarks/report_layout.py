"""The doctor's report in a log file: is every figure readable, every finding short and whole?

Runs ``speedpack doctor --json --html`` on a training script with stderr going to a file (as a
SLURM job, a CI run or ``nohup`` does) and measures the text it printed there:

- ``…`` anywhere in stderr (a cut cell);
- lines of the report longer than 120 characters that could have been broken (a line whose
  longest word is itself longer is an unbreakable path and is allowed);
- per finding, its lines per 100 characters of message, rounded up (the goal is at most 3),
  and per 100 characters of its whole text (message, where and fix);
- how many ``layer-dims-multiple`` findings are printed (Lightning's demo Transformer has 8
  layers that need one: the goal is at most 2), and the findings printed against those in the
  JSON (folded alike ones);
- the size of the HTML page.

By default the script is ``benchmarks/zoo/transformer_job.py`` (Lightning's transformer
example's model on random tokens: ``head_dim=100`` in 6 attention layers, a 3,001-word
vocabulary). ``--script PATH`` runs another, e.g. Lightning's own
``examples/pytorch/basics/transformer.py`` (it reads ``data/wikitext-2.txt`` from its working
directory: ``--cwd DIR``). Usage: ``python benchmarks/report_layout.py [--quick] [--script PATH]
[--cwd DIR] [--out DIR] [-- script args]``.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

RULE = "speedpack doctor"
SEVERITIES = ("[error", "[warning", "[info")


def run_doctor(script: Path, cwd: Path, out: Path, args: list[str]) -> tuple[str, dict[str, Any]]:
    """Run the doctor with stderr to a file; return that file's text and the JSON report."""
    report, page, log = out / "report.json", out / "report.html", out / "stderr.txt"
    cmd = [sys.executable, "-m", "lightning_speedpack", "doctor", "--json", str(report)]
    cmd += ["--html", str(page), str(script), *args]
    with log.open("w") as err:
        proc = subprocess.run(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=err, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"the script failed under the doctor (exit {proc.returncode}): {log}")
    return log.read_text(), json.loads(report.read_text())


def report_part(stderr: str) -> list[str]:
    """The report's lines: from the doctor's rule to the end."""
    lines = stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if RULE in line and "─" in line)
    return lines[start:]


def paragraphs(lines: list[str]) -> list[list[str]]:
    """Each finding's lines: from its ``[severity] component/id:`` line to the next blank."""
    found: list[list[str]] = []
    current: list[str] | None = None
    for line in lines:
        if line.startswith(SEVERITIES):
            current = [line]
            found.append(current)
        elif current is not None and line.strip():
            current.append(line)
        else:
            current = None
    return found


def breakable_overlong(lines: list[str], limit: int = 120) -> list[str]:
    """Lines over ``limit`` characters whose longest word is not itself over it."""
    return [
        line for line in lines if len(line) > limit and max(map(len, line.split() or [""])) <= limit
    ]


def measure(stderr: str, report: dict[str, Any], page: Path) -> dict[str, Any]:
    """The figures of one run (see the module's docstring)."""
    from lightning_speedpack.core.findings import findings_from_dicts
    from lightning_speedpack.doctor.grouping import presented

    lines = report_part(stderr)
    shown = presented(findings_from_dicts(report["findings"]))
    found = paragraphs(lines)
    ratios, dense = [], []
    for finding, para in zip(shown, found, strict=False):
        ratios.append(len(para) / max(1, math.ceil(len(finding.message) / 100)))
        text = len(finding.message) + len(finding.location or "") + len(finding.fix or "")
        dense.append(len(para) / (text / 100))
    return {
        "ellipses in stderr": stderr.count("…"),
        "report lines": len(lines),
        "longest report line": max(map(len, lines)),
        "breakable lines over 120": len(breakable_overlong(lines)),
        "findings in the JSON": len(report["findings"]),
        "findings printed": len(found),
        "layer-dims-multiple in the JSON": sum(
            f["id"] == "layer-dims-multiple" for f in report["findings"]
        ),
        "layer-dims-multiple printed": sum("/layer-dims-multiple:" in p[0] for p in found),
        "most lines per 100 chars of message": round(max(ratios, default=0.0), 2),
        "most lines per 100 chars of its text": round(max(dense, default=0.0), 2),
        "HTML page (bytes)": page.stat().st_size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--script", type=Path, default=HERE / "zoo" / "transformer_job.py")
    parser.add_argument("--cwd", type=Path, default=None, help="the script's working directory")
    parser.add_argument("--out", type=Path, default=None, help="keep stderr, JSON and page here")
    parser.add_argument("--quick", action="store_true", help="the default script for 1 epoch")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    ns = parser.parse_args()
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    if ns.quick and not args:
        args = ["--epochs", "1"]  # the default script's option (run_all.py --quick)
    with tempfile.TemporaryDirectory() as tmp:
        out = (ns.out or Path(tmp)).resolve()
        out.mkdir(parents=True, exist_ok=True)
        script = ns.script.resolve()
        stderr, report = run_doctor(script, (ns.cwd or script.parent).resolve(), out, args)
        figures = measure(stderr, report, out / "report.html")
    print(f"speedpack doctor {ns.script.name}, stderr to a file:")
    for name, value in figures.items():
        print(f"  {name:<38} {value}")


if __name__ == "__main__":
    main()
