from __future__ import annotations

import pytest
from torch import nn

from lightning_speedpack.advisor.dims import UnalignedDim, find_unaligned_dims, round_up


def test_output_vocabulary_is_found_and_marked() -> None:
    model = nn.Sequential()
    model.add_module("embed", nn.Embedding(33708, 512))
    model.add_module("hidden", nn.Linear(512, 512))
    model.add_module("lm_head", nn.Linear(512, 33708))
    assert find_unaligned_dims(model) == [
        UnalignedDim("embed", "Embedding", "num_embeddings", 33708, 33712, vocab=True),
        UnalignedDim("lm_head", "Linear", "out_features", 33708, 33712, vocab=True),
    ]


def test_untied_output_layer_is_the_last_linear_whose_width_feeds_nothing() -> None:
    model = nn.Sequential(nn.Linear(64, 100), nn.ReLU(), nn.Linear(100, 30))
    dims = find_unaligned_dims(model)
    assert [(d.module, d.param, d.value, d.suggested, d.vocab) for d in dims] == [
        ("0", "out_features", 100, 104, False),
        ("2", "in_features", 100, 104, False),
        ("2", "out_features", 30, 32, True),
    ]
    assert dims[-1].describe() == "2 (Linear) out_features=30 -> 32 (output vocabulary)"


def test_transformer_block_output_is_not_a_vocabulary() -> None:
    dims = find_unaligned_dims(nn.TransformerEncoderLayer(60, 4, 100))
    assert [(d.module, d.param, d.value, d.vocab) for d in dims] == [
        ("self_attn", "embed_dim", 60, False),
        ("self_attn", "head_dim", 15, False),
        ("linear1", "in_features", 60, False),
        ("linear1", "out_features", 100, False),
        ("linear2", "in_features", 100, False),
        ("linear2", "out_features", 60, False),  # feeds the next block: not an output vocab
    ]


def test_attention_projections_are_not_listed_twice() -> None:
    attn = nn.MultiheadAttention(48, 8, kdim=20, vdim=20)  # head_dim 6
    assert [(d.module, d.param, d.value) for d in find_unaligned_dims(attn)] == [
        ("", "head_dim", 6),
        ("", "kdim", 20),
        ("", "vdim", 20),
    ]


def test_convolutions_and_aligned_models() -> None:
    conv = nn.Sequential(nn.Conv2d(3, 30, 3), nn.Conv1d(30, 64, 1))
    assert [
        (d.module, d.layer, d.param, d.value, d.suggested) for d in find_unaligned_dims(conv)
    ] == [
        ("0", "Conv2d", "in_channels", 3, 8),
        ("0", "Conv2d", "out_channels", 30, 32),
        ("1", "Conv1d", "in_channels", 30, 32),
    ]
    aligned = nn.Sequential(nn.Embedding(32000, 512), nn.Linear(512, 1024), nn.Conv2d(8, 16, 3))
    assert find_unaligned_dims(aligned) == []


def test_multiple_of_is_configurable_and_validated() -> None:
    model = nn.Linear(24, 64)
    assert find_unaligned_dims(model) == []
    assert [(d.param, d.suggested) for d in find_unaligned_dims(model, multiple_of=16)] == [
        ("in_features", 32)
    ]
    for bad in (0, -8, 8.0, True):
        with pytest.raises(ValueError, match="`multiple_of` must be a positive int"):
            find_unaligned_dims(model, multiple_of=bad)  # type: ignore[arg-type]


def test_round_up() -> None:
    assert [round_up(v, 8) for v in (1, 7, 8, 9, 33708)] == [8, 8, 8, 16, 33712]
