"""GPU check ``throughput``: ThroughputLogger's samples/s, FLOPs, MFU and NVML figures, checked.

The fit: an MLP (256 -> 8192 -> 8192 -> 8192 -> 256, GELU) in ``bf16-mixed`` on batches of
8,192 prebuilt pageable samples, 160 steps, ``ThroughputLogger(window=40, log_every_n_steps=40,
flops_per_batch="auto")``; a callback placed after it records a CUDA event at every
``on_train_batch_end`` (read after the fit, one ``synchronize`` at the end).

- ``throughput/samples_per_sec``: each window the logger logged after the first (the first holds
  the warm-up and the FLOP-counted step) against the same window's steps timed by the CUDA
  events: the batch ends that close the window's first and last steps, on the device's clock.
  Within 3%: the logger reads ``time.perf_counter`` on the host and never synchronises; once the
  host is paced by the device (a full launch queue, the pageable copy), its window is the
  device's.
- ``throughput/flops_per_batch``: ``flops_per_sec / batches_per_sec`` as logged (the logger's
  ``FlopCounterMode`` count of the first step) against the count by hand: ``2*B*in*out`` per
  linear layer forward, the same for each weight gradient and for each input gradient but the
  first layer's (its input needs none). Equal within 0.1%.
- ``throughput/mfu``: the logged MFU (FLOP/s over the datasheet bf16 peak the pack's table gives
  this device) against the hand count's FLOPs over the CUDA-event window, over the same peak:
  within 3%. The figure also gives the MFU against the bf16 peak measured here.
- ``throughput/peak``: an 8192^3 bf16 matmul (3 warm-ups, best of 3 runs of 10, CUDA events)
  against the pack's table entry for this device: the measured rate must be 50-100% of it (a
  datasheet dense peak a matmul beats is wrong; one twice what a matmul reaches is the sparse
  figure or another chip's).
- ``throughput/nvml``: the ``system/gpu/*`` keys of the last log (the NVML sampler thread):
  utilisation in (0, 100], power in (0, 1200] W, temperature in (0, 100) C, memory used at least
  this process's reserved memory (``torch.cuda.memory_reserved`` at the end of training), at most
  the device's total, and within 1.5 GB of CUDA's own ``total - free`` (``mem_get_info``).

Dry (CPU, what ran before the first GPU): a toy MLP in fp32, 60 steps, windows of 20 timed by
``time.perf_counter`` in the same callback (within 10%: the same clock, so this checks the
window's bookkeeping, not asynchronous timing); the FLOPs line as on a GPU; MFU, peak and NVML
are SKIP (no CUDA: the pack logs none of them off CUDA).
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytorch_lightning as pl
import torch
from torch import nn
from torch.nn import functional as F

from benchmarks.gpu.context import Context, result
from benchmarks.gpu.helpers import cuda_ms, fmt, gap, loader, pct, trainer

__all__ = ["NAME", "TIMEOUT_S", "run"]

NAME = "throughput"
TIMEOUT_S = {"gpu": 35.0, "dry": 60.0}

PREFIX = "throughput/"
#: (layer widths, batch size, steps, window) on a GPU and dry
GPU_SIZES = ((256, 8192, 8192, 8192, 256), 8192, 160, 40)
DRY_SIZES = ((32, 64, 64, 32), 64, 60, 20)


class MLP(pl.LightningModule):
    """Linear layers of ``dims`` with GELU between them; mean squared error."""

    def __init__(self, dims: tuple[int, ...]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(itertools.pairwise(dims)):
            layers.append(nn.Linear(a, b))
            if i < len(dims) - 2:
                layers.append(nn.GELU())
        self.net = nn.Sequential(*layers)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self.net(x).float(), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-4)


def flops_by_hand(dims: tuple[int, ...], batch: int) -> int:
    """FLOPs of one training step as ``FlopCounterMode`` counts them (matmuls only)."""
    total = 0
    for i, (a, b) in enumerate(itertools.pairwise(dims)):
        matmul = 2 * batch * a * b
        total += matmul * (2 if i == 0 else 3)  # forward, weight grad (+ input grad after 0)
    return total


class StepEnds(pl.Callback):
    """A CUDA event (or, dry, ``perf_counter``) at every training batch's end; memory at the end."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.events: list[Any] = []
        self.times: list[float] = []
        self.memory: dict[str, float] = {}

    def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.events.append(event)
        else:
            self.times.append(time.perf_counter())

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.cuda:  # before Lightning's teardown empties the cache
            free, total = torch.cuda.mem_get_info()
            self.memory = {
                "reserved_gb": torch.cuda.memory_reserved() / 1e9,
                "used_gb": (total - free) / 1e9,
                "total_gb": total / 1e9,
            }

    def seconds(self, first: int, last: int) -> float:
        """From the end of batch ``first`` to the end of batch ``last`` (1-based, = global step)."""
        if self.cuda:
            return float(self.events[first - 1].elapsed_time(self.events[last - 1])) / 1000.0
        return self.times[last - 1] - self.times[first - 1]


def measured_bf16_peak(n: int = 8192) -> float:
    """FLOP/s of an ``n``^3 bf16 matmul: 3 warm-ups, then the best of 3 timed runs of 10."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty_like(a)

    def matmul() -> None:
        torch.mm(a, b, out=c)

    for _ in range(3):
        matmul()
    best_ms = min(cuda_ms(matmul, repeats=10) for _ in range(3))
    return 10 * 2 * n**3 / (best_ms / 1000.0)


def run(ctx: Context) -> list[dict[str, Any]]:
    from lightning_speedpack import ThroughputLogger
    from lightning_speedpack.throughput.peak_flops import peak_flops

    cuda = not ctx.dry
    dims, batch, steps, window = GPU_SIZES if cuda else DRY_SIZES
    precision = "bf16-mixed" if cuda else "32-true"
    g = torch.Generator().manual_seed(0)
    batches = [
        (torch.randn(batch, dims[0], generator=g), torch.randn(batch, dims[-1], generator=g))
        for _ in range(2)
    ]
    monitor = ThroughputLogger(window=window, log_every_n_steps=window, flops_per_batch="auto")
    ends = StepEnds(cuda)
    trainer(ctx, max_steps=steps, precision=precision, callbacks=[monitor, ends]).fit(
        MLP(dims), loader(batches, steps)
    )
    if cuda:
        torch.cuda.synchronize()
    lines: list[dict[str, Any]] = []

    # -- samples/s against the independent clock, window by window
    logged = [(int(s), float(v)) for s, v in monitor.doctor_figures()["samples_per_sec_over_steps"]]
    compared = []
    for step, pack_rate in logged:
        if step <= window or step > len(ends.events or ends.times):
            continue
        reference = window * batch / ends.seconds(step - window, step)
        compared.append({"step": step, "pack": pack_rate, "reference": reference})
    bound = 0.03 if cuda else 0.10
    clock = "CUDA events" if cuda else "perf_counter in a callback (same clock: bookkeeping only)"
    if compared:
        worst = max(compared, key=lambda c: gap(c["pack"], c["reference"]))
        worst_gap = gap(worst["pack"], worst["reference"])
        last = compared[-1]
        lines.append(
            result(
                "throughput/samples_per_sec",
                "PASS" if worst_gap <= bound else "FAIL",
                f"{fmt(last['pack'])} samples/s vs {fmt(last['reference'])} from {clock} "
                f"(step {last['step']}); worst of {len(compared)} windows {pct(worst_gap)} "
                f"at step {worst['step']}",
                f"within {pct(bound)}",
                windows=compared,
                logged=logged,
            )
        )
    else:
        lines.append(
            result(
                "throughput/samples_per_sec",
                "FAIL",
                f"no window to compare: logged {logged}, {steps} steps",
                f"within {pct(bound)}",
            )
        )

    # -- FLOPs per batch against the count by hand
    metrics = dict(monitor.last_metrics)
    hand = flops_by_hand(dims, batch)
    flops_rate = metrics.get(f"{PREFIX}flops_per_sec")
    batches_rate = metrics.get(f"{PREFIX}batches_per_sec")
    if flops_rate and batches_rate:
        per_batch = flops_rate / batches_rate
        lines.append(
            result(
                "throughput/flops_per_batch",
                "PASS" if gap(per_batch, hand) <= 1e-3 else "FAIL",
                f"{fmt(per_batch)} FLOPs/batch logged vs {fmt(hand)} counted by hand ({precision})",
                "equal (0.1%)",
                logged=per_batch,
                by_hand=hand,
            )
        )
    else:
        lines.append(
            result(
                "throughput/flops_per_batch",
                "FAIL",
                f"no FLOP/s logged (keys {sorted(metrics)})",
                "equal (0.1%)",
            )
        )

    if not cuda:
        keys = sorted(k for k in metrics if k.startswith("system/gpu/") or k.endswith("mfu"))
        for name, why in (
            ("throughput/mfu", "the pack logs MFU on CUDA only (a device peak)"),
            ("throughput/peak", "the bf16 matmul peak needs a GPU"),
            ("throughput/nvml", "the pack samples NVML on CUDA only"),
        ):
            lines.append(result(name, "SKIP", f"no CUDA: {why}", "GPU only", keys_logged=keys))
        return lines

    # -- MFU against the hand count over the CUDA-event window, same datasheet peak
    name = torch.cuda.get_device_name()
    table = peak_flops(name, precision, torch.get_float32_matmul_precision())
    measured = measured_bf16_peak()
    last_step = logged[-1][0] if logged else steps
    event_flops = hand * window / ends.seconds(last_step - window, last_step)
    pack_mfu = metrics.get(f"{PREFIX}mfu")
    if table is None or pack_mfu is None:
        lines.append(
            result(
                "throughput/mfu",
                "FAIL",
                f"no MFU logged: the pack's table has no {precision} peak for {name!r}",
                "within 3%",
                device=name,
            )
        )
    else:
        reference = event_flops / table
        lines.append(
            result(
                "throughput/mfu",
                "PASS" if gap(pack_mfu, reference) <= 0.03 else "FAIL",
                f"MFU {pct(pack_mfu)} logged vs {pct(reference)} from the hand count over CUDA "
                f"events (datasheet {fmt(table / 1e12)} TFLOP/s); {pct(event_flops / measured)} "
                f"of the bf16 peak measured here",
                "within 3%",
                pack=pack_mfu,
                reference=reference,
                table_peak=table,
                measured_peak=measured,
                achieved_flops_per_sec=event_flops,
            )
        )
    if table is None:
        lines.append(
            result(
                "throughput/peak",
                "FAIL",
                f"measured {fmt(measured / 1e12)} TFLOP/s bf16; the pack's table knows no peak "
                f"for {name!r}",
                "50-100% of the table",
                measured=measured,
            )
        )
    else:
        ratio = measured / table
        lines.append(
            result(
                "throughput/peak",
                "PASS" if 0.5 <= ratio <= 1.0 else "FAIL",
                f"8192^3 bf16 matmul {fmt(measured / 1e12)} TFLOP/s = {pct(ratio)} of the pack's "
                f"{fmt(table / 1e12)} TFLOP/s for {name!r}",
                "50-100% of the table",
                measured=measured,
                table=table,
            )
        )

    # -- NVML against bounds and CUDA's own memory figures
    gpu = {k.removeprefix("system/gpu/"): v for k, v in metrics.items() if "system/gpu/" in k}
    memory = ends.memory
    problems = []
    util, used = gpu.get("util"), gpu.get("mem_used_gb")
    power, temp = gpu.get("power_w"), gpu.get("temp_c")
    if util is None or not 0 < util <= 100:
        problems.append(f"util {util}")
    if power is None or not 0 < power <= 1200:
        problems.append(f"power {power} W")
    if temp is None or not 0 < temp < 100:
        problems.append(f"temp {temp} C")
    if used is None or not memory:
        problems.append(f"memory {used} GB ({memory})")
    else:
        if used < memory["reserved_gb"] or used > memory["total_gb"] * 1.02:
            problems.append(
                f"memory used {used:.2f} GB outside [{memory['reserved_gb']:.2f}, "
                f"{memory['total_gb']:.1f}]"
            )
        if abs(used - memory["used_gb"]) > 1.5:
            problems.append(f"memory used {used:.2f} GB vs CUDA's {memory['used_gb']:.2f} GB")
    figure = (
        f"util {fmt(util)}%, mem {fmt(used)} GB (this process reserved "
        f"{fmt(memory.get('reserved_gb'))}, CUDA says {fmt(memory.get('used_gb'))} used), "
        f"{fmt(power)} W, {fmt(temp)} C"
    )
    if problems:
        figure += "; out of bounds: " + ", ".join(problems)
    lines.append(
        result(
            "throughput/nvml",
            "FAIL" if problems else "PASS",
            figure,
            "plausible; mem >= reserved, within 1.5 GB of mem_get_info",
            logged=gpu,
            cuda_memory=memory,
        )
    )
    return lines
