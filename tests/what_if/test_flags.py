"""WhatIf's cuDNN/TF32 trials put back each flag exactly as it was (found on a real H200)."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch

from lightning_speedpack.what_if import model_trials


@pytest.fixture
def torch_defaults() -> Iterator[None]:
    """PyTorch's own defaults, which differ: TF32 off in matmuls, on in cuDNN convolutions."""
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = True
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def _flags() -> tuple[bool, bool]:
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


@pytest.mark.usefixtures("torch_defaults")
def test_a_tf32_trial_puts_back_the_convolutions_tf32(monkeypatch: pytest.MonkeyPatch) -> None:
    [variant] = [v for v in model_trials.MODEL_VARIANTS if v.knob == "tf32"]
    monkeypatch.setattr(model_trials, "_cuda_only", lambda trainer: None)  # as on a GPU
    trainer = SimpleNamespace()
    assert variant.why_not(trainer, None, None) is None  # the probe: not on yet
    assert _flags() == (False, True)
    with variant.enter(trainer, None):
        assert _flags() == (True, True)
    assert _flags() == (False, True)  # was (False, False): convolutions lost TF32 for the fit


@pytest.mark.usefixtures("torch_defaults")
def test_both_on_reads_as_on_already(monkeypatch: pytest.MonkeyPatch) -> None:
    [variant] = [v for v in model_trials.MODEL_VARIANTS if v.knob == "tf32"]
    monkeypatch.setattr(model_trials, "_cuda_only", lambda trainer: None)
    torch.backends.cuda.matmul.allow_tf32 = True
    assert variant.why_not(SimpleNamespace(), None, None) == "on already"
    assert _flags() == (True, True)
