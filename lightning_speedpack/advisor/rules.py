"""The speed-up guides' checklist as pure functions: one check per finding id.

Each ``check_*`` function takes plain inputs (a dataloader's settings, a module, a
:class:`DeviceInfo`, measured seconds) and returns a list of :class:`AdvisorFinding` (empty when
the run is fine). :class:`~lightning_speedpack.SpeedAdvisor` only gathers the inputs from a
Lightning run and calls these, so every finding can be tested here without a Trainer, and the
GPU-only ones without a GPU (pass ``DeviceInfo(type="cuda", has_tensor_cores=True)``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from lightning_speedpack.advisor.dims import find_unaligned_dims, round_up
from lightning_speedpack.core.events import DataVerdict
from lightning_speedpack.core.findings import Finding, Severity

__all__ = [
    "FINDING_IDS",
    "GPU_ONLY_IDS",
    "AdvisorFinding",
    "DeviceInfo",
    "LoaderSettings",
    "check_batch_size_multiple",
    "check_channels_last",
    "check_conv_bias_before_bn",
    "check_cudnn_benchmark",
    "check_data_wait",
    "check_dataloader_workers",
    "check_dataparallel",
    "check_eval_grad",
    "check_layer_dims",
    "check_persistent_workers",
    "check_pin_memory",
    "check_precision",
    "check_sync_batchnorm",
    "check_zero_grad",
    "gpu_skip_reason",
    "has_conv",
    "with_measured_workers",
]

FINDING_IDS = (
    "dataloader-workers",
    "pin-memory",
    "persistent-workers",
    "data-wait",
    "batch-size-multiple",
    "layer-dims-multiple",
    "conv-bias-before-bn",
    "precision",
    "cudnn-benchmark",
    "channels-last",
    "dataparallel",
    "zero-grad",
    "eval-grad",
    "sync-batchnorm",
)
"""Every finding id the advisor can report, in the order its table lists them."""

GPU_ONLY_IDS = frozenset({"pin-memory", "precision", "cudnn-benchmark", "channels-last"})
"""Findings that only mean something on a CUDA GPU; skipped (with the reason) elsewhere."""

_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_BATCHNORM = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


@dataclass
class AdvisorFinding:
    """One checklist item the run fails: a stable ``id``, severity, evidence and the fix.

    Attributes:
        id: one of :data:`FINDING_IDS`, stable across releases (filter on it).
        severity: ``"info"``, ``"warning"`` or ``"error"``.
        message: what is wrong, in one sentence.
        evidence: what in this run shows it: the measured value, the layer name or the setting.
        fix: what to change.
        location: where: a module name (``"net.0"``), a dataloader (``"train_dataloader"``) or a
            setting (``"Trainer(precision)"``); None when the finding is about the whole run.
        figures: the measured numbers behind the finding, JSON-able.

    Example:
        >>> f = AdvisorFinding("pin-memory", "warning", "pinned memory is off", "pin_memory=False",
        ...                    "DataLoader(pin_memory=True)", location="train_dataloader")
        >>> f.to_finding().component, f.to_finding().id
        ('advisor', 'pin-memory')
    """

    id: str
    severity: Severity
    message: str
    evidence: str
    fix: str
    location: str | None = None
    figures: dict[str, Any] = field(default_factory=dict)

    def to_finding(self) -> Finding:
        """Return this finding as the doctor's :class:`~lightning_speedpack.doctor.report.Finding`.

        The component is ``"advisor"``; the evidence is appended to the message and kept in
        ``figures["evidence"]``.
        """
        return Finding(
            component="advisor",
            id=self.id,
            message=f"{self.message} ({self.evidence})",
            location=self.location,
            figures={**self.figures, "evidence": self.evidence},
            severity=self.severity,
            fix=self.fix,
        )


@dataclass(frozen=True)
class DeviceInfo:
    """The device a run trains on, as the GPU-only checks need it.

    Build it from the run with :meth:`from_device`; tests inject one, e.g.
    ``DeviceInfo("cuda", "A100", (8, 0), has_tensor_cores=True)``, to exercise the GPU-only
    checks on a CPU machine.

    Attributes:
        type: the torch device type (``"cpu"``, ``"cuda"``, ``"mps"``, ...).
        name: the device's marketing name, for messages (``""`` when unknown).
        capability: CUDA compute capability ``(major, minor)``, None off CUDA.
        has_tensor_cores: fp16/bf16 matrix units (CUDA capability 7.0 and newer).

    Example:
        >>> DeviceInfo.from_device(torch.device("cpu"))
        DeviceInfo(type='cpu', name='', capability=None, has_tensor_cores=False)
    """

    type: str
    name: str = ""
    capability: tuple[int, int] | None = None
    has_tensor_cores: bool = False

    @property
    def is_gpu(self) -> bool:
        """True on a CUDA (or ROCm, which torch also calls ``cuda``) device."""
        return self.type == "cuda"

    @property
    def supports_bf16(self) -> bool:
        """True when bf16 tensor-core math is available (CUDA capability 8.0, Ampere, and newer)."""
        return self.is_gpu and self.capability is not None and self.capability >= (8, 0)

    @classmethod
    def from_device(cls, device: torch.device) -> DeviceInfo:
        """Describe ``device``; queries CUDA only when it is a CUDA device."""
        if device.type != "cuda":
            return cls(type=device.type)
        major, minor = torch.cuda.get_device_capability(device)
        return cls(
            type="cuda",
            name=torch.cuda.get_device_name(device),
            capability=(major, minor),
            has_tensor_cores=major >= 7,
        )


@dataclass(frozen=True)
class LoaderSettings:
    """The settings of one dataloader that the data-loading checks read.

    Example:
        >>> from torch.utils.data import DataLoader
        >>> s = LoaderSettings.from_dataloader(DataLoader(range(10), batch_size=4), "train")
        >>> s.num_workers, s.pin_memory, s.persistent_workers, s.batch_size
        (0, False, False, 4)
    """

    name: str
    num_workers: int = 0
    pin_memory: bool = False
    persistent_workers: bool = False
    batch_size: int | None = None

    @classmethod
    def from_dataloader(cls, loader: DataLoader[Any], name: str) -> LoaderSettings:
        """Read the settings of ``loader`` (the batch size also from its batch sampler)."""
        batch_size = loader.batch_size
        if batch_size is None:
            batch_size = getattr(loader.batch_sampler, "batch_size", None)
        return cls(
            name=name,
            num_workers=int(loader.num_workers),
            pin_memory=bool(loader.pin_memory),
            persistent_workers=bool(loader.persistent_workers),
            batch_size=batch_size if isinstance(batch_size, int) else None,
        )


def gpu_skip_reason(device: DeviceInfo) -> str | None:
    """Why the GPU-only checks do not apply to ``device``, or None when they do."""
    if device.is_gpu:
        return None
    return f"the run trains on {device.type!r}, not a CUDA GPU"


def has_conv(module: nn.Module) -> bool:
    """True when ``module`` contains a 1-, 2- or 3-D convolution (transposed ones included)."""
    return any(isinstance(m, (*_CONV, nn.modules.conv._ConvTransposeNd)) for m in module.modules())


def check_dataloader_workers(
    loader: LoaderSettings, cpu_cores: int, local_processes: int = 1
) -> list[AdvisorFinding]:
    """``dataloader-workers``: no worker processes, or more than this process's share of the cores.

    Args:
        loader: the dataloader's settings.
        cpu_cores: CPU cores this machine gives the run (its affinity set).
        local_processes: training processes on this machine (one per device under DDP).
    """
    share = max(1, cpu_cores // max(1, local_processes))
    if loader.num_workers == 0:
        return [
            AdvisorFinding(
                "dataloader-workers",
                "warning",
                "batches are loaded in the training process, so the step waits for every batch",
                f"{loader.name}: num_workers=0",
                location=loader.name,
                fix=f"DataLoader(num_workers={min(share, 8)}, ...) loads the next batches in "
                "background processes while the step runs",
                figures={"num_workers": 0, "cpu_cores_per_process": share},
            )
        ]
    if loader.num_workers > share:
        return [
            AdvisorFinding(
                "dataloader-workers",
                "warning",
                "more dataloader workers than CPU cores per training process: they compete for "
                "the cores and each holds its own batches in shared memory (/dev/shm)",
                f"{loader.name}: num_workers={loader.num_workers}, {cpu_cores} cores / "
                f"{local_processes} process(es) = {share} per process",
                location=loader.name,
                fix=f"DataLoader(num_workers={share}, ...)",
                figures={"num_workers": loader.num_workers, "cpu_cores_per_process": share},
            )
        ]
    return []


def with_measured_workers(
    found: list[AdvisorFinding], measured: DataVerdict | None, where: str = "train_dataloader"
) -> list[AdvisorFinding]:
    """``dataloader-workers`` with the number of workers a measurement asked for.

    When the data profiler measured the run as data-bound (its loader and model ceilings),
    the rule-of-thumb worker count of the ``dataloader-workers`` finding gives way to the
    measured one; a data-bound run with no such finding gets one. Any other verdict leaves
    ``found`` as it is.

    Example:
        >>> v = DataVerdict("data", 300.0, 2400.0, workers_needed=6,
        ...                 per_worker_samples_per_sec=400.0, num_workers=0)
        >>> [f.fix for f in with_measured_workers([], v)]  # doctest: +NORMALIZE_WHITESPACE
        ['DataLoader(num_workers=6, persistent_workers=True): measured, one loading process
          delivers 400 samples/s and the model consumes 2,400']
    """
    if measured is None or measured.bound != "data" or not measured.workers_needed:
        return found
    per_worker = measured.per_worker_samples_per_sec or 0.0
    model = measured.model_samples_per_sec or 0.0
    fix = (
        f"DataLoader(num_workers={measured.workers_needed}, persistent_workers=True): measured, "
        f"one loading process delivers {per_worker:,.0f} samples/s and the model consumes "
        f"{model:,.0f}"
    )
    figures = {
        "num_workers": measured.num_workers,
        "workers_needed": measured.workers_needed,
        "per_worker_samples_per_sec": per_worker,
        "loader_ceiling_samples_per_sec": measured.loader_samples_per_sec,
        "model_ceiling_samples_per_sec": model,
    }
    kept = [f for f in found if f.id != "dataloader-workers"]
    old = next((f for f in found if f.id == "dataloader-workers"), None)
    measured_finding = AdvisorFinding(
        "dataloader-workers",
        "warning",
        "the loader cannot feed the model: more worker processes would close the gap",
        f"loader {measured.loader_samples_per_sec or 0.0:,.0f} samples/s with "
        f"num_workers={measured.num_workers}, model {model:,.0f} samples/s",
        fix,
        location=old.location if old is not None else where,
        figures={**(old.figures if old is not None else {}), **figures},
    )
    return [measured_finding, *kept]


def check_pin_memory(loader: LoaderSettings, device: DeviceInfo) -> list[AdvisorFinding]:
    """``pin-memory``: ``pin_memory=False`` while training on a GPU (GPU-only)."""
    if not device.is_gpu or loader.pin_memory:
        return []
    return [
        AdvisorFinding(
            "pin-memory",
            "warning",
            "batches are copied to the GPU from pageable memory, which cannot overlap with compute",
            f"{loader.name}: pin_memory=False on {device.name or 'a CUDA GPU'}",
            location=loader.name,
            fix="DataLoader(pin_memory=True, ...) (Lightning then copies with non_blocking=True)",
        )
    ]


def check_persistent_workers(
    loader: LoaderSettings, planned_epochs: int | None
) -> list[AdvisorFinding]:
    """``persistent-workers``: worker processes restarted every epoch of a several-epoch run.

    Args:
        loader: the dataloader's settings.
        planned_epochs: epochs the run will train, None when unbounded.
    """
    several = planned_epochs is None or planned_epochs > 1
    if loader.num_workers == 0 or loader.persistent_workers or not several:
        return []
    epochs = "an unbounded number of" if planned_epochs is None else str(planned_epochs)
    return [
        AdvisorFinding(
            "persistent-workers",
            "warning",
            "the dataloader's worker processes are started again at every epoch, and the step "
            "waits while they assemble their first batches",
            f"{loader.name}: num_workers={loader.num_workers}, persistent_workers=False, "
            f"{epochs} epochs",
            location=loader.name,
            fix="DataLoader(persistent_workers=True, ...)",
            figures={"planned_epochs": planned_epochs},
        )
    ]


def check_data_wait(
    wait_s: float, step_s: float, steps: int, threshold: float = 0.2, min_wait_s: float = 1e-3
) -> list[AdvisorFinding]:
    """``data-wait``: more than ``threshold`` of the step time spent waiting for the next batch.

    Args:
        wait_s: seconds between the end of one training batch and the start of the next,
            summed over the measured steps (validation excluded).
        step_s: seconds inside the measured training batches, summed.
        steps: how many steps were measured.
        threshold: the fraction of ``wait_s + step_s`` above which the finding fires.
        min_wait_s: the finding also needs a mean wait of at least this many seconds per
            step: below a millisecond the "wait" is the training loop's own bookkeeping
            between steps (tiny models), which no data-loading fix removes.
    """
    total = wait_s + step_s
    if steps == 0 or total <= 0:
        return []
    fraction = wait_s / total
    if fraction <= threshold or wait_s / steps < min_wait_s:
        return []
    return [
        AdvisorFinding(
            "data-wait",
            "error" if fraction > 0.5 else "warning",
            f"{fraction:.0%} of the training time waits for the next batch",
            f"measured over {steps} steps: {wait_s * 1e3 / steps:.1f} ms waiting vs "
            f"{step_s * 1e3 / steps:.1f} ms in the step, per step",
            fix="cache the deterministic preprocessing with lightning_speedpack.CachedDataset, "
            "add dataloader workers, or move the data to local storage or RAM",
            figures={"data_wait_fraction": round(fraction, 4), "steps": steps},
        )
    ]


def check_batch_size_multiple(
    batch_size: int | None,
    device: DeviceInfo,
    where: str = "train_dataloader",
    multiple_of: int = 8,
) -> list[AdvisorFinding]:
    """``batch-size-multiple``: a batch size that is not a multiple of 8.

    Severity ``warning`` on a tensor-core GPU, where it costs speed, ``info`` elsewhere.
    """
    if batch_size is None or batch_size % multiple_of == 0:
        return []
    return [
        AdvisorFinding(
            "batch-size-multiple",
            "warning" if device.has_tensor_cores else "info",
            f"the batch size is not a multiple of {multiple_of}, so fp16/bf16 matrix products "
            "cannot use tensor cores fully",
            f"{where}: batch_size={batch_size}",
            location=where,
            fix=f"batch_size={_nearest_multiples(batch_size, multiple_of)}, or let "
            "lightning_speedpack.BatchSizeTuner pick the largest multiple that fits",
            figures={"batch_size": batch_size},
        )
    ]


def _nearest_multiples(value: int, multiple_of: int) -> str:
    up, down = round_up(value, multiple_of), value // multiple_of * multiple_of
    return str(up) if down < multiple_of else f"{up} or {down}"


def check_layer_dims(
    module: nn.Module, device: DeviceInfo, multiple_of: int = 8
) -> list[AdvisorFinding]:
    """``layer-dims-multiple``: layer dimensions not multiples of 8, one finding per module.

    Dimensions smaller than ``multiple_of`` (3 RGB input channels, a 1-unit regression head)
    are not reported: padding them would cost more than it saves. Severity ``warning`` on a
    tensor-core GPU, ``info`` elsewhere; an output vocabulary is called out in the message.
    """
    by_module: dict[str, list[Any]] = {}
    for dim in find_unaligned_dims(module, multiple_of):
        if dim.value >= multiple_of:
            by_module.setdefault(dim.module, []).append(dim)
    findings = []
    for name, dims in by_module.items():
        vocab = any(d.vocab for d in dims)
        what = "the output vocabulary" if vocab else "layer dimensions"
        evidence = ", ".join(f"{d.param}={d.value}" for d in dims)
        fix = ", ".join(f"{d.param}={d.suggested}" for d in dims)
        findings.append(
            AdvisorFinding(
                "layer-dims-multiple",
                "warning" if device.has_tensor_cores else "info",
                f"{what} of {name or 'the model'} ({dims[0].layer}) not a multiple of "
                f"{multiple_of}, so fp16/bf16 tensor cores are not used fully",
                f"{name or '<root>'}: {evidence}",
                location=name or "<root>",
                fix=f"pad to {fix}"
                + (" (extra vocabulary rows are never predicted)" if vocab else ""),
                figures={d.param: d.value for d in dims},
            )
        )
    return findings


def check_conv_bias_before_bn(module: nn.Module) -> list[AdvisorFinding]:
    """``conv-bias-before-bn``: a convolution with a bias directly followed by BatchNorm.

    "Directly followed" is read from registration order: a Conv child immediately followed by a
    BatchNorm sibling over the same channels (``nn.Sequential``, and the ``conv1``/``bn1``
    pattern of ResNet-style blocks). A model that registers them apart is not detected.
    """
    findings = []
    for parent_name, parent in module.named_modules():
        children = list(parent.named_children())
        for (conv_name, conv), (bn_name, bn) in itertools.pairwise(children):
            if not (isinstance(conv, _CONV) and isinstance(bn, _BATCHNORM)):
                continue
            if conv.bias is None or bn.num_features != conv.out_channels:
                continue
            full = f"{parent_name}.{conv_name}" if parent_name else conv_name
            bn_full = f"{parent_name}.{bn_name}" if parent_name else bn_name
            findings.append(
                AdvisorFinding(
                    "conv-bias-before-bn",
                    "info",
                    "a convolution's bias is followed by BatchNorm, which subtracts it again: "
                    "wasted compute and memory",
                    f"{full} ({type(conv).__name__}, bias=True) -> {bn_full} ({type(bn).__name__})",
                    location=full,
                    fix=f"{type(conv).__name__}(..., bias=False) for {full}",
                )
            )
    return findings


def check_precision(precision: str, device: DeviceInfo) -> list[AdvisorFinding]:
    """``precision``: 32-bit training on a GPU with tensor cores (GPU-only).

    Args:
        precision: ``trainer.precision`` (``"32-true"``, ``"bf16-mixed"``, ...).
        device: the device the run trains on.
    """
    if not device.has_tensor_cores or str(precision) not in ("32-true", "32", "64-true", "64"):
        return []
    suggestion = "bf16-mixed" if device.supports_bf16 else "16-mixed"
    return [
        AdvisorFinding(
            "precision",
            "warning",
            "full-precision training on a GPU with tensor cores, which run fp16/bf16 several "
            "times faster (2-3.5x reported) with about half the activation memory",
            f"Trainer(precision={precision!r}) on {device.name or 'a tensor-core GPU'}",
            location="Trainer(precision)",
            fix=f"Trainer(precision={suggestion!r})",
        )
    ]


def check_cudnn_benchmark(
    module: nn.Module, benchmark: bool, fixed_shapes: bool | None, device: DeviceInfo
) -> list[AdvisorFinding]:
    """``cudnn-benchmark``: conv model, fixed input shapes, cuDNN autotuning off (GPU-only).

    Args:
        module: the model.
        benchmark: ``torch.backends.cudnn.benchmark`` during the run.
        fixed_shapes: whether every measured batch had the same shapes (None: not measured).
        device: the device the run trains on.
    """
    if not device.is_gpu or benchmark or not fixed_shapes or not has_conv(module):
        return []
    return [
        AdvisorFinding(
            "cudnn-benchmark",
            "warning",
            "cuDNN picks its default convolution algorithms although the input shapes never "
            "change; autotuning them once is reported 1.27-1.70x faster",
            "torch.backends.cudnn.benchmark=False, fixed batch shapes in the measured steps",
            location="torch.backends.cudnn.benchmark",
            fix='Trainer(benchmark=True), or SpeedAdvisor(apply=("cudnn_benchmark",))',
        )
    ]


def check_channels_last(module: nn.Module, device: DeviceInfo) -> list[AdvisorFinding]:
    """``channels-last``: 2-D convolutions whose weights are not ``channels_last`` (GPU-only)."""
    if not device.is_gpu:
        return []
    names = [
        name
        for name, m in module.named_modules()
        if isinstance(m, nn.Conv2d)
        and m.weight.dim() == 4
        and not m.weight.is_contiguous(memory_format=torch.channels_last)
    ]
    if not names:
        return []
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return [
        AdvisorFinding(
            "channels-last",
            "warning",
            "4-D convolutions run in NCHW memory format; tensor cores prefer NHWC "
            "(channels_last, reported 8-35% faster with mixed precision)",
            f"{len(names)} Conv2d not channels_last: {shown}",
            location=names[0],
            fix="model.to(memory_format=torch.channels_last) and the same for the input "
            'batches, or SpeedAdvisor(apply=("channels_last",))',
            figures={"conv2d_not_channels_last": len(names)},
        )
    ]


def check_dataparallel(module: nn.Module) -> list[AdvisorFinding]:
    """``dataparallel``: ``nn.DataParallel`` inside the model."""
    names = [name or "<root>" for name, m in module.named_modules() if type(m) is nn.DataParallel]
    return [
        AdvisorFinding(
            "dataparallel",
            "warning",
            "nn.DataParallel runs all GPUs from one Python process (GIL-bound, replicates the "
            "model every step)",
            f"{name} is nn.DataParallel",
            location=name,
            fix='remove nn.DataParallel and use Trainer(strategy="ddp") (one process per GPU)',
        )
        for name in names
    ]


def check_zero_grad(stale_param: str | None, step: int | None = None) -> list[AdvisorFinding]:
    """``zero-grad``: gradients zero-filled instead of set to None.

    Args:
        stale_param: the name of a parameter that still held a gradient tensor right before a
            backward that followed ``zero_grad``; None when every gradient was None.
        step: the global step where it was seen.
    """
    if stale_param is None:
        return []
    where = f" at step {step}" if step is not None else ""
    return [
        AdvisorFinding(
            "zero-grad",
            "warning",
            "zero_grad fills every gradient with zeros (a memory write per parameter) instead "
            "of releasing it",
            f"{stale_param} still held a gradient tensor before backward{where}",
            location=stale_param,
            fix="optimizer.zero_grad(set_to_none=True) (the default) in optimizer_zero_grad, "
            'or SpeedAdvisor(apply=("zero_grad_set_to_none",))',
        )
    ]


def check_eval_grad(evidence: str | None) -> list[AdvisorFinding]:
    """``eval-grad``: gradients recorded during validation.

    Args:
        evidence: what showed it (e.g. ``"validation_step output requires grad"``), or None.
    """
    if evidence is None:
        return []
    return [
        AdvisorFinding(
            "eval-grad",
            "warning",
            "validation records the autograd graph, costing memory and time for gradients "
            "nobody uses",
            evidence,
            location="validation_step",
            fix="remove torch.enable_grad()/set_grad_enabled(True) from validation, or "
            "detach what it computes",
        )
    ]


def check_sync_batchnorm(
    module: nn.Module, world_size: int, per_device_batch: int | None, tiny: int = 16
) -> list[AdvisorFinding]:
    """``sync-batchnorm``: BatchNorm over tiny per-device batches under DDP (informational).

    Args:
        module: the model.
        world_size: number of training processes.
        per_device_batch: the batch size each process sees, None when unknown.
        tiny: batches smaller than this are "tiny".
    """
    if world_size < 2 or per_device_batch is None or per_device_batch >= tiny:
        return []
    names = [name for name, m in module.named_modules() if isinstance(m, _BATCHNORM)]
    if not names:
        return []
    return [
        AdvisorFinding(
            "sync-batchnorm",
            "info",
            "BatchNorm normalises with statistics of each process's own tiny batch, which can "
            "hurt accuracy; SyncBatchNorm shares them across processes (at a collective per layer)",
            f"{len(names)} BatchNorm layer(s) (first: {names[0]}), per-device batch "
            f"{per_device_batch}, {world_size} processes",
            location=names[0],
            fix="Trainer(sync_batchnorm=True) if accuracy suffers",
            figures={"per_device_batch": per_device_batch, "world_size": world_size},
        )
    ]
