"""DistributedOptimizer(staleness=s): step t applies the average of the gradients of step
t - s (stale-synchronous parallel), checked against the same schedule computed in one process."""

from __future__ import annotations

import pytest
import torch

from pyring.launch import run_ranks

STEPS, LR = 7, 0.1


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))


def _data(rank: int, t: int):
    g = torch.Generator().manual_seed(100 * rank + t)
    return torch.randn(8, 6, generator=g), torch.randn(8, 2, generator=g)


def body(rank, world, store, staleness):
    import pyring

    comm = pyring.init(rank, world, store, set_default=False)
    net = _net()
    opt = pyring.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=LR),
                                      net.named_parameters(), comm=comm, staleness=staleness)
    for t in range(STEPS):
        x, y = _data(rank, t)
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    comm.close()
    return [p.detach().numpy().copy() for p in net.parameters()]


def reference(world: int, staleness: int) -> list:
    net = _net()
    grads = []
    for t in range(STEPS):
        per_rank = []
        for r in range(world):
            net.zero_grad()
            x, y = _data(r, t)
            torch.nn.functional.mse_loss(net(x), y).backward()
            per_rank.append([p.grad.clone() for p in net.parameters()])
        grads.append([sum(gs) / world for gs in zip(*per_rank)])
        if t >= staleness:
            with torch.no_grad():
                for p, g in zip(net.parameters(), grads[t - staleness]):
                    p.add_(g, alpha=-LR)
    return [p.detach().numpy() for p in net.parameters()]


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_step_t_applies_the_average_of_step_t_minus_s(staleness):
    import numpy as np

    want = reference(2, staleness)
    for got in run_ranks(2, body, staleness, timeout=120):
        for a, b in zip(got, want):
            assert np.allclose(a, b, rtol=1e-5, atol=1e-7), (staleness, np.abs(a - b).max())


def refused_body(rank, world, store):
    import pyring

    comm = pyring.init(rank, world, store, set_default=False)
    out = []
    for kw in ({"staleness": -1}, {"staleness": 1, "compression": "bf16"}):
        try:
            pyring.DistributedOptimizer(torch.optim.SGD(_net().parameters(), lr=0.1), comm=comm,
                                        **kw)
        except ValueError as e:
            out.append(str(e))
    comm.close()
    return out


def test_bad_staleness_is_refused():
    msgs = run_ranks(1, refused_body, timeout=60)[0]
    assert "staleness must be an int >= 0" in msgs[0], msgs
    assert "staleness > 0 takes compression='none'" in msgs[1], msgs
