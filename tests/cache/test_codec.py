"""The sample codec: every supported type round-trips exactly; anything else is refused clearly."""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import pytest
import torch

from lightning_speedpack.cache.codec import ALIGN, decode, dumps, encode, leaf_views, loads
from tests.helpers.samples import assert_same

ALL_TORCH_DTYPES = [
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
    torch.bool,
]


@pytest.mark.parametrize("dtype", ALL_TORCH_DTYPES, ids=str)
def test_tensors_of_every_dtype_round_trip(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    t = (torch.randn(3, 5, generator=g) * 50).to(dtype)
    assert_same(loads(dumps(t)), t)


@pytest.mark.parametrize(
    "tensor",
    [
        torch.arange(12.0).view(3, 4).t(),  # non-contiguous
        torch.arange(6.0)[::2],  # strided
        torch.tensor(7.5),  # 0-d
        torch.empty(0, 3, dtype=torch.int16),  # no elements
        torch.randn(2, 2, dtype=torch.complex64).conj(),  # lazy conjugate bit
        torch.ones(3, requires_grad=True),
    ],
    ids=["transposed", "strided", "scalar", "empty", "conj", "requires_grad"],
)
def test_tensor_layouts_round_trip(tensor: torch.Tensor) -> None:
    out = loads(dumps(tensor))
    assert out.dtype == tensor.dtype
    assert out.shape == tensor.shape
    assert torch.equal(out.detach(), tensor.detach().resolve_conj())
    assert out.requires_grad == tensor.requires_grad


def test_numpy_arrays_and_scalars_round_trip() -> None:
    structured = np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8", (2,)), ("c", "S3")])
    structured["a"] = [1, 2, 3]
    structured["c"] = [b"x", b"yy", b"zzz"]
    sample = [
        np.arange(10, dtype=">i2").reshape(2, 5),  # big-endian stays big-endian
        np.arange(12.0).reshape(3, 4).T,
        np.zeros((0, 4), dtype=np.float32),
        np.array(["ab", "c"]),
        structured,
        np.float32(1.25),
        np.int64(-3),
        np.bool_(True),
        np.datetime64("2024-01-02"),
    ]
    assert_same(loads(dumps(sample)), sample)


def test_python_scalars_and_nesting_round_trip() -> None:
    sample = {
        "image": torch.arange(24, dtype=torch.uint8).view(2, 3, 4),
        "meta": ("name", 3, 2**80, -0.0, float("inf"), float("nan"), 1 + 2j, None, True),
        "raw": [b"\x00\xffbytes", bytearray(b"mutable"), ""],
        1: {"nested": [[], (), {}], 2.5: "float key", None: "none key", (1, 2): "tuple key"},
        "text": "naïve ünïcode \ud800 surrogate",
    }
    assert_same(loads(dumps(sample)), sample)


def test_decoded_sample_owns_its_memory() -> None:
    blob = np.frombuffer(bytearray(dumps((torch.zeros(4), np.zeros(4)))), dtype=np.uint8)
    t, a = decode(blob)
    t += 1
    a += 1
    t2, a2 = decode(blob)
    assert t2.sum() == 0
    assert a2.sum() == 0
    assert (a.flags.writeable and a.flags.owndata) or a.base is not None


def test_arrays_start_on_aligned_offsets() -> None:
    sample = ("x" * 13, torch.ones(3, dtype=torch.uint8), torch.ones(5, dtype=torch.float64))
    encoded = encode(sample)
    assert [off % ALIGN for off, _ in encoded.arrays] == [0, 0]
    assert encoded.nbytes % ALIGN == 0


class Point(collections.namedtuple("Point", "x y")):
    pass


@pytest.mark.parametrize(
    ("bad", "name"),
    [
        (object(), "builtins.object"),
        (Point(1, 2), "Point"),
        (collections.OrderedDict(a=1), "collections.OrderedDict"),
        (np.array([object()], dtype=object), "numpy.ndarray"),
        ({1, 2}, "builtins.set"),
        (torch.nn.Parameter(torch.ones(1)), "Parameter"),
        (torch.ones(2).to_sparse(), "torch.Tensor"),
    ],
    ids=["object", "namedtuple", "ordereddict", "object-array", "set", "parameter", "sparse"],
)
def test_unsupported_types_name_the_type_and_index(bad: Any, name: str) -> None:
    with pytest.raises(TypeError, match=rf"at index 17: .*{name}"):
        encode({"ok": torch.ones(1), "bad": [bad]}, index=17)


def test_leaf_views_share_the_blob_and_refuse_misaligned_starts() -> None:
    blob = torch.arange(64, dtype=torch.float32)  # 256 bytes
    leaf = (8, 16, torch.float32, (2, 2))  # 4 floats, 8 bytes into each blob
    views = leaf_views(blob, [0, 64], leaf)
    assert views is not None
    assert [v.tolist() for v in views] == [[[2.0, 3.0], [4.0, 5.0]], [[18.0, 19.0], [20.0, 21.0]]]
    views[1].fill_(-1)  # a view: writes reach the blob (why only copying callers get views)
    assert blob[18:22].tolist() == [-1.0] * 4
    assert leaf_views(blob, [2], leaf) is None  # not a multiple of the float's 4 bytes
