"""``speedpack`` console script: ``speedpack doctor SCRIPT [ARGS...]``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="speedpack", description="Find and remove the reasons a Lightning run is slow."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    doctor = commands.add_parser(
        "doctor",
        help="run a training script with every diagnostic attached and print a report",
        description="Run SCRIPT unmodified; attach the pack's diagnostics to every pl.Trainer it "
        "builds; print one report at the end. The script's output and exit code pass through.",
    )
    doctor.add_argument("--json", metavar="PATH", help="also write the report as JSON to PATH")
    doctor.add_argument("--quiet", action="store_true", help="do not print the report")
    doctor.add_argument("script", help="the training script to run")
    doctor.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the script's exit code."""
    ns = _parser().parse_args(argv)
    from lightning_speedpack.doctor.runner import run_script

    try:
        result = run_script(ns.script, ns.args)
    except FileNotFoundError as err:
        print(f"speedpack doctor: {err}", file=sys.stderr)
        return 2
    if ns.json:
        result.report.write_json(ns.json)
    if not ns.quiet:
        result.report.print()
    result.print_traceback()  # last, where a Python user looks for it
    return result.exit_code
