"""The advisor's vocabulary: its finding ids, :class:`AdvisorFinding`, and the run's inputs.

Every check in this package returns a list of :class:`AdvisorFinding` built from plain inputs:
the settings of a dataloader (:class:`LoaderSettings`), the device the run trains on
(:class:`DeviceInfo`), a module, measured seconds. :data:`FINDING_IDS` lists every id the
checks can report, in the order the advisor's table lists them; :data:`GPU_ONLY_IDS` the ones
that only mean something on a CUDA GPU. The checks themselves import this module and none of
each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from lightning_speedpack.core.findings import Finding, Severity

__all__ = ["FINDING_IDS", "GPU_ONLY_IDS", "AdvisorFinding", "DeviceInfo", "LoaderSettings"]

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

# The layer types several checks recognise (shapes, GPU, training loop).
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
        pays_on: ``"GPU"`` for advice found on a run off CUDA that only speeds up a CUDA GPU
            (tensor-core multiples); the doctor's report labels it "on GPU" and lists it last.

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
    pays_on: str | None = None

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
            pays_on=self.pays_on,
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
