"""lightning-speedpack: find and remove the reasons a Lightning training run is slow.

Every public name is importable from here::

    from lightning_speedpack import ThroughputLogger, SyncPointWarnings

Importing the package registers each diagnostic with ``speedpack doctor``. Optional
dependencies (``wandb``, ``nvidia-ml-py``) are imported only when used.
"""

from lightning_speedpack.__about__ import __version__
from lightning_speedpack.doctor import Finding

__all__ = [
    "Finding",
    "__version__",
]
