"""pyring.DistributedOptimizer, broadcast_parameters and broadcast_optimizer_state on real ranks.

Training cases compare N ranks (each on its own batch) with one process stepping on the loss
averaged over all N batches, computed here in the test process: parameters must agree to 1e-6
of each tensor's scale, and be bit-identical across ranks.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import pyring
from pyring.launch import run_ranks

STEPS = 4


class Net(nn.Module):
    """float32 layers, a float64 head, a parameter no rank uses and one only rank 0 uses."""

    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, hidden)
        self.fc2 = nn.Linear(hidden, 3)
        self.gate = nn.Parameter(torch.randn(3))
        self.unused = nn.Parameter(torch.randn(4))
        self.head = nn.Linear(3, 2).double()

    def forward(self, x: torch.Tensor, use_gate: bool) -> torch.Tensor:
        y = self.fc2(torch.relu(self.fc1(x)))
        if use_gate:
            y = y * self.gate
        return self.head(y.double())


def make_net(hidden: int = 8) -> Net:
    torch.manual_seed(0)
    return Net(hidden)


def make_sgd(net: Net) -> torch.optim.Optimizer:
    return torch.optim.SGD([
        {"params": list(net.fc1.parameters()), "lr": 0.1},
        {"params": [p for n, p in net.named_parameters() if not n.startswith("fc1")],
         "lr": 0.05, "momentum": 0.9},
    ])


def loss_of(net: Net, step: int, rank: int, micro: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + 10 * rank + micro)
    x, target = torch.randn(4, 6, generator=g), torch.randn(4, 2, generator=g, dtype=torch.float64)
    return ((net(x, use_gate=rank == 0) - target) ** 2).mean()


class CountingComm:
    """Forwards to a Communicator, counting all_reduce calls."""

    def __init__(self, comm: pyring.Communicator) -> None:
        self.comm, self.all_reduces = comm, 0
        self.rank, self.world_size = comm.rank, comm.world_size

    def all_reduce(self, *args, **kwargs):
        self.all_reduces += 1
        return self.comm.all_reduce(*args, **kwargs)

    def all_gather_into_tensor(self, *args, **kwargs):
        return self.comm.all_gather_into_tensor(*args, **kwargs)


def state_of(net: Net) -> dict:
    return {n: (plain(p), p.grad is None) for n, p in net.named_parameters()}


def plain(t: torch.Tensor):
    """A picklable copy (tensors sent between processes go through shared memory that dies with
    the sender)."""
    return t.detach().numpy().copy()


# Modes: "plain" (one backward per step), "accumulate" (backward_passes_per_step=2),
# "no_sync" (first micro-batch inside no_sync()), "clip" (synchronize, clip, step),
# "clip_skip" (synchronize, clip, step inside skip_synchronize()), "keep_grads"
# (zero_grad(set_to_none=False), so backward accumulates into the bucket views), "copy_back"
# (gradient_as_bucket_view=False).
MODES = {"plain": 64, "accumulate": 25 << 20, "no_sync": 200, "clip": 64, "clip_skip": 25 << 20,
         "keep_grads": 64, "copy_back": 25 << 20}


def _train(comm, rank, world):
    out = {}
    for mode, bucket_bytes in MODES.items():
        net = make_net()
        counting = CountingComm(comm)
        passes = 2 if mode == "accumulate" else 1
        opt = pyring.DistributedOptimizer(make_sgd(net), net.named_parameters(), comm=counting,
                                          bucket_bytes=bucket_bytes,
                                          backward_passes_per_step=passes,
                                          gradient_as_bucket_view=mode != "copy_back")
        buckets = len(opt._pyring_sync.buckets)
        for step in range(STEPS):
            opt.zero_grad(set_to_none=mode != "keep_grads")
            counting.all_reduces = 0
            if mode in ("accumulate", "no_sync"):
                if mode == "no_sync":
                    with opt.no_sync():
                        loss_of(net, step, rank, 0).backward()
                else:
                    loss_of(net, step, rank, 0).backward()
                loss_of(net, step, rank, 1).backward()
            else:
                loss_of(net, step, rank).backward()
            if mode.startswith("clip"):
                opt.synchronize()
                nn.utils.clip_grad_norm_(net.parameters(), 0.05)
                if mode == "clip_skip":
                    with opt.skip_synchronize():
                        opt.step()
                else:
                    opt.step()
            else:
                opt.step()
            assert counting.all_reduces == buckets, (mode, counting.all_reduces, buckets)
            slots = {s.data_ptr() for s in opt._pyring_sync.slots}
            views = {n for n, p in net.named_parameters()
                     if p.grad is not None and p.grad.data_ptr() in slots}
            assert views == ({n for n, p in net.named_parameters() if p.grad is not None}
                             if mode != "copy_back" else set()), (mode, views)
        out[mode] = (state_of(net), buckets)
    return out


def _reference(world: int, mode: str) -> dict:
    net = make_net()
    opt = make_sgd(net)
    for step in range(STEPS):
        opt.zero_grad(set_to_none=mode != "keep_grads")
        if mode in ("accumulate", "no_sync"):
            loss = sum(loss_of(net, step, r, m) for r in range(world) for m in (0, 1))
        else:
            loss = sum(loss_of(net, step, r) for r in range(world))
        (loss / world).backward()
        if mode.startswith("clip"):
            nn.utils.clip_grad_norm_(net.parameters(), 0.05)
        opt.step()
    return state_of(net)


def test_training_matches_one_process(ranks):
    world = len(ranks)
    results = [r["train"] for r in ranks]
    for mode in MODES:
        want = _reference(world, mode)
        ranks = [r[mode][0] for r in results]
        assert results[0][mode][1] >= 2  # float32 and float64 buckets at least
        for name, (ref, ref_none) in want.items():
            ref, got, got_none = torch.from_numpy(ref), *ranks[0][name]
            got = torch.from_numpy(got)
            assert got_none == ref_none, (mode, name)
            scale = ref.abs().max().item()
            err = (got - ref).abs().max().item()
            assert err <= 1e-6 * scale, f"{mode} {name}: off by {err} (scale {scale})"
            for r in range(1, world):
                assert torch.equal(torch.from_numpy(ranks[r][name][0]), got), \
                    f"{mode} {name}: rank {r} differs"
                assert ranks[r][name][1] == got_none
        assert ranks[0]["unused"][1]
        assert torch.equal(torch.from_numpy(ranks[0]["unused"][0]), make_net().unused)
        assert not ranks[0]["gate"][1]  # only rank 0 uses it, every rank gets the average


def _errors(comm, rank, world):
    said = {}

    def expect(key, fn):
        try:
            fn()
        except pyring.Error as e:
            said[key] = str(e)

    net = make_net(hidden=9 if rank == world - 1 else 8)
    expect("shape", lambda: pyring.DistributedOptimizer(make_sgd(net), net.named_parameters()))
    net = make_net()
    if rank == world - 1:
        net.extra = nn.Parameter(torch.zeros(2))
    expect("missing", lambda: pyring.DistributedOptimizer(make_sgd(net), net.named_parameters()))
    expect("broadcast", lambda: pyring.broadcast_parameters(net))

    emb = nn.Embedding(10, 3, sparse=True)
    eopt = pyring.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1),
                                       emb.named_parameters())
    expect("sparse", lambda: emb(torch.tensor([1, 2])).sum().backward())
    del eopt  # freeing the optimizer removes its hooks
    emb(torch.tensor([1, 2])).sum().backward()

    net = make_net()
    opt = pyring.DistributedOptimizer(make_sgd(net), net.named_parameters())
    loss_of(net, 0, rank).backward()
    expect("twice", lambda: loss_of(net, 1, rank).backward())
    opt.zero_grad()  # finishes the window the failed pass left open, on every rank alike
    loss_of(net, 2, rank).backward()

    def skip_step():
        with opt.skip_synchronize():
            opt.step()

    expect("skip", skip_step)
    opt.step()
    return said


def test_errors(ranks):
    last = len(ranks) - 1
    for r in ranks:
        s = r["errors"]
        assert "parameter 'fc1.weight' is shape (8, 6) float32 on rank 0 but shape (9, 6) " \
            f"float32 on rank {last}" in s["shape"], s["shape"]
        assert "parameter 'extra' is missing on rank 0 but shape (2,) float32 on rank " \
            f"{last}" in s["missing"], s["missing"]
        assert "'extra' is missing on rank 0" in s["broadcast"], s["broadcast"]
        assert "'weight' has a torch.sparse_coo gradient" in s["sparse"], s["sparse"]
        assert "received 2 gradients but backward_passes_per_step=1" in s["twice"], s["twice"]
        assert "call synchronize() first" in s["skip"], s["skip"]


class BNNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(5, 4)
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.fc(x))


def _broadcast(comm, rank, world):
    torch.manual_seed(100 + rank)  # every rank starts elsewhere
    net = BNNet()
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    if rank != 1:  # rank 1's state stays empty
        for _ in range(rank + 1):
            opt.zero_grad()
            net(torch.randn(8, 5)).pow(2).mean().backward()
            opt.step()
    opt.param_groups[0]["lr"] = 0.01 * (rank + 1)
    pyring.broadcast_parameters(net, src=0)
    pyring.broadcast_optimizer_state(opt, src=0)
    after = {k: plain(v) for k, v in net.state_dict().items()}
    state = {i: {k: plain(v) for k, v in s.items()}
             for i, s in enumerate(opt.state_dict()["state"].values())}
    lr = opt.param_groups[0]["lr"]
    # Then train together: identical starts give identical results.
    dopt = pyring.DistributedOptimizer(opt, net.named_parameters(), comm=comm)
    for step in range(2):
        dopt.zero_grad()
        g = torch.Generator().manual_seed(step * 10 + rank)
        net(torch.randn(8, 5, generator=g)).pow(2).mean().backward()
        dopt.step()
    # named_parameters() and bare tensors work too; src may be any rank.
    pyring.broadcast_parameters(net.named_parameters(), src=world - 1)
    tensors = [torch.full((3,), float(rank)), torch.tensor(rank == 1)]
    pyring.broadcast_parameters(tensors, src=1)
    return after, state, lr, [plain(p) for p in net.parameters()], [plain(t) for t in tensors]


def test_broadcast_parameters_and_optimizer_state(ranks):
    results = [r["broadcast"] for r in ranks]
    after0, state0, _, trained0, _ = results[0]
    assert state0 and all("exp_avg" in s for s in state0.values())
    for after, state, lr, trained, tensors in results:
        assert after.keys() == after0.keys()
        assert all((after[k] == after0[k]).all() for k in after0)
        assert state.keys() == state0.keys()
        for i in state0:
            assert all((state[i][k] == state0[i][k]).all() for k in state0[i])
        assert lr == 0.01
        assert all((a == b).all() for a, b in zip(trained, trained0))
        assert (tensors[0] == 1).all() and tensors[1].item() is True


def _job(rank, world, store):
    comm = pyring.init(rank, world, store)
    out = {"train": _train(comm, rank, world), "broadcast": _broadcast(comm, rank, world),
           "errors": _errors(comm, rank, world)}
    pyring.destroy()
    return out


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"world{w}")
def ranks(request):
    """Every case runs in one set of processes per world size (spawning costs seconds)."""
    return run_ranks(request.param, _job)


def test_bucket_plan():
    from pyring.optim import plan

    f32 = [torch.zeros(n) for n in (100, 50, 50, 30, 20, 5, 5)]  # 400, 200, 200, 120, 80, ...
    groups = plan(f32, 500)
    assert [i for g in groups for i in g] == list(range(len(f32)))  # every parameter, in order
    # [3, 4, 5, 6] is 240 bytes; the last bucket is cut to its tail within 500 // 4 = 125 bytes
    assert groups == [[0], [1, 2], [3], [4, 5, 6]]
    mixed = [torch.zeros(4), torch.zeros(4, dtype=torch.float64), torch.zeros(4),
             torch.zeros(4, dtype=torch.float64)]
    assert plan(mixed, 1 << 20) == [[0, 2], [1, 3]]  # one dtype per bucket; small: no cut
    assert plan([torch.zeros(1000), torch.zeros(1000)], 8000) == [[0], [1]]
    assert plan([torch.zeros(1000)], 10) == [[0]]  # a parameter larger than a bucket
    assert plan([], 10) == []
