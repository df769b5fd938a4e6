"""Comparing decoded samples with the originals, exactly."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

__all__ = ["assert_same"]


def assert_same(a: Any, b: Any) -> None:
    """Exact equality, including types, dtypes, shapes and float bit patterns."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype
        assert a.shape == b.shape
        assert a.requires_grad == b.requires_grad
        assert torch.equal(
            a.detach().reshape(-1).view(torch.uint8) if a.numel() else a,
            b.detach().reshape(-1).view(torch.uint8) if b.numel() else b,
        )
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype
        assert a.shape == b.shape
        assert a.tobytes() == b.tobytes()
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype
        assert a.tobytes() == b.tobytes()
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b)
    elif isinstance(a, float):
        assert a.hex() == b.hex()  # -0.0 stays -0.0
    else:
        assert a == b
