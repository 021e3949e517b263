"""all_reduce on symmetric tensors across emulated hosts (csrc/collectives/zero_copy_hosts.cc):
zero-copy within each host, a ring of the ranks at one position across the hosts, over tcp.
Results per dtype and op, the bytes on the links (none inside a host; what the tree sends
across), and uneven hosts, which keep the links' schedule."""

from __future__ import annotations

import os
import sys

import pytest

from pyring.tools import emulate as _emulate
from pyring.tools.emulate import EmulatedHosts

OK, WHY = _emulate.available()
pytestmark = pytest.mark.skipif(not OK, reason=WHY)
JOB = os.path.join(os.path.dirname(__file__), "scripts", "hosts_symmetric_job.py")
HEADER_ALLOWANCE = 256  # bytes per collective per link, beyond the payload


def run(layout) -> list[dict]:
    with EmulatedHosts(hosts=len(layout)) as h:
        res = h.run(layout, [sys.executable, JOB], env={"OMP_NUM_THREADS": "1"}, timeout=150)
    wrong = [w for r in res for w in r["wrong"]]
    assert not wrong, "\n".join(wrong[:20])
    return res


@pytest.mark.parametrize("g", [2, 3])
def test_two_hosts_run_zero_copy_within_each(g):
    res = run([g, g])
    size = 983040 * 4
    for r in res:
        assert r["zero_copy_calls"] == r["calls"], r
        mine = [int(p) // g == r["host"] for p in r["sent"]]
        local = sum(n for (p, n), m in zip(r["sent"].items(), mine) if m)
        across = sum(n for (p, n), m in zip(r["sent"].items(), mine) if not m)
        assert local == 0, r  # nothing inside a host went through a slot
        # Its chunk (size / g) once across (2 hosts: 2(H-1)/H = 1), plus headers.
        assert size // g <= across <= size // g + 16 + HEADER_ALLOWANCE, r
        assert r["zero_copy_bytes"] > 0, r


def test_uneven_hosts_keep_the_links_schedule():
    for r in run([3, 2]):
        assert r["zero_copy_calls"] == 0, r
