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
    doctor.add_argument(
        "--json",
        metavar="PATH",
        help="also write the report as JSON to PATH (may also follow SCRIPT; "
        "arguments after `--` go to the script untouched)",
    )
    doctor.add_argument("--quiet", action="store_true", help="do not print the report")
    doctor.add_argument("script", help="the training script to run")
    doctor.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    return parser


def _split_script_args(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """Take a trailing ``--json PATH`` meant for the doctor out of the script's arguments.

    ``speedpack doctor train.py --json out.json`` is what people type; everything after a
    ``--`` goes to the script untouched, so a script's own ``--json`` can still be passed.
    """
    json_path: str | None = None
    rest: list[str] = []
    items = list(args)
    while items:
        item = items.pop(0)
        if item == "--":
            rest.extend(items)
            break
        if item == "--json" and items:
            json_path = items.pop(0)
        elif item.startswith("--json="):
            json_path = item.split("=", 1)[1]
        else:
            rest.append(item)
    return json_path, rest


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the script's exit code."""
    ns = _parser().parse_args(argv)
    trailing_json, ns.args = _split_script_args(ns.args)
    ns.json = ns.json or trailing_json
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
