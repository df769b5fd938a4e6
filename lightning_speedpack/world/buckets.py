"""Power-of-two buckets of a rank's batch times: its typical batch, and the batches far above it.

A rank sends, per kind of time (its own time, its ``backward``), ``[exponent, batches, seconds]``
per bucket: bucket ``e`` holds the batches of ``2**(e-1) <= t < 2**e`` seconds
(``math.frexp``). A few lines a batch to keep, and enough to read a robust typical batch and
what the long ones cost (:class:`~lightning_speedpack.world.stalls.BatchTally` keeps them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from math import ldexp

__all__ = ["Buckets", "beyond", "bucket_rows", "typical_s"]

Buckets = Sequence[Sequence[float]]
"""``[[exponent, batches, seconds], ...]``."""


def bucket_rows(counts: Mapping[int, int], sums: Mapping[int, float]) -> list[list[float]]:
    """The buckets as rows, lowest first (seconds rounded to the microsecond).

    Example:
        >>> bucket_rows({-7: 3, -2: 1}, {-7: 0.0150004, -2: 0.15})
        [[-7, 3, 0.015], [-2, 1, 0.15]]
    """
    return [[e, counts[e], round(sums[e], 6)] for e in sorted(counts)]


def typical_s(buckets: Buckets) -> float:
    """The mean of the bucket that holds the median batch (0 for none).

    Within a factor of two of the median, and untouched by a few batches far above it.

    Example:
        >>> typical_s([[-7, 60, 0.3], [-2, 4, 0.6]])  # 60 batches of 5 ms, 4 of 150 ms
        0.005
    """
    total = sum(int(n) for _, n, _ in buckets)
    seen = 0
    for _, n, s in sorted(buckets, key=lambda bucket: bucket[0]):
        seen += int(n)
        if n and 2 * seen >= total:
            return float(s) / int(n)
    return 0.0


def beyond(buckets: Buckets, typical: float, least: float) -> tuple[int, float]:
    """Batches whose bucket lies wholly ``least`` s or more above ``typical``, and their excess.

    A batch just above the line may be left out (its bucket straddles it), never a typical one
    counted in.

    Example:
        >>> beyond([[-7, 60, 0.3], [-2, 4, 0.6]], typical=0.005, least=0.02)
        (4, 0.58)
    """
    count, excess = 0, 0.0
    for e, n, s in buckets:
        if ldexp(0.5, int(e)) >= typical + least:  # the bucket's lower edge
            count += int(n)
            excess += float(s) - int(n) * typical
    return count, round(excess, 6)
