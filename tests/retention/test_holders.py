"""The pure helpers behind LossRetentionDetector: tags, the forward walk, the heap, the names."""

from __future__ import annotations

import gc
import importlib
import sys
import textwrap
import weakref
from collections import deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from lightning_speedpack.retention import holders as R
from lightning_speedpack.retention.walk import _capped_items

GLOBAL_LOSSES: list[torch.Tensor] = []


def _graph(scale: float = 2.0, width: int = 4) -> torch.Tensor:
    x = torch.randn(width, requires_grad=True)
    return (x * scale).relu().sum()


def _paths(roots: list[tuple[str, Any]], **kwargs: Any) -> list[str]:
    return [p for p, _ in R.walk_containers(roots, **kwargs)]


# ---------------------------------------------------------------- tags


def test_tag_graph_marks_root_and_nearest_nodes_and_survives_backward() -> None:
    leaf = torch.randn(3, requires_grad=True)
    inner = (leaf * 2).sum()
    outer = inner / 2  # what Lightning does to the user's loss
    R.tag_graph(outer, step=4, run=7, backward=True)
    outer.backward()
    assert outer.grad_fn.metadata[R.STEP_KEY] == (7, 4, True)  # type: ignore[union-attr]
    assert inner.grad_fn.metadata[R.STEP_KEY] == (7, 4, True)  # type: ignore[union-attr]
    # the earliest tag of a run wins; another run re-tags
    R.tag_graph(inner, step=9, run=7)
    assert R.graph_step(inner, 10, run=7) == 4
    assert R.is_retained(inner, 10, run=7)
    assert R.graph_step(inner, 10, run=8) is None
    assert not R.is_retained(inner, 10, run=8)


def test_graph_step_tags_an_untagged_graph_as_first_seen() -> None:
    t = _graph()
    assert R.graph_step(t, 5, run=1) == 5
    assert not R.is_retained(t, 5, run=1)
    assert R.is_retained(t, 6, run=1)
    assert R.graph_step(torch.ones(2), 3) == 3  # no graph: never retained
    assert not R.is_retained(torch.ones(2), 3)


def test_new_run_tokens_differ() -> None:
    assert R.new_run_token() != R.new_run_token()


# ---------------------------------------------------------------- forward walk


class Holder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 2)
        self.losses = [1.0, _graph(), torch.ones(2)]
        self.hist = {"aux": [_graph()], "ok": [torch.zeros(1)]}
        self.recent = deque([_graph()])
        self.nested = {"a": {"b": ({"c": _graph()},)}}
        self.ns = SimpleNamespace(kept=_graph())
        seen = [_graph()]
        self.record = lambda: seen
        self.register_buffer("buf", torch.ones(2))


def test_walk_finds_graphs_in_every_container_with_readable_paths() -> None:
    model = Holder()
    assert _paths([("model", model)], max_depth=6) == [
        "model.losses[1]",
        'model.hist["aux"][0]',
        "model.recent[0]",
        'model.nested["a"]["b"][0]["c"]',
        "model.ns.kept",
        "model.record.<closure>.seen[0]",
    ]


def test_walk_stops_at_max_depth() -> None:
    model = Holder()
    paths = _paths([("model", model)], max_depth=3)
    assert 'model.hist["aux"][0]' in paths
    assert not any(p.startswith("model.nested") for p in paths)


def test_walk_skips_the_given_objects_and_parameters() -> None:
    model = Holder()
    assert _paths([("model", model)], skip=[model.hist, model.recent, model.ns]) == [
        "model.losses[1]",
        "model.record.<closure>.seen[0]",
    ]
    assert _paths([("layer", nn.Linear(2, 2))]) == []


def test_walk_samples_both_ends_of_long_containers() -> None:
    long: list[Any] = [0.0] * 1000
    long[3] = _graph()
    long[500] = _graph()  # the middle is not looked at every step
    long[998] = _graph()
    assert _paths([("xs", long)]) == ["xs[3]", "xs[998]"]
    big: dict[int, Any] = dict.fromkeys(range(1000), 0.0)
    big[999] = _graph()
    assert _paths([("d", big)]) == ["d[999]"]
    recent: deque[Any] = deque([0.0] * 1000)
    recent.append(_graph())
    assert _paths([("q", recent)]) == ["q[1000]"]


def test_walk_handles_cycles() -> None:
    a: list[Any] = [_graph()]
    a.append(a)
    assert _paths([("a", a)]) == ["a[0]"]


def test_module_globals_root_and_display_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_script.py").write_text("import torch\nLOSSES = []\nX = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("my_script")
    try:
        module.LOSSES.append(_graph())
        root = R.module_globals_root(module)
        assert root is not None
        name, values = root
        assert name == "my_script"
        assert set(values) == {"LOSSES"}
        assert _paths([root]) == ["my_script.LOSSES[0]"]
        module.__name__ = "__main__"
        assert R.module_display_name(module) == "my_script"
    finally:
        sys.modules.pop("my_script", None)
    assert R.module_globals_root(None) is None


@pytest.mark.parametrize(
    ("path", "holder"),
    [
        ("model.losses[17]", "model.losses"),
        ('model.hist["aux"][3]', 'model.hist["aux"]'),
        ('model.training_step_outputs[2]["loss"]', "model.training_step_outputs"),
        ("my_script.GLOBAL_LOSSES[0]", "my_script.GLOBAL_LOSSES"),
        ("model.last", "model.last"),
        ('training_step()["aux"]', 'training_step()["aux"]'),
    ],
)
def test_holder_of(path: str, holder: str) -> None:
    assert R.holder_of(path) == holder


# ---------------------------------------------------------------- heap and referrers


def test_heap_scan_finds_graph_tensors_only() -> None:
    kept = _graph()
    plain = torch.ones(3)
    found = R.heap_graph_tensors()
    assert any(t is kept for t in found)
    assert not any(t is plain for t in found)
    assert not any(t is kept for t in R.heap_graph_tensors(exclude=[kept]))


@pytest.mark.slow
def test_referrer_path_names_a_root_attribute() -> None:
    model = Holder()
    roots = {id(model): "model"}
    for path, tensor in R.walk_containers([("model", model)], max_depth=6):
        if path.startswith("model.record"):
            continue  # a closure is named from its function, tested below
        found = R.referrer_path(tensor, roots)
        assert found is not None
        assert found.path == path
        assert found.root is model


def test_referrer_path_names_a_module_global() -> None:
    GLOBAL_LOSSES.append(_graph())
    try:
        found = R.referrer_path(GLOBAL_LOSSES[0], {})
        assert found is not None
        assert found.path == f"{__name__}.GLOBAL_LOSSES[0]"
        assert found.root is sys.modules[__name__]
    finally:
        GLOBAL_LOSSES.clear()


def test_referrer_path_names_a_closure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "closures.py").write_text(
        textwrap.dedent("""
        def make_recorder():
            history = []
            def record(loss):
                history.append(loss)
            return record
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("closures")
    try:
        record = module.make_recorder()
        record(_graph())
        record(_graph())
        kept = record.__closure__[0].cell_contents[1]
        found = R.referrer_path(kept, {})
        assert found is not None
        assert found.path == "closures.make_recorder.<locals>.record.<closure>.history[1]"
        assert found.root is record
        del kept
        assert _paths([("closures.make_recorder.<locals>.record", record)]) == [
            "closures.make_recorder.<locals>.record.<closure>.history[0]",
            "closures.make_recorder.<locals>.record.<closure>.history[1]",
        ]
    finally:
        sys.modules.pop("closures", None)


def test_referrer_path_gives_up_within_budget() -> None:
    chain: Any = _graph()
    target = chain
    for _ in range(20):
        chain = [chain]
    assert R.referrer_path(target, {}, max_levels=5) is None
    assert chain  # keep the chain alive until here


def test_referrer_path_ignores_the_callers_lists() -> None:
    owner = SimpleNamespace(kept=[_graph()])
    mine = [owner.kept[0]]
    found = R.referrer_path(mine[0], {id(owner): "owner"}, ignore=[mine])
    assert found is not None
    assert found.path == "owner.kept[0]"


# ---------------------------------------------------------------- graph weight


def test_inspect_graphs_tells_backpropagated_from_kept_activations() -> None:
    layer = nn.Linear(256, 256)
    x = torch.randn(64, 256)
    trunk = torch.relu(layer(x))
    loss = trunk.sum()
    aux = torch.tanh(trunk).pow(2).mean()  # an auxiliary head, never back-propagated
    loss.backward()
    assert R.inspect_graphs([loss]).backpropagated
    info = R.inspect_graphs([aux])
    assert not info.backpropagated
    # tanh's result (64x256 floats) and pow's input are kept; the weight is not counted
    assert info.est_bytes >= 64 * 256 * 4
    assert info.est_bytes < 4 * 64 * 256 * 4
    assert info.example_grad_fn == "MeanBackward0"
    # a scalar multiple of a back-propagated loss is a graph node, not kept activations
    assert R.inspect_graphs([loss * 0.5]).backpropagated


def test_inspect_graphs_counts_shared_storage_once_and_marks_tags() -> None:
    x = torch.randn(128, requires_grad=True)
    h = torch.exp(x)  # saves its 512-byte result
    a, b = h.sum(), (h * 1.0).sum()
    assert R.inspect_graphs([a]).est_bytes == R.inspect_graphs([a, b]).est_bytes == 512
    tagged = _graph()
    R.tag_graph(tagged, 0, backward=True)
    assert R.inspect_graphs([tagged]).backpropagated
    assert R.inspect_graphs([]) == R.GraphInfo(False, 0, "")


@pytest.mark.slow
def test_helpers_keep_no_strong_reference() -> None:
    model = Holder()
    refs = [weakref.ref(t) for _, t in R.walk_containers([("model", model)], max_depth=6)]
    for ref in refs:
        tensor = ref()
        assert tensor is not None
        R.tag_graph(tensor, 1, backward=True)
        R.inspect_graphs([tensor])
        R.referrer_path(tensor, {id(model): "model"})
        del tensor
    R.heap_graph_tensors()
    del model
    gc.collect()
    assert all(r() is None for r in refs)


def test_capped_items_indices() -> None:
    def items(xs: list[int]) -> list[int]:
        return [i for i, _ in _capped_items(xs, len(xs))]

    assert items(list(range(5))) == [0, 1, 2, 3, 4]
    assert items(list(range(20))) == list(range(20))  # up to head + tail: every item
    assert items(list(range(100))) == list(range(4)) + list(range(72, 100))  # head 4, tail 28


class Slotted:
    __slots__ = ("kept",)

    def __init__(self) -> None:
        self.kept = [_graph()]


def test_an_unnameable_holder_is_remembered() -> None:
    holder = Slotted()
    tensor = holder.kept[0]
    assert R.referrer_path(tensor, {}) is None  # a __slots__ object has no attribute dict
    assert not R.is_unnameable(tensor)
    R.mark_unnameable(tensor)
    assert R.is_unnameable(tensor)
    assert not R.is_unnameable(torch.ones(1))


def test_walk_is_bounded_by_max_objects() -> None:
    many = [[_graph()] for _ in range(30)]  # short enough to be walked whole
    assert len(_paths([("xs", many)])) == 30
    assert len(_paths([("xs", many)], max_objects=11)) == 10  # the outer list and 10 inner ones
