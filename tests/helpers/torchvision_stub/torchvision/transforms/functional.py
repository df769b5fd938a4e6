"""``torchvision.transforms.functional`` stand-in: the one name ``streaming.vision`` imports."""

from typing import Any

__all__ = ["to_tensor"]


def to_tensor(pic: Any) -> Any:
    """Not available: the real torchvision is not installed (see the package docstring)."""
    raise NotImplementedError("torchvision stub: to_tensor is not available in the tests")
