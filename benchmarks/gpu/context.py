"""What every GPU check gets and gives back (plain data: it crosses a process boundary as JSON).

Each check module ``benchmarks/gpu/check_<name>.py`` exposes::

    NAME: str                    # the check's name, e.g. "syncs"
    TIMEOUT_S: dict[str, float]  # {"gpu": ..., "dry": ...}: the parent kills it past this
    def run(ctx: Context) -> list[dict[str, Any]]   # one dict per printed line, see `result`

and is run by ``benchmarks/gpu_check.py`` in a child process of its own, so that one check that
fails, hangs or crashes the interpreter costs its own lines and never the rest.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = ["PARTIAL_ENV", "Context", "Status", "emit", "result"]

#: The runner names a file here; :func:`emit` appends each line to it as soon as it is known, so
#: a check killed at its timeout keeps the lines it had made.
PARTIAL_ENV = "GPU_CHECK_PARTIAL"

Status = Literal["PASS", "FAIL", "SKIP"]


@dataclass(frozen=True)
class Context:
    """Where a check runs and at what size.

    Attributes:
        device: ``"cuda"`` on a GPU machine; ``"cpu"`` in ``--dry`` mode (the same code at toy
            sizes, so that CI exercises it).
        dry: True when no CUDA device is used: sizes are toy sizes and GPU-only bounds are
            reported as SKIP with the reason, never as PASS.
        out: the folder the check may write files into (its own sub-folder is fine).
    """

    device: str
    dry: bool
    out: str

    def to_json(self) -> str:
        """The context as one JSON line, for the child process's command line."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Context:
        """The context a parent passed as JSON."""
        return cls(**json.loads(text))

    @property
    def out_dir(self) -> Path:
        """``out`` as a Path, created."""
        path = Path(self.out)
        path.mkdir(parents=True, exist_ok=True)
        return path


def result(
    check: str,
    status: Status,
    figure: str,
    bound: str,
    **data: Any,
) -> dict[str, Any]:
    """One line of the check's output.

    Args:
        check: a short name, e.g. ``"syncs/planted-lines"``.
        status: PASS, FAIL or SKIP.
        figure: what was measured, with its unit and the independent figure it was held
            against, e.g. ``"5 of 5 planted lines; 5 syncs/step vs 5 from set_sync_debug_mode"``.
        bound: the bound it was held to, e.g. ``"equal"`` or ``"within 3%"``.
        **data: JSON-serialisable raw numbers for ``gpu_check.json``.
    """
    return {"check": check, "status": status, "figure": figure, "bound": bound, "data": data}


def emit(entry: dict[str, Any]) -> dict[str, Any]:
    """Hand ``entry`` (a :func:`result`) to the runner now; return it unchanged.

    A check that makes its lines one at a time calls this on each as soon as it is known: if the
    check is then killed at its timeout (or crashes), the runner still prints those lines. The
    lines ``run`` returns are what counts when it does return. Without the runner (a test calling
    ``run`` directly) this does nothing.
    """
    path = os.environ.get(PARTIAL_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry, default=str) + "\n")
            f.flush()
    return entry
