"""ThroughputLogger: sync-free samples/s, data wait, MFU and NVML figures to every logger."""

from lightning_speedpack.throughput.callback import ThroughputLogger

__all__ = ["ThroughputLogger"]
