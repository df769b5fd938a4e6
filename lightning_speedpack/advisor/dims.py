"""Find layer dimensions that tensor cores cannot use at full speed (not multiples of 8).

fp16/bf16 matrix products run on tensor cores only at full speed when their dimensions are
multiples of 8; one published measurement gives 1.3x to 4x for an output dimension of 33712
against 33708. The dimensions that matter are a Linear's features, a convolution's channels,
an Embedding's vocabulary and width, and an attention layer's embedding and head sizes. The
output vocabulary (an Embedding's ``num_embeddings`` or the last Linear's ``out_features``) is
the classic case: padding it to the next multiple of 8 costs a few unused rows and is free to do.

Pure helpers over a module's structure: nothing runs, nothing is moved to a device.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

__all__ = ["UnalignedDim", "find_unaligned_dims", "round_up"]


@dataclass(frozen=True)
class UnalignedDim:
    """One layer dimension that is not a multiple of ``multiple_of``.

    Attributes:
        module: the module's qualified name in the model (``"decoder.lm_head"``).
        layer: the module's class name (``"Linear"``).
        param: the constructor argument that holds the dimension (``"out_features"``).
        value: the dimension as it is.
        suggested: the next multiple of ``multiple_of`` at or above ``value``.
        vocab: True for an output-vocabulary dimension, the case most worth padding: an
            Embedding's ``num_embeddings``, a Linear whose ``out_features`` equals one, or the
            model's last Linear when its ``out_features`` is no other layer's input width.
    """

    module: str
    layer: str
    param: str
    value: int
    suggested: int
    vocab: bool = False

    def describe(self) -> str:
        """Return e.g. ``"lm_head (Linear) out_features=33708 -> 33712 (output vocabulary)"``."""
        name = self.module or "<root>"
        note = " (output vocabulary)" if self.vocab else ""
        return f"{name} ({self.layer}) {self.param}={self.value} -> {self.suggested}{note}"


def round_up(value: int, multiple_of: int) -> int:
    """Return the smallest multiple of ``multiple_of`` that is ``>= value``.

    Example:
        >>> round_up(33708, 8), round_up(64, 8)
        (33712, 64)
    """
    return -(-value // multiple_of) * multiple_of


_CONV = (
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
)


def _layer_dims(module: nn.Module) -> list[tuple[str, int]]:
    if isinstance(module, nn.Linear):
        return [("in_features", module.in_features), ("out_features", module.out_features)]
    if isinstance(module, _CONV):
        return [("in_channels", module.in_channels), ("out_channels", module.out_channels)]
    if isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
        return [("num_embeddings", module.num_embeddings), ("embedding_dim", module.embedding_dim)]
    if isinstance(module, nn.MultiheadAttention):
        dims = [("embed_dim", module.embed_dim), ("head_dim", module.head_dim)]
        if module.kdim != module.embed_dim:
            dims.append(("kdim", module.kdim))
        if module.vdim != module.embed_dim:
            dims.append(("vdim", module.vdim))
        return dims
    return []


def find_unaligned_dims(module: nn.Module, multiple_of: int = 8) -> list[UnalignedDim]:
    """List the Linear/Conv/Embedding/attention dimensions not divisible by ``multiple_of``.

    Modules are visited in registration order (``named_modules``). The projections inside an
    ``nn.MultiheadAttention`` are reported through its ``embed_dim``/``head_dim``, not again
    as Linears. Every dimension is listed, even tiny ones such as 3 RGB input channels or a
    1-unit regression head; callers decide what is worth reporting.

    Args:
        module: any ``nn.Module`` (a LightningModule works).
        multiple_of: the alignment to check, 8 for fp16/bf16 tensor cores.

    Returns:
        One :class:`UnalignedDim` per unaligned dimension, in module order.

    Raises:
        ValueError: ``multiple_of`` is not a positive int.

    Example:
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Embedding(33708, 512), nn.Linear(512, 33708))
        >>> [d.describe() for d in find_unaligned_dims(model)]  # doctest: +NORMALIZE_WHITESPACE
        ['0 (Embedding) num_embeddings=33708 -> 33712 (output vocabulary)',
         '1 (Linear) out_features=33708 -> 33712 (output vocabulary)']
    """
    if isinstance(multiple_of, bool) or not isinstance(multiple_of, int) or multiple_of < 1:
        raise ValueError(f"`multiple_of` must be a positive int, got {multiple_of!r}")
    named = list(module.named_modules())
    attention = [name for name, m in named if isinstance(m, nn.MultiheadAttention)]
    vocab_sizes = {
        m.num_embeddings for _, m in named if isinstance(m, (nn.Embedding, nn.EmbeddingBag))
    }
    last_linear = next(
        (
            name
            for name, m in reversed(named)
            if isinstance(m, nn.Linear) and _outside(name, attention)
        ),
        None,
    )
    # The last Linear is the output layer when its width feeds no other layer.
    widths_in = {dim for _, m in named for param, dim in _layer_dims(m) if param.startswith("in_")}
    found: list[UnalignedDim] = []
    for name, m in named:
        if not _outside(name, attention):
            continue  # an attention layer's own projections
        for param, value in _layer_dims(m):
            if value % multiple_of == 0:
                continue
            vocab = param == "num_embeddings" or (
                param == "out_features"
                and (value in vocab_sizes or (name == last_linear and value not in widths_in))
            )
            found.append(
                UnalignedDim(
                    name, type(m).__name__, param, value, round_up(value, multiple_of), vocab
                )
            )
    return found


def _outside(name: str, attention: list[str]) -> bool:
    return not any(
        (name != "" if prefix == "" else name.startswith(prefix + ".")) for prefix in attention
    )
