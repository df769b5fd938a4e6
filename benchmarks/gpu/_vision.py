"""Images, decoding datasets, models and timers shared by the what_if, cache and doctor checks.

Seed 001's setting: a torchvision ResNet-18 on 224x224 batches of 128. Where torchvision is
missing (it cannot load on the CPU machines this project is developed on, and a ``--dry`` run
never imports it) :class:`ResNetLike` stands in, and the checks say so in their figures.

- :func:`jpeg_blobs` / :func:`write_jpegs`: JPEG bytes made with PIL, in memory or as files.
- :class:`JpegBlobs` / :class:`JpegFiles`: decode (and resize) a JPEG in ``__getitem__``, on
  every access: the deterministic, expensive part of a sample that a cache removes.
- :func:`build_net`: ResNet-18 (torchvision) or the stand-in, with a line saying which.
- :class:`RegionTimer`: the seconds of a timed region, by CUDA events on a GPU (one
  ``torch.cuda.synchronize()`` at the end of the region) and by the wall clock on a CPU.
- :func:`run_group`: a child process in a process group of its own, killed as a group when
  it overruns; :func:`deadline`: when a check stops starting work.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import Dataset

__all__ = [
    "TIMEOUT_ENV",
    "JpegBlobs",
    "JpegFiles",
    "RegionTimer",
    "ResNetLike",
    "build_net",
    "deadline",
    "decode",
    "jpeg_blobs",
    "median",
    "run_group",
    "to_float",
    "write_jpegs",
]

#: The seconds the runner gives this check, when it says (it may cut ``TIMEOUT_S`` to the budget
#: left); a check then stops starting work ``margin`` seconds before it.
TIMEOUT_ENV = "GPU_CHECK_TIMEOUT_S"


def _image(rng: np.random.Generator, label: int, width: int, height: int) -> Image.Image:
    """A picture whose colour depends on the class, with noise: JPEG compresses it realistically."""
    base = (np.array([37, 91, 151]) * (label + 1)) % 256
    noise = rng.integers(-40, 40, (height // 4 + 1, width // 4 + 1, 3))
    small = np.clip(base + noise, 0, 255).astype(np.uint8)
    return Image.fromarray(small).resize((width, height), Image.BILINEAR)


def jpeg_blobs(
    n: int, width: int, height: int, classes: int, seed: int = 0
) -> list[tuple[bytes, int]]:
    """``n`` JPEG files' bytes (quality 90) with their labels, made in memory."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        buf = io.BytesIO()
        _image(rng, i % classes, width, height).save(buf, format="JPEG", quality=90)
        out.append((buf.getvalue(), i % classes))
    return out


def write_jpegs(
    directory: Path, n: int, width: int, height: int, classes: int, seed: int = 0
) -> list[Path]:
    """Write ``n`` JPEGs named ``{i:05d}_{label}.jpg`` into ``directory``; return their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, (blob, label) in enumerate(jpeg_blobs(n, width, height, classes, seed)):
        path = directory / f"{i:05d}_{label}.jpg"
        path.write_bytes(blob)
        paths.append(path)
    return paths


def decode(source: bytes | Path, size: int) -> torch.Tensor:
    """Decode a JPEG and resize it to ``size`` x ``size``: a uint8 CHW tensor."""
    stream = io.BytesIO(source) if isinstance(source, bytes) else source
    with Image.open(stream) as img:
        img = img.convert("RGB").resize((size, size), Image.BILINEAR)
        pixels = np.asarray(img).copy()
    return torch.from_numpy(pixels).permute(2, 0, 1).contiguous()


class JpegBlobs(Dataset[tuple[torch.Tensor, int]]):
    """JPEG bytes in memory, decoded and resized on every access."""

    def __init__(self, blobs: Sequence[tuple[bytes, int]], size: int) -> None:
        self.blobs, self.size = list(blobs), size

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        blob, label = self.blobs[index]
        return decode(blob, self.size), label


class JpegFiles(Dataset[tuple[torch.Tensor, int]]):
    """JPEG files, decoded and resized on every access; ``repeat`` lists the files that often."""

    def __init__(self, files: Sequence[Path], size: int, repeat: int = 1) -> None:
        self.files, self.size, self.repeat = list(files), size, repeat

    def __len__(self) -> int:
        return len(self.files) * self.repeat

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path = self.files[index % len(self.files)]
        return decode(path, self.size), int(path.stem.rsplit("_", 1)[1])


def to_float(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 [0, 255] -> float [-1, 1], on the device after the copy (4x fewer bytes moved)."""
    return pixels.float().div_(127.5).sub_(1.0)


class _Block(nn.Module):
    """ResNet's basic block: two 3x3 convolutions and a shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
            nn.BatchNorm2d(cout),
        )
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.body(x) + self.shortcut(x))


class ResNetLike(nn.Module):
    """A ResNet of basic blocks: ResNet-18's layout at ``widths=(64, 128, 256, 512), blocks=2``.

    ``stem="imagenet"`` is ResNet's 7x7 stride-2 convolution and max-pool (224x224 inputs);
    ``stem="small"`` a 3x3 stride-2 convolution (32x32 toy inputs).
    """

    def __init__(
        self,
        widths: Sequence[int] = (64, 128, 256, 512),
        blocks: int = 2,
        classes: int = 1000,
        stem: str = "imagenet",
    ) -> None:
        super().__init__()
        first = widths[0]
        layers: list[nn.Module]
        if stem == "imagenet":
            layers = [
                nn.Conv2d(3, first, 7, 2, 3, bias=False),
                nn.BatchNorm2d(first),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(3, 2, 1),
            ]
        else:
            layers = [nn.Conv2d(3, first, 3, 2, 1, bias=False), nn.BatchNorm2d(first), nn.ReLU()]
        cin = first
        for i, width in enumerate(widths):
            for b in range(blocks):
                layers.append(_Block(cin, width, 2 if (b == 0 and i > 0) else 1))
                cin = width
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


def build_net(dry: bool, classes: int, seed: int = 0) -> tuple[nn.Module, str]:
    """The model and a line saying which: ResNet-18 on a GPU run, the stand-in otherwise.

    A ``--dry`` run never imports torchvision (it cannot load on this project's CPU machines);
    it gets a toy :class:`ResNetLike` for 32x32 inputs. A GPU run takes torchvision's
    ``resnet18`` and falls back to ``ResNetLike`` at ResNet-18's layout when torchvision fails
    to import, saying why.
    """
    torch.manual_seed(seed)
    if dry:
        net = ResNetLike(widths=(8, 16), blocks=1, classes=classes, stem="small")
        return net, "toy ResNet-like CNN (8/16 channels; dry: torchvision not imported)"
    try:
        from torchvision.models import resnet18
    except Exception as err:  # missing, or a build that does not match this torch
        why = f"{type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else ''}"
        net = ResNetLike(classes=classes)
        return net, f"ResNet-18-like CNN of benchmarks/gpu/_vision.py (torchvision failed: {why})"
    torch.manual_seed(seed)
    return resnet18(weights=None, num_classes=classes), "torchvision ResNet-18"


def median(values: Sequence[float]) -> float:
    """The median; NaN for no values."""
    return statistics.median(values) if values else float("nan")


class RegionTimer:
    """Seconds of a region of work: CUDA events on a GPU, the wall clock on a CPU.

    On CUDA, the device is synchronised once before the region starts (what was queued
    before is not timed) and once at its end, never inside it.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        """Wait for the device (a no-op on a CPU)."""
        if self.cuda:
            torch.cuda.synchronize()

    def time(self, work: Callable[[], Any], repeats: int) -> float:
        """Seconds ``repeats`` calls of ``work`` took."""
        self.sync()
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(repeats):
                work()
            end.record()
            torch.cuda.synchronize()
            return float(start.elapsed_time(end)) / 1000.0
        begin = time.perf_counter()
        for _ in range(repeats):
            work()
        return time.perf_counter() - begin


def deadline(start: float, planned_s: float, margin_s: float) -> float:
    """The ``time.monotonic()`` past which a check starts no new work.

    ``planned_s`` after ``start``, or ``margin_s`` before the timeout the runner gave the check
    (:data:`TIMEOUT_ENV`, when set) if that comes sooner.
    """
    end = start + planned_s
    given = os.environ.get(TIMEOUT_ENV)
    try:
        return min(end, start + float(given) - margin_s) if given else end
    except ValueError:
        return end


def run_group(
    cmd: Sequence[str], timeout_s: float, env: dict[str, str], cwd: Path
) -> tuple[int | None, str, bool]:
    """Run ``cmd`` in a new session; past ``timeout_s`` SIGKILL its whole process group.

    Returns the exit code (None when killed), stdout and stderr together, and whether it timed
    out. The group takes its DataLoader workers, fill processes and compile workers with it.
    """
    proc = subprocess.Popen(
        list(cmd),
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=max(1.0, timeout_s))
        return proc.returncode, output or "", False
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return None, output or "", True
