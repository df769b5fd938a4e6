"""What rank 0 sends every rank: each knob ``apply=`` may change survives the encoding."""

from __future__ import annotations

import pytest

from lightning_speedpack import WhatIf
from lightning_speedpack.what_if.apply import decode, encode
from lightning_speedpack.what_if.knobs import RUN_TIME
from lightning_speedpack.what_if.measure import Measurement
from lightning_speedpack.what_if.model_trials import MODEL_VARIANTS


def test_every_run_time_winner_survives_the_encoding() -> None:
    # The values the trials give each knob, as WhatIf._winners passes them to every rank.
    values = {v.knob: v.value for v in MODEL_VARIANTS if v.knob in RUN_TIME}
    values.update({"num_workers": 2, "prefetch_factor": 4, "persistent_workers": True})
    values["pin_memory"] = True
    assert set(values) == RUN_TIME
    assert decode(encode(values)) == values


def test_winners_are_plain_values_every_rank_can_apply() -> None:
    what_if = WhatIf(apply=True, verbose=False)
    what_if.measurements = [
        Measurement(v.knob, "model", "today", v.candidate, v.value, [1.0] * 3, [2.0] * 3)
        for v in MODEL_VARIANTS
    ]
    winners = what_if._winners()
    assert winners == {
        "channels_last": True,
        "fused_optimizer": True,
        "cudnn_benchmark": True,
        "tf32": True,
    }
    assert decode(encode(winners)) == winners


@pytest.mark.parametrize("bad", [{"num_workers": "2"}, {"channels_last": "channels_last"}])
def test_a_value_that_cannot_be_applied_is_refused_by_name(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="to be applied"):
        encode(bad)
