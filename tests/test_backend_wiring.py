"""How the backend's group is wired into torch: its methods as torch.compile leaves them
(pyring.c10d.work.eager_under_compile wraps every c10d method), where torch's synchronous send
and recv must still be recognised, so that they run to the end in place rather than through a
queued Work; and mixed backend strings (pyring.c10d.routes), where each device's tensors go to
the backend the string names for it."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from pyring.c10d import backend
from pyring.launch import RankFailure, run_ranks


def _spy_on_sync_p2p() -> list:
    seen = []
    plain = backend._called_from_sync_p2p

    def spy(frame):
        seen.append(plain(frame))
        return seen[-1]

    backend._called_from_sync_p2p = spy
    return seen


def _p2p(rank):
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
    return t.tolist()


def _job(rank, world, store, spec):
    seen = _spy_on_sync_p2p()
    dist.init_process_group(spec, store=store, rank=rank, world_size=world)
    pg = dist.group.WORLD
    before = pg.comm.stats()["bytes_sent"]
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    b = torch.full((3,), float(rank))
    dist.broadcast(b, src=1)
    out = torch.empty(4)
    dist.all_gather_into_tensor(out, torch.full((2,), float(rank)))
    rs = torch.empty(2)
    dist.reduce_scatter_tensor(rs, torch.arange(4.0))
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank})
    p2p = _p2p(rank)
    moved = pg.comm.stats()["bytes_sent"] - before
    sub = dist.new_group([0, 1])
    dist.all_reduce(t, group=sub)
    backends = {d: type(g._get_backend(torch.device(d))).__name__
                for g in (pg, sub) for d in ("cpu", "cuda")}
    dist.destroy_process_group()
    return {"values": [t.tolist(), b.tolist(), out.tolist(), rs.tolist(), objs, p2p],
            "moved": moved, "sync_p2p": seen, "backends": backends}


def _want(rank):
    return [[6.0] * 4, [1.0] * 3, [0.0, 0.0, 1.0, 1.0], [[0.0, 2.0], [4.0, 6.0]][rank],
            [{"rank": 0}, {"rank": 1}], [11.0] * 5]


@pytest.mark.parametrize("spec, cpu, on_pyring", [
    ("pyring", "ProcessGroupPyring", True),
    ("cpu:pyring,cuda:gloo", "ProcessGroupPyring", True),
    ("cpu:gloo,cuda:pyring", "ProcessGroupGloo", False),
])
def test_each_device_goes_to_its_backend(spec, cpu, on_pyring):
    assert getattr(backend.ProcessGroupPyring.send, "__wrapped__", None) is not None or not hasattr(
        torch, "compiler"), "the group's send is not wrapped: the p2p check tests nothing"
    cuda = "ProcessGroupGloo" if spec == "cpu:pyring,cuda:gloo" else "ProcessGroupPyring"
    for rank, got in enumerate(run_ranks(2, _job, spec, timeout=90)):
        assert got["values"] == _want(rank), got["values"]
        assert got["backends"] == {"cpu": cpu, "cuda": cuda}, got["backends"]  # subgroup too
        # The CPU tensors' bytes went through pyring, or none of them did; torch's synchronous
        # send and recv were recognised where pyring ran them.
        assert (got["moved"] > 0) == on_pyring, got["moved"]
        assert got["sync_p2p"] == ([True, True, False] if on_pyring else []), got["sync_p2p"]


def _refused(rank, world, store):
    dist.init_process_group("cpu:pyring,cuda:mpi", store=store, rank=rank, world_size=world)


def test_a_backend_pyring_cannot_hand_tensors_to_is_refused_naming_the_string():
    with pytest.raises(RankFailure, match=r"cpu:pyring,cuda:mpi.*'mpi'.*gloo or nccl"):
        run_ranks(2, _refused, timeout=60)
