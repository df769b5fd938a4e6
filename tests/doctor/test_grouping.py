"""The report's findings: alike ones over many layers folded into one, GPU advice last."""

from __future__ import annotations

import importlib

import pytest

from lightning_speedpack.advisor.rules import DeviceInfo, check_layer_dims
from lightning_speedpack.core.findings import Finding
from lightning_speedpack.doctor.grouping import compact_locations, grouped, presented

CPU = DeviceInfo("cpu")
A100 = DeviceInfo("cuda", "A100", (8, 0), has_tensor_cores=True)


@pytest.mark.parametrize("namespace", ["lightning.pytorch", "pytorch_lightning"])
def test_the_transformer_examples_eight_layer_rows_become_two(namespace: str) -> None:
    """Issue 25: Lightning's demo Transformer (head_dim=100, vocabulary 3001) gave 8 rows."""
    demos = importlib.import_module(f"{namespace}.demos.transformer")
    model = demos.Transformer(vocab_size=3001)
    findings = [f.to_finding() for f in check_layer_dims(model, CPU)]
    assert len(findings) == 8

    shown = presented(findings)

    assert len(shown) == 2
    attention, vocabulary = sorted(shown, key=lambda f: "vocabulary" in f.message)
    assert attention.message == (
        "layer dimensions (MultiheadAttention) not a multiple of 8, so fp16/bf16 tensor cores "
        "are not used fully (6 MultiheadAttention layers: head_dim=100)"
    )
    assert attention.fix == "pad to head_dim=104"
    assert attention.location == (
        "transformer.encoder.layers.{0,1}.self_attn, transformer.decoder.layers.{0,1}.self_attn, "
        "transformer.decoder.layers.{0,1}.multihead_attn"
    )
    assert attention.figures["count_alike"] == 6
    assert len(attention.figures["places"]) == 6
    assert vocabulary.fix == "pad the vocabulary to 3008 (extra rows are never predicted)"
    assert "embedding: num_embeddings=3001; decoder: out_features=3001" in vocabulary.message
    assert vocabulary.location == "embedding, decoder"
    # The advice pays on a GPU only: labelled so on this CPU run, not on a CUDA one.
    assert {f.pays_on for f in shown} == {"GPU"}
    assert {f.pays_on for f in check_layer_dims(model, A100)} == {None}


def test_different_fixes_or_ids_stay_apart() -> None:
    a = Finding("advisor", "layer-dims-multiple", "m", location="l.0", fix="pad to 104")
    b = Finding("advisor", "layer-dims-multiple", "m", location="l.1", fix="pad to 112")
    c = Finding("advisor", "conv-bias-before-bn", "m", location="l.2", fix="pad to 104")
    assert grouped([a, b, c]) == [a, b, c]


def test_findings_without_a_location_are_never_merged() -> None:
    a = Finding("throughput", "data-wait", "62% of each step waits for data")
    b = Finding("throughput", "data-wait", "62% of each step waits for data")
    assert len(grouped([a, b])) == 2


def test_merged_finding_keeps_only_the_figures_all_members_share() -> None:
    members = [
        Finding("sync_points", "sync-item", f"`x.item()` at {p}", location=p, figures=figs)
        for p, figs in (("a.py:3", {"kind": "item", "count": 4}), ("b.py:9", {"kind": "item"}))
    ]
    (merged,) = grouped(members)
    assert merged.message == "`x.item()` at 2 places"
    assert merged.figures == {"kind": "item", "places": ["a.py:3", "b.py:9"], "count_alike": 2}


def test_order_is_what_pays_here_then_severity_then_measured_share() -> None:
    gpu_warning = Finding("sync_points", "sync-item", "w", severity="warning", pays_on="GPU")
    small = Finding("wall_time", "checkpoint-time", "c", figures={"wall_fraction": 0.1})
    large = Finding("wall_time", "validation-time", "v", figures={"wall_fraction": 0.6})
    info = Finding("data", "model-bound", "i", severity="info")
    error = Finding("retention", "retained-graph", "e", severity="error")
    order = presented([gpu_warning, info, small, large, error])
    assert [f.id for f in order] == [
        "retained-graph",
        "validation-time",
        "checkpoint-time",
        "model-bound",
        "sync-item",
    ]


@pytest.mark.parametrize(
    ("places", "expected"),
    [
        (["a.layers.0.x", "a.layers.2.x"], "a.layers.{0,2}.x"),
        (["a.layers.0.x", "a.layers.1.x", "a.layers.2.x"], "a.layers.{0-2}.x"),
        (["loaders[0]", "loaders[1]"], "loaders[{0,1}]"),
        (["a.0.b.1", "a.0.b.2"], "a.0.b.1, a.0.b.2"),  # two numbers: listed as they are
        (["train.py:12", "train.py:40"], "train.py:12, train.py:40"),  # lines are not layers
    ],
)
def test_compact_locations(places: list[str], expected: str) -> None:
    assert compact_locations(places) == expected
