"""The ``speedpack`` console script: ``doctor``, ``compare`` and ``cache`` subcommands."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from lightning_speedpack.doctor import compare as _compare

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="speedpack", description="Find and remove the reasons a Lightning run is slow."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    doctor = commands.add_parser(
        "doctor",
        help="run a training script with the pack's diagnostics attached and print a report",
        description="Run SCRIPT unmodified; attach the pack's diagnostics to every pl.Trainer it "
        "builds; print one report at the end. The script's output and exit code pass through. "
        "By default the diagnostics cheap enough to leave on run; --deep adds the costlier ones.",
    )
    doctor.add_argument(
        "--json",
        metavar="PATH",
        help="also write the report as JSON to PATH (may also follow SCRIPT; "
        "arguments after `--` go to the script untouched)",
    )
    doctor.add_argument("--quiet", action="store_true", help="do not print the report")
    doctor.add_argument(
        "--deep",
        action="store_true",
        help="also attach the diagnostics that cost more per step (the report names them)",
    )
    doctor.add_argument(
        "--what-if",
        action="store_true",
        help="before the first step, try each speed remedy on the script's own model and data "
        "(WhatIf) and report the measured gains",
    )
    doctor.add_argument(
        "--what-if-budget",
        metavar="SECONDS",
        type=float,
        help="the seconds WhatIf's trials may take (implies --what-if; default 60, or 5%% of a "
        "fit of known length when less)",
    )
    doctor.add_argument(
        "--only",
        metavar="NAMES",
        help="attach just these diagnostics, comma-separated (e.g. throughput,data)",
    )
    doctor.add_argument(
        "--trace",
        metavar="START:COUNT",
        help="profile training steps START..START+COUNT-1 with torch.profiler (StepTimeline): "
        "a Chrome/Perfetto trace per rank, with the phases and the sync points on it",
    )
    doctor.add_argument(
        "--trace-dir", metavar="DIR", help="where --trace writes (default: the Trainer's log dir)"
    )
    doctor.add_argument("script", help="the training script to run")
    doctor.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    cache = commands.add_parser(
        "cache",
        help="list and remove CachedDataset's shared-memory arenas on this node",
        description="Manage the /dev/shm/speedpack-* files CachedDataset keeps per node.",
    )
    cache_commands = cache.add_subparsers(dest="cache_command", required=True)
    clean = cache_commands.add_parser(
        "clean",
        help="list every arena with its size and state; remove those no live process uses",
        description="List every speedpack arena on this node with its size and state (in use: a "
        "live process maps it; dead: its processes were killed) and remove the dead ones. "
        "Arenas in use are never touched. CachedDataset does the same each time it starts.",
    )
    clean.add_argument("--dry-run", action="store_true", help="only list; remove nothing")
    clean.add_argument(
        "--dir", default=None, metavar="DIR", help="where the arenas live (default: /dev/shm)"
    )
    _compare.add_parser(commands)
    return parser


def _fmt_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"  # pragma: no cover


def _cache_clean(directory: str | None, dry_run: bool) -> int:
    """``speedpack cache clean``: print one line per arena; 0 unless the directory is unusable."""
    from lightning_speedpack.cache.reclaim import SHM_DIR, scan  # no torch, no Lightning

    where = directory or SHM_DIR
    try:
        found = scan(where, remove=not dry_run)
    except FileNotFoundError:
        print(f"speedpack cache clean: {where} does not exist (nothing to clean)", file=sys.stderr)
        return 2 if directory else 0
    except PermissionError as err:
        print(f"speedpack cache clean: cannot remove a dead arena: {err}", file=sys.stderr)
        return 1
    dead = [f for f in found if f.status == "dead"]
    freed = sum(f.size_bytes for f in dead if f.removed)
    for f in found:
        action = ""
        if f.status == "dead":
            action = "  (would remove)" if dry_run else ("  removed" if f.removed else "")
        print(f"{f.status:<8} {_fmt_bytes(f.size_bytes):>10}  {f.path}{action}")
    in_use = sum(f.status == "in use" for f in found)
    if dry_run:
        summary = (
            f"{len(dead)} dead would be removed ({_fmt_bytes(sum(f.size_bytes for f in dead))})"
        )
    else:
        summary = f"{sum(f.removed for f in dead)} dead removed ({_fmt_bytes(freed)} freed)"
    print(f"{len(found)} speedpack arena(s) in {where}: {in_use} in use, {summary}")
    return 0


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
    """Entry point; returns the script's exit code (``doctor``) or 0 on success (``cache``)."""
    ns = _parser().parse_args(argv)
    if ns.command == "cache":
        return _cache_clean(ns.dir, ns.dry_run)
    if ns.command == "compare":
        return _compare.run(ns)
    trailing_json, ns.args = _split_script_args(ns.args)
    ns.json = ns.json or trailing_json
    if ns.trace is not None:
        # Checked here (a one-line error), then handed to the doctor's StepTimeline (and to
        # every DDP rank it re-launches) through the environment.
        from lightning_speedpack.timeline.trace import parse_trace_steps

        try:
            parse_trace_steps(ns.trace)
        except ValueError as err:
            print(f"speedpack doctor: --trace: {err}", file=sys.stderr)
            return 2
    from lightning_speedpack.doctor.runner import run_script

    only = None if ns.only is None else [n.strip() for n in ns.only.split(",") if n.strip()]
    try:
        budget = ns.what_if_budget
        if budget is not None and not (budget > 0 and budget != float("inf")):
            print(
                f"speedpack doctor: --what-if-budget must be > 0, got {budget:g}", file=sys.stderr
            )
            return 2
        with _trace_environment(ns.trace, ns.trace_dir), _what_if_environment(budget):
            flags = ["--what-if"] if ns.what_if or budget is not None else []
            result = run_script(ns.script, ns.args, deep=ns.deep, only=only, flags=flags)
    except (FileNotFoundError, ValueError) as err:
        print(f"speedpack doctor: {err}", file=sys.stderr)
        return 2
    if ns.json:
        result.report.write_json(ns.json)
    if not ns.quiet:
        result.report.print()
    result.print_traceback()  # last, where a Python user looks for it
    return result.exit_code


@contextmanager
def _what_if_environment(budget: float | None) -> Iterator[None]:
    """Hand ``--what-if-budget`` to the doctor's WhatIf (and every DDP rank) for the script."""
    from lightning_speedpack.what_if.callback import BUDGET_ENV

    saved = os.environ.get(BUDGET_ENV)
    if budget is not None:
        os.environ[BUDGET_ENV] = repr(budget)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(BUDGET_ENV, None)
        else:
            os.environ[BUDGET_ENV] = saved


@contextmanager
def _trace_environment(trace: str | None, trace_dir: str | None) -> Iterator[None]:
    """Set the StepTimeline trace variables for the script's duration, then restore them."""
    from lightning_speedpack.timeline.callback import TRACE_DIR_ENV, TRACE_ENV

    wanted = {TRACE_ENV: trace, TRACE_DIR_ENV: trace_dir}
    saved = {key: os.environ.get(key) for key in wanted}
    for key, value in wanted.items():
        if value is not None:
            os.environ[key] = value
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
