"""Compressed allreduce (fp16, bf16, one-bit with error feedback), the optimizer strategy and
OneBitAdam, on real processes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import pyring
from pyring.launch import run_ranks
from pyring.optim import OneBitAdam
from pyring.testing.counting import received_since_reset, reset_counts

N = 300_001  # uneven chunks on 3 ranks
ONEBIT_CALLS = 40


def _inputs(rank: int) -> torch.Tensor:
    x = torch.randn(N, generator=torch.Generator().manual_seed(rank))
    x[::7] = 0.0  # zero on every rank: must stay exactly zero on every wire
    return x


def _wires(rank, world, store):
    comm = pyring.init(rank=rank, world_size=world, store=store)
    want = sum(_inputs(r) for r in range(world)) / world
    out = {}
    for wire in ("fp32", "bf16", "fp16"):
        t = _inputs(rank)
        reset_counts(comm)
        comm.all_reduce(t, op="avg", wire=wire)
        out[wire] = (t.numpy(), received_since_reset(comm), float((t - want).abs().max()))
    # One-bit with error feedback: the same inputs exchanged T times; what the residuals keep
    # comes back, so the running mean of the outputs approaches the true average.
    state, total = pyring.OneBitState(), torch.zeros(N)
    reset_counts(comm)
    for _ in range(ONEBIT_CALLS):
        t = _inputs(rank)
        comm.all_reduce(t, op="avg", wire="onebit", state=state)
        total += t
    bytes_per_call = received_since_reset(comm) / ONEBIT_CALLS
    first = _inputs(rank)
    comm.all_reduce(first, op="sum", wire="onebit", state=pyring.OneBitState())
    err = lambda a: float((a - want).norm() / want.norm())  # noqa: E731
    reset_counts(comm)
    comm.all_reduce(torch.randn(N) + 0.5, op="avg", wire="onebit", state=pyring.OneBitState())
    no_zeros = received_since_reset(comm)
    out["onebit"] = (t.numpy(), bytes_per_call, err(total / ONEBIT_CALLS), err(first / world),
                     no_zeros)
    # A non-contiguous bfloat16 tensor is reduced in place.
    m = torch.full((6, 4), float(rank + 1), dtype=torch.bfloat16).t()
    comm.all_reduce(m, op="sum", wire="fp16")
    out["strided"] = bool((m == sum(range(1, world + 1))).all())
    # Bad arguments, before anything travels.
    errors = []
    for call in (lambda: comm.all_reduce(torch.ones(4), op="max", wire="bf16"),
                 lambda: comm.all_reduce(torch.ones(4, dtype=torch.int32), wire="bf16"),
                 lambda: comm.all_reduce(torch.ones(4), wire="onebit"),
                 lambda: comm.all_reduce(torch.ones(4), wire="int4"),
                 lambda: comm.all_reduce(torch.ones(4), wire="onebit", state=state)):
        with pytest.raises(ValueError) as e:
            call()
        errors.append(str(e.value))
    comm.close()
    return out, errors


def test_wires():
    results = run_ranks(3, _wires)
    base = results[0][0]
    zeros = torch.arange(N) % 7 == 0
    for out, errors in results:
        for wire in ("bf16", "fp16", "onebit"):
            t = torch.from_numpy(out[wire][0])
            assert torch.equal(t, torch.from_numpy(base[wire][0])), wire  # ranks agree
            assert (t[zeros] == 0).all(), wire
        fp32_bytes = out["fp32"][1]
        assert out["fp32"][2] < 1e-6
        assert out["bf16"][2] < 2e-2 and out["fp16"][2] < 2e-3, (out["bf16"][2], out["fp16"][2])
        for wire in ("bf16", "fp16"):
            assert fp32_bytes / out[wire][1] >= 1.9, (wire, fp32_bytes, out[wire][1])
        _, onebit_bytes, fed_back, single, no_zeros = out["onebit"]
        # A sign bit per element; the zero mask of the chunks holding an exact zero travels
        # on the first call only, since the zeros stay where they are (the mask caches).
        assert fp32_bytes / no_zeros >= 25, (fp32_bytes, no_zeros)
        mask_once = (no_zeros + fp32_bytes / 32) / ONEBIT_CALLS
        assert onebit_bytes <= 1.01 * (no_zeros + mask_once), (onebit_bytes, no_zeros)
        # One call keeps signs and a scale only; error feedback brings the mean close.
        assert single > 0.5 and fed_back < 0.15, (single, fed_back)
        assert out["strided"]
        assert len(errors) == 5
        assert "op sum or avg, got max" in errors[0] and "floating" in errors[1]
        assert "OneBitState" in errors[2] and "int4" in errors[3] and "int8" in errors[3]
        assert "one state per bucket" in errors[4]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 3))


def _batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)


def _train(model, opt, rank, steps):
    for step in steps:
        x, y = _batch(rank, step)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def _onebit_adam_resume(rank, world, store):
    comm = pyring.init(rank=rank, world_size=world, store=store)
    kw = {"lr": 1e-2, "freeze_step": 4, "weight_decay": 1e-3, "decoupled_weight_decay": True}
    model = _model()
    opt = OneBitAdam(model.parameters(), **kw)
    _train(model, opt, rank, range(6))
    ckpt = {"model": {k: v.clone() for k, v in model.state_dict().items()},
            "opt": opt.state_dict()}
    _train(model, opt, rank, range(6, 14))
    straight = [p.detach().numpy().copy() for p in model.parameters()]
    # A new model and optimizer from the checkpoint go on as if nothing had stopped.
    model2 = _model()
    model2.load_state_dict(ckpt["model"])
    opt2 = OneBitAdam(model2.parameters(), **kw)
    opt2.load_state_dict(ckpt["opt"])
    _train(model2, opt2, rank, range(6, 14))
    resumed = [p.detach().numpy().copy() for p in model2.parameters()]
    # Bytes: a warm-up step is the float32 allreduce; a frozen one is one-bit.
    reset_counts(comm)
    _train(model2, opt2, rank, range(14, 15))
    frozen = received_since_reset(comm)
    model3 = _model()
    opt3 = OneBitAdam(model3.parameters(), **kw)
    reset_counts(comm)
    _train(model3, opt3, rank, range(1))
    warm = received_since_reset(comm)
    comm.close()
    return straight, resumed, frozen, warm


def test_onebit_adam_resumes_bit_for_bit():
    results = run_ranks(2, _onebit_adam_resume)
    for straight, resumed, frozen, warm in results:
        for a, b, a0 in zip(straight, resumed, results[0][0]):
            assert (a == b).all()
            assert (a == a0).all()  # ranks agree
        assert warm / frozen >= 4, (warm, frozen)  # a tiny model: headers weigh


def _distributed_optimizer(rank, world, store):
    comm = pyring.init(rank=rank, world_size=world, store=store)
    out = {}
    for compression in (None, "none", "bf16", "onebit"):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        kw = {} if compression is None else {"compression": compression}
        pyring.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                    bucket_bytes=256, comm=comm, **kw)
        _train(model, opt, rank, range(3))
        out[str(compression)] = [p.detach().numpy().copy() for p in model.parameters()]
        if compression == "onebit":
            out["states"] = sorted(opt.exchange.states)
    with pytest.raises(ValueError, match="compression='int4' is not valid"):
        pyring.DistributedOptimizer(torch.optim.SGD(_model().parameters(), lr=0.1),
                                    comm=comm, compression="int4")
    comm.close()
    return out


def test_distributed_optimizer_compression():
    results = run_ranks(2, _distributed_optimizer)
    for out in results:
        for a, b in zip(out["None"], out["none"]):
            assert (a == b).all()  # "none" is today's exchange, bit for bit
        for name in ("bf16", "onebit"):
            for a, a0 in zip(out[name], results[0][name]):
                assert (a == a0).all(), name
        for a, ref in zip(out["bf16"], out["none"]):
            assert abs(a - ref).max() < 2e-2
        assert len(out["states"]) > 1  # a residual state per bucket


def _periodic(rank, world, store):
    comm = pyring.init(rank=rank, world_size=world, store=store)
    # period 1 with plain SGD is gradient averaging.
    model, ref = _model(), _model()
    opt = pyring.PeriodicAveraging(torch.optim.SGD(model.parameters(), lr=0.1), period=1,
                                   comm=comm)
    ref_opt = pyring.DistributedOptimizer(torch.optim.SGD(ref.parameters(), lr=0.1), comm=comm)
    _train(model, opt, rank, range(4))
    _train(ref, ref_opt, rank, range(4))
    same_as_sync = max(float((a - b).abs().max())
                       for a, b in zip(model.parameters(), ref.parameters()))
    # warm-up 2, then averages after steps 5 and 8 (bf16 deltas), Adam state averaged too.
    model = _model()
    opt = pyring.PeriodicAveraging(torch.optim.Adam(model.parameters(), lr=1e-2), period=3,
                                   warmup_steps=2, average_state=True, wire="bf16", comm=comm)
    snaps = []
    for step in range(8):
        _train(model, opt, rank, [step])
        snaps.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy())
    sd = opt.state_dict()
    with pytest.raises(ValueError, match="wire must be one of"):
        pyring.PeriodicAveraging(torch.optim.SGD(model.parameters(), lr=0.1), wire="onebit",
                                 comm=comm)
    comm.close()
    return same_as_sync, snaps, sd["steps"]


def test_periodic_averaging():
    results = run_ranks(2, _periodic)
    (d0, s0, n0), (d1, s1, n1) = results
    assert d0 < 1e-6 and d1 < 1e-6, (d0, d1)
    assert n0 == n1 == 8
    for step in range(8):  # steps are 1-based: warm-up 1-2, averages after 5 and 8
        same = (s0[step] == s1[step]).all()
        assert same == (step + 1 in (1, 2, 5, 8)), step


def _tree(rank, world, store):
    """Two hosts of two ranks by explicit topology: the members exchange in full precision
    with their leader, only the leaders (0 and 2) exchange compressed."""
    comm = pyring.init(rank=rank, world_size=world, store=store, topology="0,1;2,3")
    n = 40_001
    want = sum(_inputs(r)[:n] for r in range(world))
    out = {}
    for wire in ("bf16", "onebit"):
        kw = {"state": pyring.OneBitState()} if wire == "onebit" else {}
        t = _inputs(rank)[:n]
        comm.reset_stats()
        comm.all_reduce(t, op="sum", wire=wire, **kw)
        s = comm.stats()["p2p"]
        out[wire] = (t.numpy(), float((t - want).norm() / want.norm()),
                     {p: v["bytes_sent"] for p, v in comm.stats()["links"].items()},
                     s["bytes_sent"])
    flat = _inputs(rank)[:n]
    comm.all_reduce(flat, op="sum", wire="bf16", algo="ring")  # the flat schedule on request
    out["flat"] = float((flat - want).norm() / want.norm())
    comm.close()
    return out


def test_tree_schedule():
    # Blocks travel the links, not single copy, so that the bytes each rank sends show.
    results = run_ranks(4, _tree, env={"PYRING_SINGLE_COPY_BYTES": "0"})
    zeros = torch.arange(40_001) % 7 == 0
    n = 40_001
    for rank, out in enumerate(results):
        for wire, tol in (("bf16", 1e-2), ("onebit", 1.0)):
            t, err, _, p2p_sent = out[wire]
            assert (t == results[0][wire][0]).all(), (rank, wire)
            assert (torch.from_numpy(t)[zeros] == 0).all()
            assert err < tol, (wire, err)
            if rank in (1, 3):  # a member sends its vector to its leader, framed, once
                assert p2p_sent == 4 * n + 32, (wire, p2p_sent)
        assert out["flat"] < 1e-2
    # Beside the result for its member, a leader sends the other leader two compressed
    # halves (signs and zero mask: a quarter byte per element), where float32 would be 4n.
    across = results[0]["onebit"][3] - (4 * n + 32)
    assert 0 < across < n / 2, across
