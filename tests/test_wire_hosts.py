"""The fp16 and bf16 wires over two emulated hosts, one rank on the first and two on the second:
the flat schedule (algo ring) then crosses shared memory and TCP links in one call. Every rank
must cut its chunks into the same segments (the slowest link of any pair decides, the network's
fine segments here), and the sums of small integers must come back exact, for a bucket of fine
segments, one with the segment cap, and one below a segment. The hierarchical schedule (auto)
is checked the same way."""

from __future__ import annotations

import os
import sys

import pytest

from pyring.tools import emulate as _emulate

OK, WHY = _emulate.available(shaping=False)
SIZES = (3 * 100_003 + 2, 3 * 1_310_720 + 5, 3 * 1000 + 1)


def _rank() -> None:
    from half_sums import half_sum_errors

    import pyring
    from pyring.tools.emulate import report

    comm = pyring.init(set_default=False)
    rank, world = comm.rank, comm.world_size
    links = sorted({comm.transport(p) for p in range(world) if p != rank})
    out = {"links": links, "wrong": {}}
    for algo in ("ring", "auto"):
        out["wrong"].update(half_sum_errors(comm, SIZES, algo))
    comm.close()
    report(out)


@pytest.mark.skipif(not OK, reason=WHY)
def test_half_wires_across_hosts_are_exact():
    with _emulate.EmulatedHosts(hosts=2) as hosts:
        results = hosts.run([1, 2], [sys.executable, os.path.abspath(__file__)], timeout=240)
    assert [r["links"] for r in results] == [["tcp"], ["shm", "tcp"], ["shm", "tcp"]], results
    for r in results:
        assert set(r["wrong"].values()) == {0}, r["wrong"]


if __name__ == "__main__":
    _rank()
