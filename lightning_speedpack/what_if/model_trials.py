"""The model side of the trials: the user's training step on one batch in memory, in variants.

Each model knob is a :class:`ModelVariant`: whether it applies here (and why not), and a
context manager that puts the model (and only for the trial) in the candidate's form -- the
module in ``channels_last``, an autocast around the step, ``forward`` compiled, a fused copy of
the optimizer, a cuDNN/TF32 flag -- and takes it out again. The steps themselves are
:func:`~lightning_speedpack.core.trials.run_training_steps`: the same batch from the same state
for the baseline and the candidate, every state put back bit-identically after each run, so
the losses of the two can be compared step by step (the numerics).

CUDA-only paths (``16-mixed``, ``cudnn_benchmark``, ``tf32``, device synchronisation around
the timing) were exercised on the CPU only: their applicability is tested, their trials ran
through the same code with CPU tensors.
"""

from __future__ import annotations

import inspect
import shutil
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from lightning_speedpack.core.nested import leaves

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = [
    "MODEL_VARIANTS",
    "ModelVariant",
    "Setup",
    "fused_copy",
    "to_channels_last",
]


@dataclass
class Setup:
    """What a trial step needs for one variant: its optimizer, a context per step, a batch hook."""

    optimizer: torch.optim.Optimizer | None = None
    context: Callable[[], AbstractContextManager[Any]] | None = None
    prepare: Callable[[Any], Any] | None = None
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelVariant:
    """One model-side knob: whether it applies, and the trial form of its candidate.

    Attributes:
        knob: the knob's name.
        candidate: the setting tried, as text.
        why_not: ``why_not(trainer, module, batch)`` returns why the knob does not apply here,
            or None.
        enter: ``enter(trainer, module)`` is a context manager yielding the :class:`Setup`.
        applied_by: how a user applies it (``"run"``: this callback can, at run time;
            otherwise the exact line to write).
        value: the candidate as applied (a flag's ``True``; the precision's string).
    """

    knob: str
    candidate: str
    why_not: Callable[[Any, Any, Any], str | None]
    enter: Callable[[Any, Any], AbstractContextManager[Setup]]
    applied_by: str = "run"
    value: Any = True


def _device(trainer: pl.Trainer) -> torch.device:
    return trainer.strategy.root_device  # type: ignore[no-any-return]


def _cuda_only(trainer: pl.Trainer, *_: Any) -> str | None:
    return None if _device(trainer).type == "cuda" else "needs a CUDA device (this run is on CPU)"


# ---------------------------------------------------------------- channels_last


def _convs(module: nn.Module) -> list[nn.Conv2d]:
    return [m for m in module.modules() if isinstance(m, nn.Conv2d)]


def to_channels_last(batch: Any) -> Any:
    """The batch with every 4-D floating tensor in ``channels_last`` (others as they are)."""

    def convert(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if value.dim() == 4 and value.is_floating_point():
                return value.contiguous(memory_format=torch.channels_last)
            return value
        if isinstance(value, dict):
            return {k: convert(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
            return type(value)(convert(v) for v in value)
        return value

    return convert(batch)


def _channels_last_why_not(_trainer: Any, module: nn.Module, batch: Any) -> str | None:
    convs = _convs(module)
    if not convs:
        return "no Conv2d layer (channels_last speeds up 2-D convolutions)"
    if convs[0].weight.is_contiguous(memory_format=torch.channels_last) and not (
        convs[0].weight.is_contiguous()
    ):
        return "the model is in channels_last already"
    if not any(t.dim() == 4 and t.is_floating_point() for t in leaves(batch, torch.Tensor)):
        return "no 4-D floating input in the batch"
    return None


@contextmanager
def _channels_last(_trainer: Any, module: nn.Module) -> Iterator[Setup]:
    module.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    try:
        yield Setup(prepare=to_channels_last)
    finally:
        module.to(memory_format=torch.contiguous_format)  # type: ignore[call-overload]


# ---------------------------------------------------------------- precision


def _precision_why_not(
    dtype: torch.dtype, cuda_only: bool
) -> Callable[[Any, Any, Any], str | None]:
    def why_not(trainer: pl.Trainer, _module: Any, _batch: Any) -> str | None:
        if cuda_only and _device(trainer).type != "cuda":
            return "float16 autocast pays on a CUDA device only (this run is on CPU)"
        today = str(trainer.precision)
        if today not in ("32-true", "32"):
            return f"the run trains in precision={today!r} already"
        cuda = _device(trainer).type == "cuda"
        if dtype is torch.bfloat16 and cuda and not torch.cuda.is_bf16_supported():  # type: ignore[no-untyped-call]
            return "this GPU has no bfloat16 support"
        return None

    return why_not


def _autocast(dtype: torch.dtype) -> Callable[[Any, Any], AbstractContextManager[Setup]]:
    @contextmanager
    def enter(trainer: pl.Trainer, _module: Any) -> Iterator[Setup]:
        kind = _device(trainer).type

        def context() -> AbstractContextManager[Any]:
            return torch.autocast(device_type=kind, dtype=dtype)

        yield Setup(context=context)

    return enter


# ---------------------------------------------------------------- compile


def _compile_why_not(trainer: pl.Trainer, module: nn.Module, _batch: Any) -> str | None:
    forward = module.__dict__.get("forward")
    if forward is not None and hasattr(forward, "_torchdynamo_orig_callable"):
        return "forward is compiled already"
    if (
        _device(trainer).type == "cpu"
        and shutil.which("cc") is None
        and shutil.which("gcc") is None
    ):
        return "no C compiler on this machine (torch.compile on CPU needs one)"
    return None


@contextmanager
def _compiled(_trainer: Any, module: nn.Module) -> Iterator[Setup]:
    bound = type(module).forward.__get__(module)
    module.__dict__["forward"] = torch.compile(bound)
    try:
        yield Setup()
    finally:
        module.__dict__.pop("forward", None)


# ---------------------------------------------------------------- fused optimizer


def _fused_why_not(trainer: pl.Trainer, _module: Any, _batch: Any) -> str | None:
    if not trainer.optimizers:
        return "no optimizer"
    optimizer = trainer.optimizers[0]
    if "fused" not in inspect.signature(type(optimizer).__init__).parameters:
        return f"{type(optimizer).__name__} has no fused implementation"
    if any(group.get("fused") for group in optimizer.param_groups):
        return f"{type(optimizer).__name__} is fused already"
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if any(not p.is_floating_point() or p.device.type not in ("cpu", "cuda") for p in params):
        return "fused optimizers need floating-point parameters on CPU or CUDA"
    return None


def fused_copy(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """A fused optimizer of the same class over the same parameters, with the same state.

    Example:
        >>> p = nn.Parameter(torch.ones(2))
        >>> fused = fused_copy(torch.optim.AdamW([p], lr=0.1))
        >>> type(fused).__name__, fused.param_groups[0]["fused"], fused.param_groups[0]["lr"]
        ('AdamW', True, 0.1)
    """
    groups = [{**g, "fused": True, "foreach": None} for g in optimizer.param_groups]
    fused = type(optimizer)(groups)  # type: ignore[call-arg]  # every option is in the groups
    state = optimizer.state_dict()
    state["param_groups"] = [{**g, "fused": True, "foreach": None} for g in state["param_groups"]]
    fused.load_state_dict(state)
    return fused


@contextmanager
def _fused(trainer: pl.Trainer, _module: Any) -> Iterator[Setup]:
    yield Setup(optimizer=fused_copy(trainer.optimizers[0]))


# ---------------------------------------------------------------- cuDNN / TF32 flags


@contextmanager
def _flag(set_flag: Callable[[Any], Any]) -> Iterator[Setup]:
    before = set_flag(True)
    try:
        yield Setup()
    finally:
        set_flag(before)  # exactly what it was: each flag it set, not one value for all


def set_cudnn_benchmark(value: bool) -> bool:
    """Set ``torch.backends.cudnn.benchmark``; return the value it had."""
    before = bool(torch.backends.cudnn.benchmark)
    torch.backends.cudnn.benchmark = value
    return before


def set_tf32(value: bool | tuple[bool, bool]) -> tuple[bool, bool]:
    """Allow (or not) TF32 in matmuls and cuDNN convolutions; return both flags as they were.

    ``value`` is one bool for both, or the ``(matmul, cudnn)`` pair this returned, to put back
    exactly what was there: PyTorch's defaults differ (matmuls off, cuDNN convolutions on), and
    putting back one value for both once turned a user's TF32 convolutions off for the whole fit
    (1.9x slower on ResNet-18 on an H200, found by ``make gpu-check``).

    Example:
        >>> before = set_tf32(True)
        >>> set_tf32(before) == (True, True)
        True
        >>> set_tf32(before) == before
        True
    """
    before = (
        bool(torch.backends.cuda.matmul.allow_tf32),
        bool(torch.backends.cudnn.allow_tf32),
    )
    matmul, cudnn = (value, value) if isinstance(value, bool) else value
    torch.backends.cuda.matmul.allow_tf32 = matmul
    torch.backends.cudnn.allow_tf32 = cudnn
    return before


def _flag_why_not(setter: Callable[[Any], Any]) -> Callable[[Any, Any, Any], str | None]:
    def why_not(trainer: pl.Trainer, _module: Any, _batch: Any) -> str | None:
        reason = _cuda_only(trainer)
        if reason is not None:
            return reason
        now = setter(True)
        setter(now)
        on = all(now) if isinstance(now, tuple) else bool(now)
        return "on already" if on else None

    return why_not


#: Every model-side variant, in the order they are tried (compile last: it is the slowest).
MODEL_VARIANTS: tuple[ModelVariant, ...] = (
    ModelVariant("channels_last", "channels_last", _channels_last_why_not, _channels_last),
    ModelVariant("fused_optimizer", "fused=True", _fused_why_not, _fused),
    ModelVariant(
        "cudnn_benchmark",
        "True",
        _flag_why_not(set_cudnn_benchmark),
        lambda _t, _m: _flag(set_cudnn_benchmark),
    ),
    ModelVariant("tf32", "True", _flag_why_not(set_tf32), lambda _t, _m: _flag(set_tf32)),
    ModelVariant(
        "precision",
        "bf16-mixed",
        _precision_why_not(torch.bfloat16, cuda_only=False),
        _autocast(torch.bfloat16),
        applied_by='Trainer(precision="bf16-mixed")',
        value="bf16-mixed",
    ),
    ModelVariant(
        "precision",
        "16-mixed",
        _precision_why_not(torch.float16, cuda_only=True),
        _autocast(torch.float16),
        applied_by='Trainer(precision="16-mixed")',
        value="16-mixed",
    ),
    ModelVariant(
        "compile",
        "torch.compile",
        _compile_why_not,
        _compiled,
        applied_by="model = torch.compile(model) before trainer.fit(model)",
    ),
)
