"""The doctor's LossRetentionDetector: a walk every 128th step, heap scans only at the end.

``--deep`` walks every step and scans the heap on the callback's own schedule.
"""

from __future__ import annotations

from lightning_speedpack.core.registry import DoctorContext, register_diagnostic
from lightning_speedpack.retention.callback import LossRetentionDetector

__all__: list[str] = []

# Under the doctor a holder is reported at the end of the run (the end of training always walks,
# and so does the first epoch's last batch, for a list emptied at each epoch's end), so finding
# it within a few steps buys nothing there: its walk runs every 128th step. Every 16th, the walk
# was the largest part of the doctor's own code a step on the DDP zoo's 1 ms MLP (~210 of ~2,400
# interpreted lines a step); `--deep` walks every step, as the callback does by default.
_DOCTOR_CHECK_EVERY = 128
# Heap scans (~0.1 s each on a small heap) were the largest one-off costs of the doctor's
# default set: there, none is scheduled during training, and the one at the end runs only within
# 1% of the training time; `--deep` schedules one every 100 steps (within 1% of the wall time)
# and allows 5% at the end, as the callback's defaults do.
_DOCTOR_FINAL_SCAN_BUDGET = 0.01


def _factory(ctx: DoctorContext) -> LossRetentionDetector:
    if ctx.deep:
        return LossRetentionDetector(mode="warn")
    return LossRetentionDetector(
        mode="warn",
        check_every_n_steps=_DOCTOR_CHECK_EVERY,
        deep_scan_every_n_steps=0,  # heap scans on triggers and at the end only
        final_scan_budget=_DOCTOR_FINAL_SCAN_BUDGET,
    )


register_diagnostic(
    "loss_retention",
    LossRetentionDetector,
    factory=_factory,
    order=30,
    deep_adds=(
        "the walk for retained graphs on every step (by default every 128th and the first epoch's"
        " last batch) and the heap scan at"
        " the end of training within 5% of the training time (by default 1%), and one every 100"
        " steps within 1% of the wall time (by default none during training)"
    ),
)
