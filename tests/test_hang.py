"""A collective that waits past half its deadline warns once, at WARN, on the waiting rank,
naming the collective, its sequence number and what it still waits for; at the deadline every
rank's error says which rank never entered it and what that rank last completed."""

from __future__ import annotations

import os
import tempfile
import time

import pytest
import torch

import pyring
from pyring.launch import run_ranks
from pyring.runtime.hang import account_wait
from pyring.testing.faults import check_stuck_rank, stuck_rank


def _late_peer(rank, world, store):
    log = tempfile.TemporaryFile(mode="w+")
    os.dup2(log.fileno(), 2)  # this rank's stderr, read back below
    comm = pyring.init(rank=rank, world_size=world, store=store, set_default=False, timeout=4)
    comm.all_reduce(torch.ones(10))  # #1, together
    if rank == 1:
        time.sleep(2.6)  # past half of rank 0's 4 s deadline, well before all of it
    x = torch.ones(10)
    comm.all_reduce(x)  # #2
    comm.close()
    log.seek(0)
    return log.read(), x.tolist()


def test_warning_at_half_the_deadline():
    (err0, x0), (err1, x1) = run_ranks(2, _late_peer, timeout=60)
    assert x0 == x1 == [2.0] * 10
    warnings = [line for line in err0.splitlines() if "half of the deadline" in line]
    assert len(warnings) == 1, err0
    assert warnings[0].startswith("[pyring WARN] all_reduce") and "(#2) on rank 0/2" in err0
    assert "rank 1" in warnings[0], warnings[0]  # what it waits for
    assert "half of the deadline" not in err1, err1



@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_hang_account_names_the_rank_that_never_entered(transport):
    results = run_ranks(4, stuck_rank, transport, 2.0, 3.5, timeout=120)
    assert check_stuck_rank(results, 2.0, account_wait(2.0) + 0.5) == []


def test_an_account_whose_store_fails_keeps_no_reference_to_the_core():
    # Found by the chaos soak: after the store was dropped, each timed-out communicator's
    # buffers and fds stayed until the next cyclic collection (the store's exception, kept
    # with its traceback, closed a cycle through the account's thread and the core).
    import gc
    import weakref

    from pyring.runtime import hang

    class Core:
        completed_seq, entered_seq = 3, 4

        def debug_dump(self):
            return []

    class GoneStore:
        def set(self, *args):
            raise RuntimeError("connection reset by peer")

    core = Core()
    ref = weakref.ref(core)
    gc.disable()
    try:
        text = hang.account(GoneStore(), weakref.ref(core), 0, 2, 4.0, 4, "all_reduce(count=1)")
        assert "no account of the other ranks: the store failed" in text, text
        assert "connection reset by peer" in text, text
        del core
        assert ref() is None, gc.get_referrers(ref())
    finally:
        gc.enable()
