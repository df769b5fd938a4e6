"""One GPU check in a process of its own: ``benchmarks/gpu_check.py`` starts this file per check.

Usage (the runner's, not a person's)::

    python benchmarks/gpu/child.py run MODULE_PATH CONTEXT_JSON RESULT_PATH [--dump-after S]
    python benchmarks/gpu/child.py probe RESULT_PATH [--dry]

``run`` imports the check module (``benchmarks/gpu/check_<name>.py``, or any file the runner was
pointed at), calls its ``run(ctx)`` and writes ``{"results": [...]}`` to ``RESULT_PATH``. A check
that raises gets one FAIL result with the traceback; one that hangs has every thread's Python
stack dumped to stderr ``--dump-after`` seconds in (just before the runner kills its process
group); one that crashes the interpreter has its stack dumped by ``faulthandler``. ``probe``
writes what the header says: Python, torch, CUDA, driver and Lightning versions and the device
(without ``--dry`` only; with it, CUDA is never touched).

This file imports neither torch nor Lightning itself: ``run`` pays only for what the check
imports.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import importlib.util
import json
import logging
import os
import platform
import subprocess
import sys
import traceback
import types
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
STATUSES = ("PASS", "FAIL", "SKIP")
_LIGHTNING_LOGGERS = (
    "pytorch_lightning",
    "lightning.pytorch",
    "lightning_fabric",
    "lightning.fabric",
    "lightning",
)


def _use_this_repository() -> None:
    """Import ``benchmarks`` and ``lightning_speedpack`` from this checkout, whatever else is there.

    ``sys.path[0]`` is this file's folder when run as a script: replaced by the repository root.
    ``benchmarks`` has no ``__init__.py`` (a namespace package), so a regular package of that
    name installed elsewhere would win over it: it is bound to this checkout's folder first.
    """
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    if "benchmarks" not in sys.modules:
        package = types.ModuleType("benchmarks")
        package.__path__ = [str(ROOT / "benchmarks")]
        sys.modules["benchmarks"] = package


def _load(path: Path) -> types.ModuleType:
    """The check module at ``path``: as ``benchmarks.gpu.<stem>`` when it lives here."""
    if path.parent == ROOT / "benchmarks" / "gpu":
        return importlib.import_module(f"benchmarks.gpu.{path.stem}")
    spec = importlib.util.spec_from_file_location(f"gpu_check_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import a check from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _quiet_lightning() -> None:
    """Lightning's INFO lines ("GPU available", "LOCAL_RANK") are noise in the log."""
    for name in _LIGHTNING_LOGGERS:
        if name in sys.modules:
            logging.getLogger(name).setLevel(logging.WARNING)


def _fail(name: str, figure: str, tb: str) -> dict[str, Any]:
    return {
        "check": name,
        "status": "FAIL",
        "figure": figure,
        "bound": "the check runs to its end",
        "data": {"traceback": tb},
    }


def validate(name: str, results: Any) -> list[dict[str, Any]]:
    """The results as the runner prints them: malformed entries become FAIL lines saying so."""
    if not isinstance(results, list) or not results:
        return [_fail(name, f"run() returned {type(results).__name__} {results!r:.80}", "")]
    out: list[dict[str, Any]] = []
    for entry in results:
        ok = (
            isinstance(entry, dict)
            and entry.get("status") in STATUSES
            and all(isinstance(entry.get(k), str) for k in ("check", "figure", "bound"))
        )
        if ok:
            out.append({**entry, "data": entry.get("data") or {}})
        else:
            out.append(_fail(name, f"malformed result {entry!r:.200}", ""))
    return out


def write_json(path: Path, payload: Any) -> None:
    """Write ``payload`` to ``path`` atomically (a kill never leaves half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def run_check(module_path: Path, context_json: str, result_path: Path) -> int:
    name = module_path.stem.removeprefix("check_")
    try:
        module = _load(module_path)
        name = str(getattr(module, "NAME", name))
        _quiet_lightning()
        from benchmarks.gpu.context import Context

        ctx = Context.from_json(context_json)
        results = validate(name, module.run(ctx))
        code = 0
    except Exception as err:
        tb = traceback.format_exc()
        print(tb, file=sys.stderr, flush=True)
        results = [_fail(name, f"raised {type(err).__name__}: {err}"[:300], tb)]
        code = 1
    write_json(result_path, {"name": name, "results": results})
    return code


def _driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        pass
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
        return out.stdout.strip().splitlines()[0] or None
    except Exception:
        return None


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, Any]:
    """What can be read without importing torch (the runner's header in ``--dry`` mode)."""
    return {
        "python": platform.python_version(),
        "torch": _version("torch"),
        "pytorch_lightning": _version("pytorch-lightning"),
        "lightning": _version("lightning"),
        "platform": platform.platform(),
    }


def probe(result_path: Path) -> int:
    """Write the header's facts; CUDA is initialised here, in a process that then exits."""
    import torch

    info: dict[str, Any] = {**versions(), "torch": torch.__version__}
    info["cuda_build"] = torch.version.cuda
    info["cuda_available"] = bool(torch.cuda.is_available())
    if info["cuda_available"]:
        props = torch.cuda.get_device_properties(0)
        info["device"] = torch.cuda.get_device_name(0)
        info["device_count"] = torch.cuda.device_count()
        info["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
        info["memory_gib"] = round(props.total_memory / 2**30, 1)
        info["cudnn"] = torch.backends.cudnn.version()
        info["driver"] = _driver_version()
    write_json(result_path, info)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("module", type=Path)
    run.add_argument("context")
    run.add_argument("result", type=Path)
    run.add_argument("--dump-after", type=float, default=None)
    pr = sub.add_parser("probe")
    pr.add_argument("result", type=Path)
    args = parser.parse_args(argv)
    faulthandler.enable(all_threads=True)  # a segfault prints every thread's stack to stderr
    _use_this_repository()
    if args.command == "probe":
        return probe(args.result)
    if args.dump_after is not None and args.dump_after > 0:
        # Just before the runner kills a hung check: where every thread was.
        faulthandler.dump_traceback_later(args.dump_after, exit=False)
    try:
        return run_check(args.module, args.context, args.result)
    finally:
        faulthandler.cancel_dump_traceback_later()
        sys.stdout.flush()
        sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main())
