"""``torchvision.datasets`` stand-in: only the name ``streaming.vision`` subclasses."""

__all__ = ["VisionDataset"]


class VisionDataset:
    """Empty: a base of ``streaming.vision.StreamingVisionDataset``, which the tests never use."""
