"""The ``speedpack`` console script: ``doctor``, ``compare`` and ``cache`` subcommands."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from lightning_speedpack.core.console import LAYOUT_ENV, WIDTH_ENV, add_console_arguments
from lightning_speedpack.doctor import compare as _compare

__all__ = ["main"]

#: Options for the doctor that may also follow SCRIPT (``speedpack doctor train.py --json x``).
_TRAILING = ("--json", "--html")


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
    doctor.add_argument(
        "--html",
        metavar="PATH",
        help="also write the report as one self-contained HTML page with charts to PATH (may "
        "also follow SCRIPT; needs matplotlib: pip install 'lightning-speedpack[html]')",
    )
    add_console_arguments(doctor)
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
        help="the seconds WhatIf's trials may take (implies --what-if; default 60, said "
        "before the fit)",
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


def _split_script_args(args: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """Take the trailing ``--json PATH`` / ``--html PATH`` meant for the doctor out of the script's.

    ``speedpack doctor train.py --json out.json`` is what people type; everything after a
    ``--`` goes to the script untouched, so a script's own ``--json`` can still be passed.
    Returns the options found (``{"--json": PATH}``) and the script's arguments.
    """
    found: dict[str, str] = {}
    rest: list[str] = []
    items = list(args)
    while items:
        item = items.pop(0)
        name = item.split("=", 1)[0]
        if item == "--":
            rest.extend(items)
            break
        if item in _TRAILING and items:
            found[item] = items.pop(0)
        elif name in _TRAILING and "=" in item:
            found[name] = item.split("=", 1)[1]
        else:
            rest.append(item)
    return found, rest


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the script's exit code (``doctor``) or 0 on success (``cache``)."""
    ns = _parser().parse_args(argv)
    if ns.command == "cache":
        return _cache_clean(ns.dir, ns.dry_run)
    if ns.command == "compare":
        return _compare.run(ns)
    trailing, ns.args = _split_script_args(ns.args)
    ns.json = ns.json or trailing.get("--json")
    ns.html = ns.html or trailing.get("--html")
    problem = _check_doctor_options(ns)
    if problem:
        print(f"speedpack doctor: {problem}", file=sys.stderr)
        return 2
    from lightning_speedpack.doctor.runner import run_script

    only = None if ns.only is None else [n.strip() for n in ns.only.split(",") if n.strip()]
    budget = ns.what_if_budget
    try:
        with (
            _trace_environment(ns.trace, ns.trace_dir),
            _what_if_environment(budget),
            _text_environment(ns.width, ns.layout),
        ):
            flags = ["--what-if"] if ns.what_if or budget is not None else []
            result = run_script(ns.script, ns.args, deep=ns.deep, only=only, flags=flags)
    except (FileNotFoundError, ValueError) as err:
        print(f"speedpack doctor: {err}", file=sys.stderr)
        return 2
    if _launched_rank() != 0:  # torchrun/srun run the doctor in every rank: rank 0 reports
        result.print_traceback()
        return result.exit_code
    if ns.json:
        result.report.write_json(ns.json)
    page_error = _write_html(result.report.to_dict(), ns.html) if ns.html else None
    if not ns.quiet:
        result.report.print(layout=ns.layout, width=ns.width)
    if page_error:
        print(f"speedpack doctor: {page_error}", file=sys.stderr)
    result.print_traceback()  # last, where a Python user looks for it
    return result.exit_code or (1 if page_error else 0)


#: Where a launcher that starts every rank as a process of its own (torchrun, srun, mpirun) puts
#: the rank's global number. Lightning's own launcher starts its other ranks without this CLI.
_RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


def _launched_rank() -> int:
    """The global rank a launcher gave this process (0 when none did).

    Under ``torchrun --nproc-per-node 2 -m lightning_speedpack doctor ...`` every rank runs the
    doctor; only rank 0 prints the report and writes ``--json``/``--html`` (rank 0's report has
    every rank's figures). Before, each rank wrote its own to the same path, and the last one
    to finish, not rank 0, was the file the user got.
    """
    for name in _RANK_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 0


def _check_doctor_options(ns: argparse.Namespace) -> str | None:
    """The one-line problem with the doctor's options, found before the script runs, or None."""
    if ns.trace is not None:
        # Checked here (a one-line error), then handed to the doctor's StepTimeline (and to
        # every DDP rank it re-launches) through the environment.
        from lightning_speedpack.timeline.trace import parse_trace_steps

        try:
            parse_trace_steps(ns.trace)
        except ValueError as err:
            return f"--trace: {err}"
    budget = ns.what_if_budget
    if budget is not None and not (budget > 0 and budget != float("inf")):
        return f"--what-if-budget must be > 0, got {budget:g}"
    if ns.html:
        # Before the run: a training run is too dear to find out at its end that no page follows.
        from lightning_speedpack.doctor.html import missing_requirement

        return missing_requirement()
    return None


def _write_html(report: dict[str, Any], path: str) -> str | None:
    """Write the report's HTML page to ``path``; return the problem in one line, or None."""
    from lightning_speedpack.doctor.html import write_report_page

    try:
        written = write_report_page(report, path)
    except OSError as err:
        return f"--html: cannot write {path}: {err.strerror or err}"
    except Exception as err:  # a page that cannot be drawn must not cost the text report
        why = f"{type(err).__name__}: {err}"
        return f"--html: the page could not be made ({why}); the text report and --json have it"
    print(f"speedpack doctor: HTML report written to {written}", file=sys.stderr)
    return None


@contextmanager
def _environment(values: dict[str, str | None]) -> Iterator[None]:
    """Set the variables whose value is not None for the duration, then restore all of them.

    The script runs in this process and may re-launch DDP ranks that inherit the environment,
    so the environment is how the doctor's options reach the callbacks in every rank.
    """
    saved = {key: os.environ.get(key) for key in values}
    for key, value in values.items():
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


def _text_environment(width: int | None, layout: str) -> AbstractContextManager[None]:
    """Hand ``--width`` and ``--layout`` to the tables the diagnostics print during the fit."""
    return _environment(
        {
            WIDTH_ENV: None if width is None else str(width),
            LAYOUT_ENV: layout if layout in ("table", "log") else None,
        }
    )


def _what_if_environment(budget: float | None) -> AbstractContextManager[None]:
    """Hand ``--what-if-budget`` to the doctor's WhatIf (and every DDP rank) for the script."""
    from lightning_speedpack.what_if.callback import BUDGET_ENV

    return _environment({BUDGET_ENV: None if budget is None else repr(budget)})


def _trace_environment(trace: str | None, trace_dir: str | None) -> AbstractContextManager[None]:
    """Set the StepTimeline trace variables for the script's duration, then restore them."""
    from lightning_speedpack.timeline.callback import TRACE_DIR_ENV, TRACE_ENV

    return _environment({TRACE_ENV: trace, TRACE_DIR_ENV: trace_dir})
