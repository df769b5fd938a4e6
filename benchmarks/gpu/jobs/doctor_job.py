"""The training job ``check_doctor.py`` runs plain and under ``speedpack doctor``.

A plain Lightning script with nothing of the pack's but (``--pipeline fixed``) ``CachedDataset``,
as a user would write it. Both pipelines train the same model on the same JPEG files:

- ``slow`` (seed 001's mistakes): each JPEG decoded and resized in ``__getitem__`` on every
  access, ``num_workers=0``, fp32, no pinned memory;
- ``fixed``: :class:`~lightning_speedpack.CachedDataset` filled before the fit (forked fill
  processes), persistent workers, ``pin_memory=True``; on a GPU also ``bf16-mixed``,
  ``channels_last`` (model and batches) and ``Trainer(benchmark=True)``. On a CPU the fixed
  job keeps fp32 and reads the cache with 0 workers (no tensor cores to pay for bf16, and
  workers' handover costs more than reading a cache on a 2-core machine).

``--result PATH`` gets the job's own clock: the seconds of ``trainer.fit`` (a
``torch.cuda.synchronize()`` at its end), the samples it trained and where the cache lived.

``--pairs N`` (the fixed pipeline) measures what the doctor costs this job, in this one process:
after one untimed fit, ``N`` rounds of one fit plain and one under the doctor's default set
(:class:`~lightning_speedpack.doctor.runner.DoctorSession`, as ``speedpack doctor`` attaches it),
the order swapped every round, each with a new Trainer, model and DataLoader (its workers started
anew, as in any fit); ``--result`` then gets both lists of ``trainer.fit`` seconds.

    PYTHONPATH=. python benchmarks/gpu/jobs/doctor_job.py --pipeline slow --data-dir DIR ...
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader

from benchmarks.gpu._vision import JpegFiles, build_net, to_float

MIN_SHM_FOR_WORKERS = 1 << 30


def _doctor() -> Any:
    """The doctor's default set attached to the Trainers built inside (a context manager)."""
    from lightning_speedpack.doctor.runner import DoctorSession

    return DoctorSession().installed()


class Classifier(pl.LightningModule):
    def __init__(self, dry: bool, classes: int, channels_last: bool) -> None:
        super().__init__()
        self.net, self.description = build_net(dry, classes)
        self.channels_last = channels_last
        if channels_last:
            self.net = self.net.to(memory_format=torch.channels_last)  # type: ignore[call-overload]

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        pixels, labels = batch
        x = to_float(pixels)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return F.cross_entropy(self.net(x), labels)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def _cache(dataset: JpegFiles, key: str, tmp: Path) -> tuple[Any, str]:
    """The cache in ``/dev/shm`` with room for every sample, or on disk when that does not fit."""
    from lightning_speedpack import CachedDataset

    room = int(len(dataset) * (3 * dataset.size**2 + 1024) * 1.1) + (16 << 20)
    try:
        return CachedDataset(dataset, key=key, max_bytes=room), "shared"
    except (RuntimeError, ValueError):  # more than /dev/shm has free
        path = tmp / "cache.bin"
        return CachedDataset(dataset, key=key, max_bytes=room, storage="disk", path=path), "disk"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pipeline", choices=("slow", "fixed"), required=True)
    parser.add_argument("--accelerator", choices=("gpu", "cpu"), default="gpu")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1, help="list the files this often")
    parser.add_argument("--workers", type=int, default=4, help="the fixed pipeline's workers")
    parser.add_argument("--result", type=Path, default=None)
    parser.add_argument("--pairs", type=int, default=0, help="plain/doctor rounds (fixed only)")
    args = parser.parse_args()
    if args.pairs and args.pipeline != "fixed":
        parser.error("--pairs measures the fixed pipeline")
    gpu = args.accelerator == "gpu"
    dry = not gpu
    if dry:
        torch.set_num_threads(1)  # a shared 2-core machine: spinning intra-op threads stall
    files = sorted(args.data_dir.glob("*.jpg"))
    dataset = JpegFiles(files, args.size, repeat=args.repeat)
    fixed = args.pipeline == "fixed"
    tmp = Path(tempfile.mkdtemp(prefix="speedpack-doctor-job-"))
    cache, storage, fill_s = None, None, 0.0
    workers = 0
    if fixed:
        cache, storage = _cache(dataset, f"gpu-check-doctor-{args.size}-{len(dataset)}", tmp)
        start = time.perf_counter()
        cache.fill()
        fill_s = time.perf_counter() - start
        shm_free = shutil.disk_usage("/dev/shm").free if Path("/dev/shm").exists() else 0
        workers = args.workers if shm_free >= MIN_SHM_FOR_WORKERS else 0
    data = cache if cache is not None else dataset
    precision = "bf16-mixed" if fixed and gpu else "32-true"

    def fit(doctor: bool = False, epochs: int = args.epochs) -> tuple[float, str]:
        """One fit (under the doctor's default set if ``doctor``): its seconds, the model."""
        loader = DataLoader(
            data,
            batch_size=args.batch,
            shuffle=True,
            num_workers=workers,
            persistent_workers=workers > 0,
            pin_memory=fixed and gpu,
        )
        model = Classifier(dry, args.classes, channels_last=fixed and gpu)
        with _doctor() if doctor else contextlib.nullcontext():
            trainer = pl.Trainer(
                accelerator=args.accelerator,
                devices=1,
                max_epochs=epochs,
                precision=precision,  # type: ignore[arg-type]
                benchmark=fixed and gpu,
                logger=False,
                enable_progress_bar=False,
                enable_checkpointing=False,
                enable_model_summary=False,
                num_sanity_val_steps=0,
            )
        start = time.perf_counter()
        trainer.fit(model, loader)
        if gpu:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        del loader, trainer  # persistent workers exit before the cache closes
        return seconds, model.description

    if args.pairs:
        fit(epochs=1)  # untimed: cuDNN's autotuning, the first kernels
        fits: dict[str, list[float]] = {"plain": [], "doctor": []}
        for i in range(args.pairs):
            for doctor in (False, True) if i % 2 == 0 else (True, False):
                fits["doctor" if doctor else "plain"].append(fit(doctor)[0])
            if args.result is not None:  # after each round: a killed job keeps its rounds
                args.result.write_text(json.dumps({"pipeline": "fixed", "pairs": fits}))
        if cache is not None:
            cache.close()
        shutil.rmtree(tmp, ignore_errors=True)
        return
    fit_s, description = fit()
    samples = len(data) * args.epochs
    if args.result is not None:
        args.result.write_text(
            json.dumps(
                {
                    "pipeline": args.pipeline,
                    "fit_s": fit_s,
                    "samples": samples,
                    "samples_per_sec": samples / fit_s,
                    "fill_s": fill_s,
                    "workers": workers,
                    "storage": storage,
                    "precision": precision,
                    "model": description,
                }
            )
        )
    if cache is not None:
        cache.close()
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
