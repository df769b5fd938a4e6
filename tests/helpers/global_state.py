"""Snapshot the process-wide state a callback might change, to prove it left none behind."""

from __future__ import annotations

import sys
import threading
import warnings
from typing import Any

import torch

from lightning_speedpack.core import events
from lightning_speedpack.core.lightning import classes


def snapshot() -> dict[str, Any]:
    """What must be equal before and after a fit (or an exception mid-fit)."""
    return {
        "tensor_methods": {k: id(v) for k, v in vars(torch.Tensor).items()},
        "torch_functions": {k: id(v) for k, v in vars(torch).items() if callable(v)},
        "torch_cuda": {k: id(v) for k, v in vars(torch.cuda).items() if callable(v)},
        "torch_function_mode": torch._C._is_torch_function_mode_enabled(),
        "dispatch_modes": torch._C._len_torch_dispatch_stack(),
        "grad_enabled": torch.is_grad_enabled(),
        "num_threads": torch.get_num_threads(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        # every installed namespace's Trainer (the doctor wraps each)
        "trainer_init": {t.__module__: id(t.__init__) for t in classes("Trainer")},
        "trace": sys.gettrace(),
        "profile": sys.getprofile(),
        "warning_filters": len(warnings.filters),
        "threads": sorted(
            t.name for t in threading.enumerate() if not t.daemon or "speedpack" in t.name
        ),
        "default_dtype": torch.get_default_dtype(),
        # a tool's subscription to another's observations (core.events) ends with its fit
        "event_subscribers": events.subscriber_count(),
    }


def diff(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The entries that changed, with (before, after) values; dict entries by changed key."""
    out: dict[str, Any] = {}
    for key, old in before.items():
        new = after[key]
        if isinstance(old, dict):
            changed = {k for k in old.keys() | new.keys() if old.get(k) != new.get(k)}
            if changed:
                out[key] = sorted(changed)
        elif old != new:
            out[key] = (old, new)
    return out
