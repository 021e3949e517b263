"""pyring.tools.timing: the aggregate every benchmark reports."""

import pytest

from pyring.tools.timing import slowest_median, slowest_per_iteration


def test_slowest_rank_per_iteration_then_the_median():
    ranks = [[1.0, 5.0, 2.0], [2.0, 3.0, 9.0]]
    assert slowest_per_iteration(ranks) == [2.0, 5.0, 9.0]
    assert slowest_median(ranks) == 5.0


def test_ranks_with_different_iteration_counts_are_refused():
    with pytest.raises(ValueError, match="different numbers of iterations"):
        slowest_per_iteration([[1.0, 2.0], [1.0]])
