"""The whole world: every rank's evidence at rank 0, side by side, and the slow one named.

Each rank sends its own figures to rank 0 once per fit (:mod:`~lightning_speedpack.world.payload`,
one bounded point-to-point exchange). :mod:`~lightning_speedpack.world.engine` lays them out a
row per rank and finds the straggler and uneven ranks, :mod:`~lightning_speedpack.world.epochs`
epoch by epoch, :mod:`~lightning_speedpack.world.stalls` a rank that stalls in a few batches
(from the power-of-two buckets of :mod:`~lightning_speedpack.world.buckets`), and
:mod:`~lightning_speedpack.world.figures` puts them together;
:mod:`~lightning_speedpack.world.findings` says it as findings;
:mod:`~lightning_speedpack.world.revise` reads rank 0's report with the world in view;
:mod:`~lightning_speedpack.world.table` is the table the report prints. The doctor's recorder
wires them to Lightning (``speedpack doctor`` under DDP).
"""

from lightning_speedpack.world.engine import (
    Imbalance,
    Straggler,
    find_imbalance,
    find_straggler,
    world_rows,
)
from lightning_speedpack.world.epochs import slowest_by_epoch
from lightning_speedpack.world.figures import world_figures
from lightning_speedpack.world.findings import world_findings
from lightning_speedpack.world.payload import StepClock, gather_world
from lightning_speedpack.world.revise import revise_figures, revise_findings
from lightning_speedpack.world.stalls import BatchTally, Stalls, find_stalls
from lightning_speedpack.world.table import display_table, logged_table

__all__ = [
    "BatchTally",
    "Imbalance",
    "Stalls",
    "StepClock",
    "Straggler",
    "display_table",
    "find_imbalance",
    "find_stalls",
    "find_straggler",
    "gather_world",
    "logged_table",
    "revise_figures",
    "revise_findings",
    "slowest_by_epoch",
    "world_figures",
    "world_findings",
    "world_rows",
]
