"""Which node this process runs on, as the launcher tells it (no network, no hostname)."""

from __future__ import annotations

import os
import re

__all__ = ["NODE_ID_VARIABLES", "node_id"]

NODE_ID_VARIABLES = ("LIGHTNING_SPEEDPACK_NODE_ID", "GROUP_RANK", "NODE_RANK", "SLURM_NODEID")


def node_id() -> str:
    """The identity of this process's node, the same for every rank on it.

    Read from the environment, first set wins: ``LIGHTNING_SPEEDPACK_NODE_ID`` (an override, e.g.
    to simulate several nodes on one host), ``GROUP_RANK`` (``torchrun``: the rank of this
    node's agent), ``NODE_RANK`` (Lightning), ``SLURM_NODEID`` (``srun``); ``"0"`` otherwise.
    Characters other than letters, digits, ``.``, ``_`` and ``-`` become ``_``.

    ``CachedDataset`` puts it in its shared-memory file's name, so two nodes that share one
    ``/dev/shm`` (``torchrun --nnodes 2`` on one host) each fill an arena of their own, as two
    real nodes would.

    Example:
        >>> import os
        >>> os.environ["LIGHTNING_SPEEDPACK_NODE_ID"] = "sim/1"
        >>> node_id()
        'sim_1'
        >>> del os.environ["LIGHTNING_SPEEDPACK_NODE_ID"]
    """
    for variable in NODE_ID_VARIABLES:
        value = os.environ.get(variable, "").strip()
        if value:
            return re.sub(r"[^A-Za-z0-9._-]", "_", value)
    return "0"
