"""torch tensors on the sim device (pyring.testing.sim_torch): the device paths of the drop-in
optimizer, DDP through the backend, the DDP hooks and OneBitAdam, run in CI as a user runs them
on CUDA tensors, against the same runs on the CPU. Every sim operation is delayed at random, so
a missing stream wait shows as a wrong value."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from device_training import training_body

from pyring.launch import run_ranks

_DELAY = {"PYRING_SIM_DELAY_US": "100"}


def _torch_on_sim(rank, world, store):
    from pyring.testing import sim_torch

    sim_torch.enable()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    twin = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    twin.load_state_dict(net.state_dict())
    twin.to("sim:0")
    assert all(p.device == torch.device("sim:0") for p in twin.parameters())
    x = torch.randn(5, 4)
    for model, inp in ((net, x), (twin, x.to("sim:0"))):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for _ in range(3):
            opt.zero_grad()
            model(inp).square().mean().backward()
            opt.step()
    for a, b in zip(net.parameters(), twin.parameters()):
        assert torch.equal(a, b.cpu())
    z = torch.zeros(3, device="sim:0")
    h = torch.arange(3.0)
    z.copy_(h)  # a host source is read when the copy is queued
    h.fill_(9.0)
    z.add_(1.0)
    assert z.tolist() == [1.0, 2.0, 3.0] and z.sum().item() == 6.0
    big = torch.ones(1 << 16, device="sim:0")
    big.resize_(1 << 17)  # growing keeps the old contents
    assert big[: 1 << 16].sum().item() == float(1 << 16)
    try:
        z.add_(h)
        return "mixed devices accepted"
    except RuntimeError as e:
        assert "sim:0" in str(e) and "cpu" in str(e), e
    return "ok"


def test_torch_runs_on_the_sim_device():
    """Queued operations, autograd and host reads on sim tensors give the CPU's values."""
    assert run_ranks(1, _torch_on_sim, env={"PYRING_SIM_DELAY_US": "50"}) == ["ok"]


def _stream_order(rank, world, store):
    import pyring
    from pyring.testing import sim, sim_torch

    sim_torch.enable()
    bad = []
    with pyring.init(rank, world, store, set_default=False) as comm:
        side = sim.SimStream(0)
        for current in (sim.current_stream(0), side):  # the default stream, and a user's
            with sim.stream(current):
                bad += _ordered_calls(comm, world, current)
        side.close()
        sim_torch.storage_bytes()  # frees what the closed stream allocated
        mixed = torch.zeros(3, device="sim:0")
        try:
            comm.all_reduce(mixed, out=torch.zeros(3))
            bad.append("mixed devices accepted")
        except ValueError as e:
            if "sim:0" not in str(e) or "cpu" not in str(e):
                bad.append(f"mixed devices message: {e}")
    return bad


def _ordered_calls(comm, world, current):
    from pyring.testing import sim_torch

    bad = []
    for n in (1, 1001, (1 << 18) + 3):
        t = torch.full((n,), float(comm.rank + 1), device="sim:0")
        t.mul_(2)  # queued before the call: the collective must wait for it
        comm.all_reduce(t)
        t.add_(1)  # queued after: it must see the result
        want = 2.0 * sum(range(1, world + 1)) + 1
        if not bool((t == want).all()):
            bad.append(f"{current} sync n={n}: {t[:3].tolist()}")
        # The only reference to the input goes with the call; the memory must not be reused
        # before the collective ends.
        w = comm.all_reduce(torch.full((n,), float(comm.rank), device="sim:0"), async_op=True)
        sim_torch.storage_bytes()  # frees what no tensor holds
        for _ in range(3):
            torch.full((n,), -7.0, device="sim:0")
        w.wait()
        if not bool((w.result() == float(sum(range(world)))).all()):
            bad.append(f"{current} async n={n}: {w.result()[:3].tolist()}")
    return bad


@pytest.mark.parametrize("world", [2, 3])
def test_stream_order_and_lifetime_on_sim_tensors(world):
    assert run_ranks(world, _stream_order, env=_DELAY) == [[]] * world


@pytest.mark.parametrize("bound", [False, True], ids=["staged", "cuda_ipc"])
def test_training_on_sim_matches_cpu(bound):
    """Two ranks on one sim device, staged through the host or bound to it (cuda_ipc): DDP on
    the pyring backend (plain, with the bf16 hook and with the one-bit hook),
    DistributedOptimizer, OneBitAdam and PeriodicAveraging end with the parameters (and one-bit
    residuals) of the same runs on the CPU, bit for bit except the one-bit runs: the sim device
    runs the CUDA kernels' bodies (kernels/host_grid.cc), whose one-bit encoder sums a segment's
    squares in another order than the host's, so its scales differ in the last bits and a value
    within that of zero may take the other sign, as on a GPU (test_gpu_collectives)."""
    cpu = run_ranks(2, training_body, "cpu", timeout=300)
    env = dict(_DELAY, PYRING_DEVICE="sim:0") if bound else _DELAY
    sim = run_ranks(2, training_body, "sim:0", env=env, timeout=300)
    for rank, (c, s) in enumerate(zip(cpu, sim)):
        assert c.keys() == s.keys()
        how = s.pop("how")
        c.pop("how")
        if bound:  # device to device: the host links carried headers only
            assert how["device_transport"] == "cuda_ipc" and how["device_link_bytes"] > 0, how
        else:
            assert how == {"device_transport": None, "device_link_bytes": 0}, how
        for name in c:
            assert len(c[name]) == len(s[name]) > 0, name
            for a, b in zip(c[name], s[name]):
                if "onebit" not in name:
                    assert np.array_equal(a, b), (rank, name, float(np.abs(a - b).max()))
                    continue
                rtol = 1e-5
                if a.dtype == np.int16:  # kept residuals, as bfloat16 bits: to one rounding
                    a, b = (torch.from_numpy(v).view(torch.bfloat16).float().numpy()
                            for v in (a, b))
                    rtol = 2**-7
                far = int((abs(a - b) > 1e-5 + rtol * abs(a)).sum())
                assert far <= max(1, a.size // 1000), (rank, name, far, float(np.abs(a - b).max()))


def _coalesced(rank, world, store):
    """Asynchronous coalesced calls on sim tensors, each way of waiting: the copy-out from the
    exchange's buffer sees the results."""
    import time

    import pyring
    from pyring.testing import sim_torch

    sim_torch.enable()
    bad = []
    sizes = (3, 1001, (1 << 16) + 5)
    want = 2.0 * sum(range(1, world + 1))
    with pyring.init(rank, world, store, set_default=False) as comm:
        for how in ("wait", "synchronize", "is_completed", "future"):
            ts = [torch.full((n,), float(rank + 1), device="sim:0") for n in sizes]
            for t in ts:
                t.mul_(2)  # queued before the call
            outs = [[torch.full((n,), -1.0, device="sim:0") for n in sizes]
                    for _ in range(world)]
            works = [comm.all_reduce_coalesced(ts, async_op=True),
                     comm.all_gather_coalesced(outs, [t.clone() for t in ts], async_op=True)]
            for w in works:
                if how == "future":
                    w.get_future().wait()
                elif how == "is_completed":
                    t0 = time.monotonic()
                    while not w.is_completed():
                        assert time.monotonic() - t0 < 60, "is_completed() stays False"
                else:
                    getattr(w, how)()
            for t in ts:
                if not bool((t == want).all()):
                    bad.append(f"all_reduce_coalesced, {how}: {t[:3].tolist()}")
            for r, row in enumerate(outs):
                for o in row:
                    if not bool((o == 2.0 * (r + 1)).all()):
                        bad.append(f"all_gather_coalesced from {r}, {how}: {o[:3].tolist()}")
    return bad


@pytest.mark.parametrize("bound", [False, True], ids=["staged", "cuda_ipc"])
def test_asynchronous_coalesced_calls_on_sim_tensors_copy_out_the_results(bound):
    env = dict(_DELAY, PYRING_DEVICE="sim:0") if bound else _DELAY
    assert run_ranks(2, _coalesced, env=env, timeout=120) == [[], []]
