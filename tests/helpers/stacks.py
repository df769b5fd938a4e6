"""The data stacks of ``tests/test_invisible.py``: what each one needs, its data, its commands.

A *stack* is one way a training job reads its data (a map-style ``TensorDataset``, a stream in
``CachedDataset``, WebDataset shards, a Hugging Face ``datasets.Dataset``, LitData, MosaicML
``streaming``, PyTorch Geometric's ``DataLoader`` over small graphs, a ``torchdata.nodes``
pipeline). Each reads one of a few small *data kinds* built on disk before the jobs run:

=========  ===============================================================================
kind       what :func:`build` writes under the data directory
=========  ===============================================================================
arrays     ``samples.npz``: ``ids`` (int64) and ``x`` (float32, 8 per sample)
wds        ``shard-00.tar`` .. ``shard-03.tar`` (``webdataset.TarWriter``: ``.cls`` + ``.npy``)
hf         ``hf/``: ``datasets.Dataset.from_dict(...).save_to_disk``
litdata    ``litdata/``: ``litdata.optimize`` output (chunks + ``index.json``)
mosaic     ``mds/``: ``streaming.MDSWriter`` output (shards + ``index.json``)
=========  ===============================================================================

Every kind also gets ``meta.json`` (``{"n": N}``). Sample ``i`` has id ``i`` and
``x = sin(0.1 i + [0..7])``; ``tests/helpers/stack_job.py`` (the job) reads the same layout.

Building runs in a subprocess (``python stacks.py build KIND DIR``, through
:func:`tests.helpers.procs.run_in_session`): ``litdata.optimize`` starts worker processes, and
the libraries' imports stay out of the pytest process. This file imports only the standard
library and numpy at module level, so it runs as a script too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "HELPERS",
    "JOB_SCRIPT",
    "KINDS",
    "MODES",
    "N_SAMPLES",
    "STACKS",
    "TORCHVISION_STUB",
    "Stack",
    "build",
    "build_command",
    "job_args",
    "pack_command",
    "plain_command",
    "sample_x",
]

HELPERS = Path(__file__).resolve().parent
JOB_SCRIPT = HELPERS / "stack_job.py"
#: On ``PYTHONPATH`` of the MosaicML jobs only (``import streaming`` imports torchvision).
TORCHVISION_STUB = HELPERS / "torchvision_stub"

#: Samples in every data kind: not a multiple of the batch size (16) nor of a worker's share,
#: so partial batches occur in every stack.
N_SAMPLES = 200
WDS_SHARDS = 4
FEATURES = 8

KINDS = ("arrays", "wds", "hf", "litdata", "mosaic")


@dataclass(frozen=True)
class Stack:
    """One data stack of the grid.

    Attributes:
        name: the job's ``--stack`` value.
        kind: the data kind it reads (see the module docstring).
        map_style: the DataLoader samples indices (a shuffled sampler): the exact order of the
            samples is part of the contract, not only their multiset.
        requires: modules the stack imports (the test skips, naming it, when one is missing).
        stub: the job needs the torchvision stub on ``PYTHONPATH``.
        spawn: the grid also runs it with ``multiprocessing_context="spawn"`` workers.
        judged: the doctor's verdict on the job is checked against the wait its run measured.
        planted: what the job is written to be bound by (``"data"``: its loader sets the pace;
            ``"model"``), checked against the measured wait too; or ``None``.
    """

    name: str
    kind: str
    map_style: bool
    requires: tuple[str, ...] = ()
    stub: bool = False
    spawn: bool = False
    judged: bool = False
    planted: str | None = None

    def missing(self) -> str | None:
        """The first required module (or submodule) that is not installed, or ``None``."""
        for module in self.requires:
            try:
                found = importlib.util.find_spec(module)
            except ImportError:  # a parent package is missing
                found = None
            if found is None:
                return module
        return None


STACKS = {
    s.name: s
    for s in (
        Stack("tensor", "arrays", map_style=True, spawn=True),
        Stack("cached_map", "arrays", map_style=True, spawn=True),
        Stack("stream", "arrays", map_style=False),
        Stack("stream_cached", "arrays", map_style=False),
        Stack("wds", "wds", map_style=False, requires=("webdataset",)),
        Stack("wds_cached", "wds", map_style=False, requires=("webdataset",)),
        Stack("hf", "hf", map_style=True, requires=("datasets",)),
        Stack("hf_cached", "hf", map_style=True, requires=("datasets",)),
        Stack("litdata", "litdata", map_style=False, requires=("litdata",)),
        Stack("mosaic", "mosaic", map_style=False, requires=("streaming",), stub=True),
        # PyG's DataLoader over one small graph per sample (a torch DataLoader, shuffled).
        Stack("pyg", "arrays", map_style=True, requires=("torch_geometric",), judged=True),
        # torchdata.nodes: a shuffled sampler, items mapped in threads in order, 4 ms per item.
        Stack(
            "nodes",
            "arrays",
            map_style=True,
            requires=("torchdata.nodes",),
            judged=True,
            planted="data",
        ),
    )
}

#: How the pack is put on the job: ``speedpack doctor``, ``speedpack doctor --deep``, and a
#: ``DataPipelineProfiler(probe="start")`` the job adds to its own Trainer.
MODES = ("doctor", "deep", "profiler")


def sample_x(ids: np.ndarray) -> np.ndarray:
    """The features of the samples ``ids``: ``sin(0.1 i + [0..7])``, float32, shape (n, 8)."""
    ids = np.asarray(ids, dtype=np.float64)
    return np.sin(0.1 * ids[:, None] + np.arange(FEATURES)[None, :]).astype(np.float32)


def job_args(
    stack: str,
    data: Path | str,
    out: Path | str,
    *,
    workers: int,
    persistent: bool = False,
    spawn: bool = False,
    epochs: int = 2,
    namespace: str = "pytorch_lightning",
    callbacks: str | None = None,
    devices: int = 1,
) -> list[str]:
    """The job's command-line arguments (after the script); ``devices > 1``: DDP on CPUs."""
    args = ["--stack", stack, "--data", str(data), "--workers", str(workers)]
    args += ["--epochs", str(epochs), "--out", str(out), "--namespace", namespace]
    if persistent:
        args.append("--persistent")
    if spawn:
        args.append("--spawn")
    if callbacks:
        args += ["--callbacks", callbacks]
    if devices != 1:
        args += ["--devices", str(devices)]
    return args


def build_command(kind: str, out: Path | str) -> list[str]:
    """``python stacks.py build KIND OUT``: write the data of ``kind`` (see :func:`build`)."""
    return [sys.executable, str(Path(__file__).resolve()), "build", kind, str(out)]


def plain_command(args: list[str]) -> list[str]:
    """``python stack_job.py ARGS``: the job on its own."""
    return [sys.executable, str(JOB_SCRIPT), *args]


def pack_command(mode: str, args: list[str], report: Path | str | None = None) -> list[str]:
    """The same job under the pack in ``mode`` (one of :data:`MODES`).

    ``speedpack doctor`` is ``python -m lightning_speedpack doctor`` (``lightning_speedpack/
    __main__.py`` calls ``doctor.cli.main``, the function behind the ``speedpack`` console
    script; ``doctor/cli.py`` itself has no ``__main__`` guard). The job's arguments follow
    the script as a user types them (none of them is the doctor's ``--json``). ``report``: the
    doctor also writes its JSON report there (``--json``; the doctor's modes only).
    """
    doctor = [sys.executable, "-m", "lightning_speedpack", "doctor"]
    if report is not None and mode != "profiler":
        doctor += ["--json", str(report)]
    if mode == "doctor":
        return [*doctor, str(JOB_SCRIPT), *args]
    if mode == "deep":
        return [*doctor, "--deep", str(JOB_SCRIPT), *args]
    if mode == "profiler":
        return [sys.executable, str(JOB_SCRIPT), *args, "--callbacks", "profiler"]
    if mode == "trace":  # StepTimeline's trace window (torch.profiler) on steps 2-3
        return [*doctor, "--trace", "2:2", "--trace-dir", "traces", str(JOB_SCRIPT), *args]
    raise ValueError(f"unknown pack mode {mode!r}; choose from {(*MODES, 'trace')}")


# --- building the data (run as a script: ``python stacks.py build KIND DIR``) ---------------


def _litdata_sample(i: int) -> dict[str, object]:  # top level: litdata's workers pickle it
    return {"id": i, "x": sample_x(np.array([i]))[0]}


def build(kind: str, out: Path, n: int = N_SAMPLES) -> None:
    """Write the data of ``kind`` for ``n`` samples under ``out`` (see the module docstring)."""
    out.mkdir(parents=True, exist_ok=True)
    ids = np.arange(n, dtype=np.int64)
    x = sample_x(ids)
    if kind == "arrays":
        np.savez(out / "samples.npz", ids=ids, x=x)
    elif kind == "wds":
        import webdataset as wds

        for shard, part in enumerate(np.array_split(ids, WDS_SHARDS)):
            with wds.TarWriter(str(out / f"shard-{shard:02d}.tar")) as sink:
                for i in part.tolist():
                    sink.write({"__key__": f"sample{i:06d}", "cls": i, "npy": x[i]})
    elif kind == "hf":
        import datasets

        table = datasets.Dataset.from_dict({"id": ids.tolist(), "x": x.tolist()})
        table.save_to_disk(str(out / "hf"))
    elif kind == "litdata":
        import litdata

        litdata.optimize(
            fn=_litdata_sample,
            inputs=list(range(n)),
            output_dir=str(out / "litdata"),
            chunk_bytes="4KB",  # a few chunks, so the workers split them as on real data
            num_workers=1,
        )
    elif kind == "mosaic":
        from streaming import MDSWriter

        columns = {"id": "int", "x": f"ndarray:float32:{FEATURES}"}
        # a few shards, so the workers split them as on real data
        with MDSWriter(out=str(out / "mds"), columns=columns, size_limit=2048) as sink:
            for i in ids.tolist():
                sink.write({"id": i, "x": x[i]})
    else:
        raise ValueError(f"unknown data kind {kind!r}; choose from {KINDS}")
    (out / "meta.json").write_text(json.dumps({"n": n, "kind": kind}))


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "build":
        sys.exit(f"usage: {os.path.basename(sys.argv[0])} build KIND DIR")
    build(sys.argv[2], Path(sys.argv[3]))
    print(f"built {sys.argv[2]} in {sys.argv[3]}")
