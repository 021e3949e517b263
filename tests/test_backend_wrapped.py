"""The backend's methods as torch.compile leaves them (pyring._c10d_work.eager_under_compile
wraps every c10d method): torch's synchronous send and recv are still recognised through the
wrapper, so they run to the end in place rather than through a queued Work."""

from __future__ import annotations

import torch
import torch.distributed as dist

from pyring import backend
from pyring.launch import run_ranks


def _p2p(rank, world, store):
    seen = []
    plain = backend._called_from_sync_p2p

    def spy(frame):
        seen.append(plain(frame))
        return seen[-1]

    backend._called_from_sync_p2p = spy
    dist.init_process_group("pyring", store=store, rank=rank, world_size=world)
    t = torch.full((5,), float(rank))
    if rank == 0:
        dist.send(t, dst=1)  # 0
        dist.recv(t, src=1)  # 10
        t += 1
        dist.isend(t, dst=1).wait()  # 11
    else:
        dist.recv(t, src=0)
        t += 10
        dist.send(t, dst=0)
        dist.irecv(t, src=0).wait()
    dist.destroy_process_group()
    return seen, t.tolist()


def test_synchronous_send_and_recv_are_recognised_through_the_wrappers():
    assert getattr(backend.ProcessGroupPyring.send, "__wrapped__", None) is not None or not hasattr(
        torch, "compiler"), "the group's send is not wrapped: this test checks nothing"
    got = run_ranks(2, _p2p, timeout=60)
    for seen, _ in got:
        assert seen == [True, True, False], seen  # send, recv, then isend / irecv
    assert got[0][1] == got[1][1] == [11.0] * 5
