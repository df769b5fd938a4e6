"""WhatIf: every speed remedy tried on the user's own model and data, the gain measured.

This room sits between the doctor and the other tools: it tries their remedies (the cache's
``CachedDataset``, the tuner's nearest multiples of 8, the data X-ray's loader ceiling) as the
doctor runs their diagnostics. No tool imports it; the advisor hears its results through
:data:`lightning_speedpack.core.events.WHAT_IF`.

Its floor (``LAYERS`` in ``tests/test_layout.py``, which enforces it): above the tools it
imports (``cache``, ``batch_size``, ``data_xray``) and below the doctor. It imports those
tools' remedies as they are instead of moving them to ``core``: a remedy is the tool's own
mechanism, and trying it is what this room is for.
"""

from lightning_speedpack.what_if.callback import WhatIf
from lightning_speedpack.what_if.engine import TrialPlan, Trials, WhatIfError
from lightning_speedpack.what_if.knobs import ALL_KNOBS, RUN_TIME
from lightning_speedpack.what_if.measure import Measurement

__all__ = ["ALL_KNOBS", "RUN_TIME", "Measurement", "TrialPlan", "Trials", "WhatIf", "WhatIfError"]
