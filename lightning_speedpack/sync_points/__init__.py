"""SyncPointWarnings: every GPU->CPU synchronisation in a training step, with its file:line."""

from lightning_speedpack.sync_points.callback import SyncFinding, SyncPointError, SyncPointWarnings

__all__ = ["SyncFinding", "SyncPointError", "SyncPointWarnings"]
