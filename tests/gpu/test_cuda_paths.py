"""The pack's CUDA paths on a real device: until the first GPU, these ran only against fakes.

Every test here is ``@pytest.mark.cuda``: skipped without a CUDA device (``tests/conftest.py``),
run by ``make gpu-check`` (its ``tests`` check) on one. Each is small: a few MiB, a few steps.

- StepTimeline's ``CopyTimer`` with real CUDA events: ``read()`` gives nothing while the copy is
  still queued behind other work (it never waits), then the copy's rate, close to a hand-timed
  one; and a real fit from a pinned loader logs ``data/h2d_gb_per_sec``.
- NVML (``throughput/nvml.py``): the real function table, values in range, memory used at least
  what this process reserved.
- SyncPointWarnings' detector with the real ``torch.cuda.set_sync_debug_mode``: a wrapped sync
  (``.item()``) and one only the debug mode sees (inside ``repeat_interleave``), each at its line,
  and the debug mode put back.
- A real ``torch.cuda.OutOfMemoryError``: recognised by ``is_oom_error``, memory back after
  ``free_memory``; BatchSizeTuner's search stopping at a size that really does not fit.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from pytorch_lightning import Callback, LightningModule, Trainer
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

pytestmark = [
    pytest.mark.cuda,
    # torch >= 2.9 on a real device: Lightning and torch's own helpers read the legacy TF32
    # flags and the old AMP names, which now warn; the suite's filterwarnings=error would turn
    # that into a failure of code that is not under test here.
    pytest.mark.filterwarnings("ignore:.*new API settings to control TF32.*:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*torch.cuda.amp.*:FutureWarning"),
    pytest.mark.filterwarnings("ignore:.*pynvml.*:FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning:pynvml.*"),
]

MIB = 2**20


def _quiet_trainer(tmp_path: Path, **kwargs: Any) -> Trainer:
    return Trainer(
        accelerator="gpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
        **kwargs,
    )


def _busy(matmuls: int) -> None:
    """Queue ``matmuls`` fp32 4096x4096 matmuls (a few milliseconds of device work each)."""
    a = torch.randn(4096, 4096, device="cuda")
    for _ in range(matmuls):
        a = a @ a
        a = a / a.norm()


def test_copy_timer_never_waits_and_reads_a_real_copy() -> None:
    from lightning_speedpack.timeline.transfer import CopyTimer, cuda_timing

    src = torch.randn(4 * MIB).pin_memory()  # 16 MiB
    dst = torch.empty(src.shape, device="cuda")
    dst.copy_(src, non_blocking=True)  # warm-up
    torch.cuda.synchronize()
    timer = CopyTimer(cuda_timing())
    _busy(8)
    assert timer.begin()
    dst.copy_(src, non_blocking=True)
    timer.end()
    timer.set_bytes(src.nbytes)
    assert timer.read() is None  # the copy waits behind the matmuls: nothing to read yet
    assert timer.busy
    torch.cuda.synchronize()
    rate = timer.read()
    assert rate is not None
    assert not timer.busy

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    dst.copy_(src, non_blocking=True)
    end.record()
    end.synchronize()
    by_hand = src.nbytes / (start.elapsed_time(end) * 1e6)
    assert 0.5 < rate / by_hand < 2.0, (rate, by_hand)  # one copy each: a loose bound


class _Corner(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(8))

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return (batch[:, :8] * self.w).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class _Prebuilt(Dataset[torch.Tensor]):
    def __init__(self, n: int) -> None:
        self.batch = torch.randn(8, MIB)  # 32 MiB
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.batch


def test_step_timeline_logs_a_device_rate_for_a_pinned_loader(tmp_path: Path) -> None:
    from lightning_speedpack import StepTimeline
    from lightning_speedpack.timeline.transfer import PINNED_KEY, RATE_KEY

    timeline = StepTimeline(log_every_n_steps=2)
    seen: list[dict[str, float]] = []

    class Collect(Callback):
        def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
            seen.append(dict(timeline.last_metrics))

    loader = DataLoader(_Prebuilt(8), batch_size=None, pin_memory=True)
    _quiet_trainer(tmp_path, max_steps=8, callbacks=[timeline, Collect()]).fit(_Corner(), loader)
    rates = [m[RATE_KEY] for m in seen if RATE_KEY in m]
    assert rates, seen[-1]
    assert all(r > 0.5 for r in rates), rates  # GB/s: any PCIe link moves more
    assert seen[-1][PINNED_KEY] == 1.0


def test_nvml_sampler_reads_real_values() -> None:
    from lightning_speedpack.throughput import nvml

    table = nvml.load_functions()
    assert not isinstance(table, str), table
    block = torch.empty(256 * MIB, dtype=torch.uint8, device="cuda")
    sampler = nvml.NvmlSampler(table, nvml.nvml_indices([torch.cuda.current_device()]), 60.0)
    try:
        sampler.sample()
        values = sampler.read()
    finally:
        sampler.stop()
    del block
    assert 0.0 <= values["util"][0] <= 100.0
    assert values["mem_used_gb"][0] >= torch.cuda.memory_reserved() / 1e9 - 1e-3
    assert 0.0 < values["power_w"][0] < 1500.0
    assert 0.0 < values["temp_c"][0] < 110.0


def test_sync_detector_counts_real_syncs_with_the_debug_mode() -> None:
    from lightning_speedpack.sync_points.detect import SyncDetector

    x = torch.arange(1, 5, device="cuda")
    detector = SyncDetector(
        sync_debug=(torch.cuda.get_sync_debug_mode, torch.cuda.set_sync_debug_mode)
    )
    detector.install()
    try:
        detector.arm(step=0)
        line = sys._getframe().f_lineno
        x.sum().item()  # line + 1: a wrapped sync
        torch.repeat_interleave(x)  # line + 2: syncs in C++ to size its output
        detector.disarm()
        assert torch.cuda.get_sync_debug_mode() == 0
    finally:
        detector.uninstall()
    found = {(f.kind, f.lineno) for f in detector.findings() if f.filename == __file__}
    assert ("item", line + 1) in found, found
    assert ("cuda sync (debug mode)", line + 2) in found, found
    assert torch.cuda.get_sync_debug_mode() == 0


def test_a_real_cuda_oom_is_recognised_and_freed() -> None:
    from lightning_speedpack.core.memory import free_memory, is_oom_error

    free_memory()  # what earlier tests left for the collector goes first (512 B once)
    before = torch.cuda.memory_allocated()
    free, total = torch.cuda.mem_get_info()
    too_big = total + free  # more than the whole card: fails at once, never fills it
    with pytest.raises(torch.cuda.OutOfMemoryError) as caught:
        torch.empty(too_big, dtype=torch.uint8, device="cuda")
    assert is_oom_error(caught.value)
    free_memory()
    assert torch.cuda.memory_allocated() == before


class _Hungry(LightningModule):
    """Each sample needs ``per_sample`` bytes of device memory in the step."""

    def __init__(self, per_sample: int) -> None:
        super().__init__()
        self.batch_size = 8
        self.per_sample = per_sample
        self.layer = nn.Linear(4, 1)
        self.data = TensorDataset(torch.randn(512, 4))
        #: (batch, bytes asked, CUDA's free bytes, reserved, allocated, the error if any) per
        #: step: the failure message says why a size did or did not fit on that card.
        self.seen: list[tuple[int, int, int, int, int, str]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        asked = x.shape[0] * self.per_sample
        free, _ = torch.cuda.mem_get_info()
        held = (torch.cuda.memory_reserved(), torch.cuda.memory_allocated())
        state = (x.shape[0], asked, free, *held)
        try:
            scratch = torch.empty(asked, dtype=torch.uint8, device=x.device)
        except torch.cuda.OutOfMemoryError as err:
            # Segments over 1 GiB, (size, allocated): a large segment of an earlier trial kept by
            # a small allocation in it (a cuBLAS workspace, say) cannot go back to the driver.
            big = [
                (seg["total_size"], seg["allocated_size"])
                for seg in torch.cuda.memory_snapshot()
                if seg["total_size"] > 1 << 30
            ]
            self.seen.append((*state, f"{str(err).splitlines()[0][:120]}; segments {big}"))
            raise
        self.seen.append((*state, ""))
        del scratch
        return self.layer(x).square().mean()

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.data, batch_size=self.batch_size)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_batch_size_tuner_stops_at_a_real_cuda_oom(tmp_path: Path) -> None:
    from lightning_speedpack import BatchSizeTuner

    torch.cuda.empty_cache()  # what earlier tests cached counts as used
    free, _total = torch.cuda.mem_get_info()
    per_sample = free // 20  # 19 samples fit at most, 20 do not
    tuner = BatchSizeTuner(max_val=256, margin=0.0, steps_per_trial=1, verbose=False)
    model = _Hungry(per_sample)
    _quiet_trainer(tmp_path, max_steps=1, callbacks=[tuner]).fit(model)
    tried = {t.batch_size: t.fits for t in tuner.trials}
    why = f"trials {tried}; per sample {per_sample:,} B of {free:,} B free; steps {model.seen}"
    assert tried[8], why
    assert tried[16], why
    assert not tried[32], why
    assert tuner.batch_size == 16, why
    assert model.batch_size == 16, why
