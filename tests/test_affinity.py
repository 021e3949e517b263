"""PYRING_AFFINITY: where the launcher left every local rank free, each rank's threads are
bound to its share of the CPUs at init; otherwise nothing is touched."""

from __future__ import annotations

import os
import time

import pytest

import pyring
from pyring.launch import run_ranks
from pyring.runtime import affinity as _affinity


def test_shares_are_contiguous_disjoint_and_cover_the_cpus():
    cpus = [0, 1, 2, 3, 4, 5, 6]
    shares = [_affinity.share(cpus, i, 3) for i in range(3)]
    assert shares == [[0, 1, 2], [3, 4], [5, 6]]
    assert _affinity.cpus_text([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


@pytest.mark.parametrize("mode, masks, index, want", [
    ("auto", [[0, 1], [0, 1]], 1, [1]),
    ("off", [[0, 1], [0, 1]], 0, None),
    ("auto", [[0, 1]], 0, None),                    # alone on its host
    ("auto", [[0], [1]], 0, None),                  # the launcher bound them apart
    ("auto", [[0, 1], [0, 1], [0, 1]], 0, None),    # more ranks than CPUs
])
def test_plan(mode, masks, index, want):
    cpus, why = _affinity.plan(mode, masks[index], masks, index)
    assert cpus == want, why
    assert why


def _bound(rank, world, store, preset):
    if preset:
        os.sched_setaffinity(0, preset[rank])
    before = sorted(os.sched_getaffinity(0))
    comm = pyring.init(rank=rank, world_size=world, store=store, set_default=False)
    after = sorted(os.sched_getaffinity(0))
    comm.close()
    return before, after


def test_ranks_bound_apart_at_init():
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs")
    got = run_ranks(2, _bound, None, timeout=60)
    assert [a for _, a in got] == [_affinity.share(cpus, r, 2) for r in range(2)]


def test_off_and_launcher_bindings_are_left_alone():
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs")
    for before, after in run_ranks(2, _bound, None, env={"PYRING_AFFINITY": "off"}, timeout=60):
        assert before == after == cpus
    preset = [[cpus[1]], [cpus[0]]]  # a launcher that bound rank 0 to the second CPU
    for rank, (before, after) in enumerate(run_ranks(2, _bound, preset, timeout=60)):
        assert before == after == preset[rank]


def _own_threads(rank, world, store):
    import torch

    comm = pyring.init(rank=rank, world_size=world, store=store, set_default=False)
    t = torch.ones(8)
    done = []
    # A callback thread starts for a future made while its work is pending (one made after
    # runs its callbacks at once): each rank, in turn, enters first, the other late.
    for late in (1, 0):
        if rank == late:
            time.sleep(0.3)
        work = comm.all_reduce(t, async_op=True)
        work.get_future().then(lambda f: done.append(1)).wait()
    comm.send(t, dst=1 - rank) if rank == 0 else comm.recv(t, src=0)
    threads = {}
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/comm") as f:
            name = f.read().strip()
        if name.startswith("pyring-"):
            threads.setdefault(name, []).append(sorted(os.sched_getaffinity(int(task))))
    mine = sorted(os.sched_getaffinity(0))
    comm.close()
    return threads, mine


def test_own_threads_are_named_and_share_their_ranks_cpus():
    """top -H and perf tell pyring's threads from the caller's; each runs on its rank's share."""
    got = run_ranks(2, _own_threads, timeout=60)
    for threads, mine in got:
        assert {"pyring-progress", "pyring-p2p", "pyring-callback"} <= set(threads), threads
        assert all(cpus == mine for masks in threads.values() for cpus in masks), (threads, mine)
