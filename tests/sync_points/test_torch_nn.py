"""Syncs inside torch's own nn modules: named there, with the argument that removes them.

``nn.Transformer`` given a ``tgt_mask`` compares it with a causal mask on every forward
(``_detect_is_causal_mask``: ``bool((mask == causal).all())``) unless told whether it is causal.
Watched with CPU tensors counted as device tensors (``include_cpu=True``), as a GPU run counts
them.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

from lightning_speedpack.sync_points.attribution import framework_fix, library_fix
from tests.helpers import global_state
from tests.sync_points.test_detect import _watch


@pytest.fixture
def clean_state() -> Iterator[None]:
    before = global_state.snapshot()
    yield
    assert global_state.diff(before, global_state.snapshot()) == {}


def _inputs() -> tuple[nn.Transformer, torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Transformer(
        d_model=16,
        nhead=2,
        num_encoder_layers=1,
        num_decoder_layers=1,
        dim_feedforward=32,
        batch_first=True,
        dropout=0.0,
    )
    src, tgt = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    return model, src, tgt, nn.Transformer.generate_square_subsequent_mask(5)


def test_the_causal_mask_check_is_named_inside_torch_and_told_is_causal_removes_it(
    clean_state: None,
) -> None:
    model, src, tgt, mask = _inputs()

    def step() -> Any:
        return model(src, tgt, tgt_mask=mask)

    det = _watch(step, include_cpu=True)
    (found,) = [f for f in det.findings() if f.library == "torch"]
    assert (found.kind, found.origin) == ("bool", "user")
    assert found.lineno == inspect.getsourcelines(step)[1] + 1  # the user's call, not torch's
    assert found.library_location.startswith("torch/nn/modules/transformer.py:")
    fix = library_fix(found.library, found.kind, found.library_location, found.library_calls)
    assert "tgt_is_causal=True" in fix
    # the remedy: the same output, no sync left
    told = _watch(lambda: model(src, tgt, tgt_mask=mask, tgt_is_causal=True), include_cpu=True)
    assert [f for f in told.findings() if f.kind == "bool"] == []
    assert torch.equal(step(), model(src, tgt, tgt_mask=mask, tgt_is_causal=True))


def test_torchs_other_frames_still_report_at_the_users_line(clean_state: None) -> None:
    t = torch.arange(4.0)

    def shown() -> None:
        print(t)  # __repr__ inside torch/_tensor.py: the user's print, no library named

    det = _watch(shown, include_cpu=True)
    assert det.findings()
    assert all(not f.library for f in det.findings())


def test_lightnings_demo_transformer_gets_torchs_remedy(clean_state: None) -> None:
    # Lightning's own demo model (the quickstart's) passes a causal mask without saying so: the
    # sync is Lightning's file's, and its fix is torch's, not "a Lightning internal".
    from pytorch_lightning.demos import Transformer

    torch.manual_seed(0)
    model = Transformer(vocab_size=50, ninp=16, nhead=2, nhid=32, nlayers=1)
    tokens = torch.randint(0, 50, (2, 6))
    det = _watch(lambda: model(tokens, tokens), include_cpu=True)
    (found,) = [f for f in det.findings() if f.kind == "bool"]
    assert (found.origin, found.library) == ("framework", "torch")
    assert "tgt_is_causal=True" in framework_fix(found)
