"""CommMonitor: what DDP's gradient all-reduce and ``sync_dist=True`` logging cost each step."""

from lightning_speedpack.comm.callback import CommMonitor

__all__ = ["CommMonitor"]
