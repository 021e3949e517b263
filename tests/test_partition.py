"""A silent partition between two emulated hosts in the middle of a 64 MiB allreduce: every
packet between them is dropped and no reset arrives. Every rank raises within the deadline and
the hang account's wait, naming a rank of the other host (and its address), and exits."""

from __future__ import annotations

import pytest

from pyring.runtime.hang import account_wait
from pyring.testing.partition import check_partition, run_partition
from pyring.testing.sanitize import slowdown
from pyring.tools import emulate as _emulate

OK, WHY = _emulate.available(shaping=True)
pytestmark = pytest.mark.skipif(not OK, reason=WHY)
# The first 64 MiB allreduce must end within it: under TSan it took more than 3 s.
TIMEOUT_S = 3.0 * slowdown()


def test_partition_raises_on_every_rank_naming_the_other_host():
    results, addresses = run_partition(hosts=2, ranks_per_host=2, timeout_s=TIMEOUT_S)
    assert check_partition(results, addresses, 2, TIMEOUT_S,
                           account_wait(TIMEOUT_S) + 0.25) == []
