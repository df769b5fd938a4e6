"""Read back what an offline W&B run wrote to its own ``run-*.wandb`` record log.

The log is LevelDB-log framed (a 7-byte file header ``:W&B`` + version, then 32 KiB blocks of
records each with a ``<crc32, length, type>`` header), every record a ``wandb_internal_pb2.Record``.
Reading the file, not a mock, is what proves a metric reached W&B.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_BLOCK = 32768
_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _records(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    magic, _version, _ = struct.unpack("<4sHB", data[:_HEADER])
    if magic != b":W&B":
        raise ValueError(f"{path} is not a W&B record log")
    pos, pending = _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # block trailer padding
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        if kind == 0 and length == 0:
            break
        payload = data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if zlib.crc32(payload, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc:
            break  # an unfinished tail of a run still being written
        if kind == _FULL:
            yield payload
        elif kind == _FIRST:
            pending = payload
        elif kind == _MIDDLE:
            pending += payload
        elif kind == _LAST:
            yield pending + payload
            pending = b""


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


@dataclass
class WandbRun:
    """History rows, summary, config and metric definitions of one run, from its own files."""

    path: Path
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The run's ``exit`` record is in the file: W&B's writer has written everything before it.
    exited: bool = False

    def values(self, key: str) -> list[Any]:
        """Every value logged under ``key``, in order."""
        return [row[key] for row in self.history if key in row]

    def keys(self) -> set[str]:
        """Every history key logged at least once."""
        return {k for row in self.history for k in row}


def read_run(path: Path) -> WandbRun:
    """Parse one ``run-*.wandb`` file."""
    from wandb.proto import wandb_internal_pb2 as pb

    run = WandbRun(path=path)
    for raw in _records(path):
        record = pb.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            run.history.append({_key(i): json.loads(i.value_json) for i in record.history.item})
        elif kind == "summary":
            run.summary.update({_key(i): json.loads(i.value_json) for i in record.summary.update})
        elif kind == "config":
            for item in record.config.update:
                run.config[_key(item)] = json.loads(item.value_json)
        elif kind == "exit":
            run.exited = True
        elif kind == "metric":
            m = record.metric
            run.metrics[m.name or m.glob_name] = {"step_metric": m.step_metric}
    return run


def find_runs(wandb_dir: Path) -> list[WandbRun]:
    """Every run under ``wandb_dir`` (the ``WANDB_DIR``), oldest first."""
    files = sorted(Path(wandb_dir).glob("**/run-*.wandb"), key=lambda p: p.stat().st_mtime)
    return [read_run(p) for p in files]


def read_table(run: WandbRun, key: str) -> dict[str, Any]:
    """The ``wandb.Table`` logged under ``key``: ``{"columns": [...], "data": [[...], ...]}``.

    Read from the table file in the run's own ``files/`` folder (what W&B uploads), through the
    history row that points to it. Fails unless the table was logged exactly once.
    """
    rows = [r for r in run.history if r.get(f"{key}/_type") == "table-file"]
    assert len(rows) == 1, f"{key!r} logged {len(rows)} times, expected once"
    path = run.path.parent / "files" / rows[0][f"{key}/path"]
    return dict(json.loads(path.read_text()))


def table_keys(run: WandbRun) -> set[str]:
    """The keys of every table logged in the run."""
    return {
        k.removesuffix("/_type")
        for row in run.history
        for k, v in row.items()
        if k.endswith("/_type") and v == "table-file"
    }


class OfflineWandb:
    """A W&B offline sandbox: ``dir`` is the ``WANDB_DIR``; ``runs()`` reads back its runs."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory

    def runs(self) -> list[WandbRun]:
        return find_runs(self.dir)

    def only_run(self, timeout: float = 90.0) -> WandbRun:
        """The single run, once W&B's writer has finished it (its ``exit`` record is written).

        ``wandb.finish()`` can return before the offline writer (a separate service process)
        has flushed the run's record log; on a loaded machine a read straight after it saw
        the tables logged at the end of fit missing (CI, 2026-11-26). The ``exit`` record is
        written last, after every record the run sent, so it is the one safe point to read.
        """
        import time

        deadline = time.monotonic() + timeout
        while True:
            runs = self.runs()
            if (len(runs) == 1 and runs[0].exited) or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        assert len(runs) == 1, f"expected one W&B run under {self.dir}, found {len(runs)}"
        assert runs[0].exited, (
            f"{runs[0].path}: no exit record after {timeout:.0f} s; was wandb.finish() called "
            "before the read?"
        )
        return runs[0]
