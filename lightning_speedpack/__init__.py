"""lightning-speedpack: find and remove the reasons a Lightning training run is slow."""

from lightning_speedpack.__about__ import __version__

__all__ = ["__version__"]
