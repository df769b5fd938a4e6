"""WallTimeLedger: a fit's wall time charged to its causes; findings outside the step."""

from lightning_speedpack.wall_time.callback import WallTimeLedger
from lightning_speedpack.wall_time.ledger import PARTS, Ledger
from lightning_speedpack.wall_time.settings import RunSettings, ValidationRun

__all__ = ["PARTS", "Ledger", "RunSettings", "ValidationRun", "WallTimeLedger"]
