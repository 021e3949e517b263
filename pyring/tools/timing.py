"""The figure a timing loop over several ranks reports: per iteration the slowest rank's time
(a collective is done when its last rank is), then the median over iterations. Every benchmark
under bench/ and the self-check aggregate their ranks' times here."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def slowest_per_iteration(per_rank: Sequence[Sequence[float]]) -> list[float]:
    """Per iteration, the largest of the ranks' times. Raises ValueError when the ranks timed
    different numbers of iterations (a rank that stopped early would otherwise vanish)."""
    lengths = {len(times) for times in per_rank}
    if len(lengths) != 1:
        raise ValueError(f"ranks timed different numbers of iterations: {sorted(lengths)}")
    return [max(it) for it in zip(*per_rank)]


def slowest_median(per_rank: Sequence[Sequence[float]]) -> float:
    """The median over iterations of the slowest rank's time."""
    return statistics.median(slowest_per_iteration(per_rank))
