"""The doctor's StepTimeline: from step 16 one step in 8, from 64 one in 64 (``--deep``: all)."""

from __future__ import annotations

from lightning_speedpack.core.registry import DoctorContext, register_diagnostic
from lightning_speedpack.core.sampling import DOCTOR_SAMPLE_EVERY
from lightning_speedpack.timeline import options
from lightning_speedpack.timeline.callback import StepTimeline

# Under the doctor the phases are shares and means: after the first 16 steps (all timed, for a
# short fit's series), one step in 8 gives them, and from step 64 (22 steps timed) one in 64.
# The timeline was the largest part of the doctor's own code a step on the DDP zoo's 1 ms MLP
# (~520 of ~1,900 lines); `--deep` times every step. The sync points sample the same steps.


def _doctor_factory(ctx: DoctorContext) -> StepTimeline:
    steps, directory = options.doctor_trace()
    every = 1 if ctx.deep else DOCTOR_SAMPLE_EVERY
    return StepTimeline(trace_steps=steps, trace_dir=directory, sample_every_n_steps=every)


register_diagnostic(
    "timeline",
    StepTimeline,
    factory=_doctor_factory,
    order=60,
    deep_adds=(
        "the step phases of every step (by default one step in 8 after the first 16, one in 64"
        " from step 64)"
    ),
)
