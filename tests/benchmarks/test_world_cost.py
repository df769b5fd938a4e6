"""``benchmarks/world_cost.py``: the figures ``make bench-check`` reads from its ``--json``.

No fit runs here (the benchmark itself is ``make bench-check``'s): the summary of planted
seconds must be the ratio of the medians and the median of the paired ratios, the plain fits'
own being 1.
"""

from __future__ import annotations

import pytest

from benchmarks import world_cost


def test_the_summary_is_the_ratio_of_the_medians_and_the_median_of_paired_ratios() -> None:
    seconds = {
        "plain": [2.0, 1.0, 4.0],  # median 2.0
        "doctor": [2.2, 1.3, 4.0],  # median 2.2; paired 1.1, 1.3, 1.0
        "plain, again": [1.8, 1.0, 4.4],  # median 1.8; paired 0.9, 1.0, 1.1
    }
    out = world_cost.summary(seconds)
    assert out["plain"] == {"median_s": 2.0, "ratio": 1.0, "paired": 1.0}
    assert out["doctor"]["median_s"] == 2.2
    assert out["doctor"]["ratio"] == pytest.approx(1.1)
    assert out["doctor"]["paired"] == pytest.approx(1.1)
    assert out["plain, again"]["ratio"] == pytest.approx(0.9)  # the A/A
    assert out["plain, again"]["paired"] == pytest.approx(1.0)
