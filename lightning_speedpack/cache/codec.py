"""Turn a dataset sample into one flat byte blob and back, without pickle.

A sample is its *structure* -- UTF-8 JSON describing the nesting, the scalars and where each
array lies -- and its *data*: the array bytes, each starting on a 64-byte boundary. Samples of
one shape (and equal scalars) share their structure text, offsets being relative to the data.
A blob comes in two forms:

- full (``dumps``, and the arena's fallback): ``[u64 little-endian: length of the structure
  text] [structure] [padding to 64 bytes] [data]``;
- data only (the arena's usual form): ``[data]``, the structure being kept once per arena
  (:mod:`~lightning_speedpack.cache.structures`). For many tiny samples the full form's header
  was a large share: 64 bytes on 768 of tokens.

Supported leaves: ``torch.Tensor`` (any dtype, CPU, strided), ``numpy.ndarray`` and numpy
scalars (any non-object dtype, structured dtypes included), ``int``, ``float``, ``bool``,
``complex``, ``None``, ``str``, ``bytes`` and ``bytearray``; containers: ``tuple``, ``list`` and
``dict`` (keys may be any supported scalar). Exact types only: a subclass (a named tuple, an
``OrderedDict``, a tensor subclass) would come back as its base type, so it is refused rather
than silently changed. JSON keeps every ``float`` exactly (``repr`` round trip), ``nan`` and
``inf`` included.

Decoding copies each array out of the blob, so a decoded sample may be modified in place
without touching the blob. One sample decoded alone owns its memory; the samples of a batch
decoded together (:func:`decode_leaf`) are rows of one fresh tensor per leaf, each row a
sample's own bytes.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

__all__ = [
    "ALIGN",
    "Decoder",
    "EncodedSample",
    "Plan",
    "decode",
    "decode_leaf",
    "decoder_of",
    "dumps",
    "encode",
    "loads",
    "plan_of",
]

ALIGN = 64
_LEN = struct.Struct("<Q")

_TORCH_DTYPES: dict[str, torch.dtype] = {
    str(dt).removeprefix("torch."): dt for dt in vars(torch).values() if isinstance(dt, torch.dtype)
}


# Torch dtypes numpy can hold too: decoded through numpy, which costs fewer calls per tensor.
_NUMPY_OF: dict[torch.dtype, np.dtype[Any]] = {
    t: np.dtype(n)
    for t, n in [
        (torch.bool, "?"),
        (torch.uint8, "u1"),
        (torch.int8, "i1"),
        (torch.int16, "<i2"),
        (torch.int32, "<i4"),
        (torch.int64, "<i8"),
        (torch.float16, "<f2"),
        (torch.float32, "<f4"),
        (torch.float64, "<f8"),
        (torch.complex64, "<c8"),
        (torch.complex128, "<c16"),
    ]
}
_PARSED: dict[bytes, Any] = {}  # structure text -> decoding plan; bounded, see plan_of()
_PARSED_MAX = 4096


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class EncodedSample:
    """A sample ready to be written: its structure text and the arrays of its data.

    Attributes:
        text: the JSON structure text.
        arrays: ``(offset, uint8 array)`` pairs, offsets relative to the data start.
        data_nbytes: the data's size in bytes (the data-only form's whole size).
    """

    text: bytes
    arrays: list[tuple[int, np.ndarray[Any, Any]]] = field(default_factory=list)
    data_nbytes: int = 0

    @property
    def head(self) -> int:
        """Bytes before the data in the full form: length word, text, padding to 64."""
        return _align(_LEN.size + len(self.text))

    @property
    def nbytes(self) -> int:
        """The full form's size in bytes."""
        return self.head + self.data_nbytes

    def write_into(self, dest: np.ndarray[Any, Any], *, data_only: bool = False) -> None:
        """Copy the blob into ``dest``, a writable uint8 array of at least its size.

        ``data_only``: the arrays alone (``data_nbytes``), for a reader that knows the
        structure; otherwise the full form (``nbytes``).
        """
        base = 0
        if not data_only:
            header = _LEN.pack(len(self.text)) + self.text
            dest[: len(header)] = np.frombuffer(header, dtype=np.uint8)
            base = self.head
        for offset, array in self.arrays:
            dest[base + offset : base + offset + array.size] = array


class _Encoder:
    def __init__(self, index: int | None, start: int) -> None:
        self.index = index
        self.arrays: list[tuple[int, np.ndarray[Any, Any]]] = []
        self.cursor = 0  # bytes of array data placed so far, relative to the data start

    def _place(self, raw: np.ndarray[Any, Any]) -> int:
        offset = self.cursor
        if raw.size:
            self.arrays.append((offset, raw))
        self.cursor = _align(offset + raw.size)
        return offset

    def _refuse(self, obj: object, why: str = "") -> TypeError:
        where = f" at index {self.index}" if self.index is not None else ""
        kind = f"{type(obj).__module__}.{type(obj).__qualname__}"
        hint = why or (
            "supported: torch.Tensor, numpy arrays and scalars, int, float, bool, complex, "
            "None, str, bytes, and tuple/list/dict of them"
        )
        return TypeError(f"CachedDataset cannot store a sample{where}: {kind} ({hint})")

    def node(self, obj: Any) -> Any:
        kind = type(obj)
        if obj is None or kind in (bool, int, str):
            return obj
        if kind is float:
            return obj
        if kind is torch.Tensor:
            return self._tensor(obj)
        if kind is np.ndarray:
            return self._ndarray(obj, scalar=False)
        if isinstance(obj, np.generic):
            return self._ndarray(np.asarray(obj), scalar=True)
        if kind is tuple:
            return ["t", [self.node(v) for v in obj]]
        if kind is list:
            return ["l", [self.node(v) for v in obj]]
        if kind is dict:
            return ["d", [[self.node(k), self.node(v)] for k, v in obj.items()]]
        if kind is bytes or kind is bytearray:
            raw = np.frombuffer(bytes(obj), dtype=np.uint8)
            return ["B" if kind is bytes else "A", self._place(raw), raw.size]
        if kind is complex:
            return ["c", obj.real, obj.imag]
        raise self._refuse(obj)

    def _tensor(self, t: torch.Tensor) -> list[Any]:
        if t.device.type != "cpu":
            raise self._refuse(t, f"a tensor on {t.device}: return CPU tensors from the dataset")
        if t.layout != torch.strided or t.is_quantized:
            raise self._refuse(t, f"layout {t.layout}: only dense strided tensors are supported")
        data = t.detach().resolve_conj().resolve_neg().contiguous()
        raw = data.reshape(-1).view(torch.uint8).numpy() if data.numel() else np.empty(0, np.uint8)
        dtype = str(t.dtype).removeprefix("torch.")
        return ["T", dtype, list(t.shape), self._place(raw), raw.size, int(t.requires_grad)]

    def _ndarray(self, a: np.ndarray[Any, Any], *, scalar: bool) -> list[Any]:
        if a.dtype.hasobject:
            raise self._refuse(a, "numpy arrays of dtype object are not supported")
        contiguous = np.ascontiguousarray(a)
        raw = contiguous.reshape(-1).view(np.uint8) if a.size else np.empty(0, np.uint8)
        descr = np.lib.format.dtype_to_descr(a.dtype)
        return ["N", descr, list(a.shape), self._place(raw), raw.size, int(scalar)]


def encode(sample: Any, index: int | None = None) -> EncodedSample:
    """Describe ``sample`` as a blob; nothing is copied until ``write_into``.

    Raises:
        TypeError: ``sample`` holds a type the codec does not support; the message names the
            type and ``index``.
    """
    encoder = _Encoder(index, 0)
    structure = encoder.node(sample)
    text = json.dumps(structure, separators=(",", ":")).encode()
    return EncodedSample(text, encoder.arrays, encoder.cursor)


def _torch_dtype(name: str) -> torch.dtype:
    try:
        return _TORCH_DTYPES[name]
    except KeyError:
        raise ValueError(f"corrupt cache blob: unknown torch dtype {name!r}") from None


Plan = Callable[[np.ndarray[Any, Any], int], Any]


def _constant(value: Any) -> Plan:
    return lambda blob, base: value


def _compile(node: Any) -> Plan:
    """Turn a parsed structure into a function ``(blob, base) -> sample`` (one per structure).

    Samples of one shape share their structure, so the tree walk, the dtype lookups and the
    tag dispatch happen once per structure instead of once per sample: decoding a cached
    sample then costs about as much as indexing a ``TensorDataset``.
    """
    if not isinstance(node, list):
        return _constant(node)
    tag = node[0]
    if tag in ("t", "l"):
        parts = [_compile(v) for v in node[1]]
        if tag == "t" and len(parts) == 2:
            first, second = parts
            return lambda blob, base: (first(blob, base), second(blob, base))
        kind = tuple if tag == "t" else list
        return lambda blob, base: kind([part(blob, base) for part in parts])
    if tag == "d":
        pairs = [(_compile(k), _compile(v)) for k, v in node[1]]
        return lambda blob, base: {k(blob, base): v(blob, base) for k, v in pairs}
    if tag == "T":
        return _tensor_plan(node)
    if tag == "N":
        _, descr, shape, offset, nbytes, scalar = node
        np_dtype = np.lib.format.descr_to_dtype(_tuplify(descr))
        shape = tuple(shape)
        if scalar:
            return lambda blob, base: (
                blob[base + offset : base + offset + nbytes].copy().view(np_dtype).reshape(shape)
            )[()]
        return lambda blob, base: (
            blob[base + offset : base + offset + nbytes].copy().view(np_dtype).reshape(shape)
        )
    if tag in ("B", "A"):
        _, offset, nbytes = node
        kind_b = bytes if tag == "B" else bytearray
        return lambda blob, base: kind_b(blob[base + offset : base + offset + nbytes])
    if tag == "c":
        return _constant(complex(node[1], node[2]))
    raise ValueError(f"corrupt cache blob: unknown tag {tag!r}")


def _tensor_plan(node: list[Any]) -> Plan:
    _, name, shape_list, offset, nbytes, grad = node
    dtype = _torch_dtype(name)
    np_dtype = _NUMPY_OF.get(dtype)
    shape = tuple(shape_list)
    from_numpy = torch.from_numpy
    as_numpy = np_dtype if np_dtype is not None else np.dtype("u1")

    def empty(blob: np.ndarray[Any, Any], base: int) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype)

    def raw_bytes(blob: np.ndarray[Any, Any], base: int) -> torch.Tensor:
        return from_numpy(blob[base + offset : base + offset + nbytes].reshape(shape).copy())

    def through_numpy(blob: np.ndarray[Any, Any], base: int) -> torch.Tensor:
        start = base + offset
        return from_numpy(blob[start : start + nbytes].view(as_numpy).reshape(shape).copy())

    def through_torch(blob: np.ndarray[Any, Any], base: int) -> torch.Tensor:
        raw = torch.empty(nbytes, dtype=torch.uint8)
        raw.numpy()[:] = blob[base + offset : base + offset + nbytes]
        return raw.view(dtype).reshape(shape)

    if nbytes == 0:
        plan: Plan = empty
    elif dtype == torch.uint8:
        plan = raw_bytes
    else:
        plan = through_torch if np_dtype is None else through_numpy
    if grad:
        inner = plan
        return lambda blob, base: inner(blob, base).requires_grad_()
    return plan


Leaf = tuple[int, int, torch.dtype, tuple[int, ...]]  # offset, nbytes, dtype, shape


@dataclass(frozen=True)
class Decoder:
    """How to decode the blobs of one structure text: one at a time, or a batch at once.

    Samples that differ only in scalars (a label is part of the structure text) have different
    decoders but the same ``leaves``: a batch is decoded by copying each leaf of all its
    samples into one fresh array (one allocation, one Python call per sample and leaf), whose
    rows ``build`` then puts into each sample's structure.

    Attributes:
        one: ``(blob, base) -> sample`` (``base``: where the blob's arrays start).
        head: bytes from a blob's start to its arrays (length word, text, padding; 0 for
            the data-only form).
        leaves: the tensor leaves in structure order, or None when a leaf is of a kind only
            ``one`` decodes (numpy arrays, bytes, empty or ``requires_grad`` tensors).
        build: ``(leaf values in order) -> sample`` (raises when ``leaves`` is None).
    """

    one: Plan
    head: int
    leaves: tuple[Leaf, ...] | None
    build: Callable[[Sequence[Any]], Any]


def decoder_of(text: bytes, *, data_only: bool = False) -> Decoder:
    """The :class:`Decoder` of one structure text (not memoised: callers keep their own).

    ``data_only``: for blobs in the data-only form (``head`` 0), else the full form.
    """
    leaves: list[Leaf] = []
    build = _compile_build(json.loads(text), leaves)
    return Decoder(
        plan_of(text),
        0 if data_only else _align(_LEN.size + len(text)),
        None if build is None else tuple(leaves),
        _one_at_a_time if build is None else build,
    )


def _one_at_a_time(values: Sequence[Any]) -> Any:
    raise RuntimeError("this structure is decoded one sample at a time (Decoder.one)")


def decode_leaf(blob: np.ndarray[Any, Any], bases: list[int], leaf: Leaf) -> list[torch.Tensor]:
    """One tensor leaf of several blobs: rows of one fresh tensor, in the order of ``bases``."""
    offset, nbytes, dtype, shape = leaf
    rows = np.empty((len(bases), nbytes), dtype=np.uint8)
    for row, base in enumerate(bases):
        start = base + offset
        rows[row] = blob[start : start + nbytes]
    batch = torch.from_numpy(rows)
    if dtype != torch.uint8:
        batch = batch.view(dtype)
    return list(batch.reshape(len(bases), *shape).unbind(0))


def leaf_views(flat: torch.Tensor, bases: list[int], leaf: Leaf) -> list[torch.Tensor] | None:
    """One tensor leaf of several blobs as views into ``flat``, in the order of ``bases``.

    ``flat`` is the whole blob as a tensor of the leaf's dtype; nothing is copied. None when a
    start is not a multiple of the dtype's size. For callers that copy the values before anyone
    can see them (the DataLoader's default collate stacks them): a write into a view would
    change the cache itself.
    """
    offset, _, dtype, shape = leaf
    size = dtype.itemsize
    starts = [base + offset for base in bases]
    if size > 1 and any(start % size for start in starts):
        return None
    stride = _contiguous_strides(shape)
    as_strided = flat.as_strided
    return [as_strided(shape, stride, start // size) for start in starts]


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))


Build = Callable[[Sequence[Any]], Any]


def _compile_build(node: Any, leaves: list[Leaf]) -> Build | None:
    """``(leaf values) -> sample`` for one structure, appending its tensor leaves to ``leaves``.

    None when the structure has a leaf that batch decoding does not cover.
    """
    if not isinstance(node, list):
        return lambda values: node  # a JSON scalar: immutable, shared
    tag = node[0]
    if tag in ("t", "l"):
        parts = [_compile_build(v, leaves) for v in node[1]]
        if any(p is None for p in parts):
            return None
        return _sequence_build(tuple if tag == "t" else list, [p for p in parts if p])
    if tag == "d":
        if any(isinstance(k, list) for k, _ in node[1]):
            return None  # keys that need decoding themselves: rare, one at a time
        keys = [k for k, _ in node[1]]
        parts = [_compile_build(v, leaves) for _, v in node[1]]
        if any(p is None for p in parts):
            return None
        values = [p for p in parts if p]
        return lambda vs: dict(zip(keys, [v(vs) for v in values], strict=True))
    if tag == "T":
        _, name, shape, offset, nbytes, grad = node
        if grad or nbytes == 0:
            return None  # autograd state, or nothing to copy: one at a time
        at = len(leaves)
        leaves.append((offset, nbytes, _torch_dtype(name), tuple(shape)))
        return lambda values: values[at]
    return None  # numpy leaves, bytes, complex numbers: decoded one at a time


def _sequence_build(kind: type, parts: list[Build]) -> Build:
    if kind is tuple and len(parts) == 2:  # (input, target): the common sample
        first, second = parts
        return lambda values: (first(values), second(values))
    return lambda values: kind([part(values) for part in parts])


def _tuplify(descr: Any) -> Any:
    """JSON turned the tuples of a structured dtype description into lists; undo it."""
    if isinstance(descr, list):
        return [
            tuple(_tuplify(x) for x in field) if isinstance(field, list) else field
            for field in descr
        ]
    return descr


def decode(blob: np.ndarray[Any, Any], start: int = 0) -> Any:
    """Rebuild the sample stored at ``blob[start:]``; arrays are copied and own their memory."""
    (length,) = _LEN.unpack_from(blob, start)  # type: ignore[arg-type]
    head = start + _LEN.size
    return plan_of(blob[head : head + length].tobytes())(blob, start + _align(_LEN.size + length))


def plan_of(text: bytes) -> Plan:
    """The decoding function of one structure text (memoised).

    Samples of one shape share their structure text (offsets are relative), so the memo stays
    small; it is bounded, so a worker's memory does not grow with the samples read.
    """
    plan = _PARSED.get(text)
    if plan is None:
        plan = _compile(json.loads(text))
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        _PARSED[text] = plan
    return plan


def dumps(sample: Any, index: int | None = None) -> bytes:
    """Encode ``sample`` to ``bytes`` (tests and tools; the arena writes in place)."""
    encoded = encode(sample, index)
    out = np.zeros(encoded.nbytes, dtype=np.uint8)
    encoded.write_into(out)
    return out.tobytes()


def loads(data: bytes | bytearray | memoryview) -> Any:
    """Decode bytes made by ``dumps``."""
    return decode(np.frombuffer(data, dtype=np.uint8))
