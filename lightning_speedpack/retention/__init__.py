"""LossRetentionDetector: autograd graphs kept alive across steps, named by what holds them."""

from lightning_speedpack.retention.callback import (
    LossRetentionDetector,
    RetainedGraph,
    RetainedGraphError,
    RetainedGraphWarning,
)

__all__ = ["LossRetentionDetector", "RetainedGraph", "RetainedGraphError", "RetainedGraphWarning"]
