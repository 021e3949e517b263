"""The int8 wire (csrc/codecs/int8/): blockwise-scaled 8-bit values with error feedback, a codec
of the registry that runs the generic schedule (collectives/codec_flat.h). On real processes:
ranks agree bit for bit, zeros stay zero, a quarter of float32's bytes travel, error feedback
keeps the accumulated error bounded, the state checkpoints bit for bit and refuses another wire,
and DistributedOptimizer and the DDP hook take it by name."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import pyring
from pyring import _C, hooks
from pyring.launch import run_ranks
from pyring.optim.compression import FEEDBACK_WIRES, WIRES
from pyring.testing.counting import received_since_reset, reset_counts

N = 100_003  # uneven chunks, a short last block
CALLS = 24


def _inputs(rank: int, step: int, n: int = N) -> torch.Tensor:
    x = torch.randn(n, generator=torch.Generator().manual_seed(100 * step + rank))
    x[::5] = 0.0  # zero on every rank: stays exactly zero
    return x


def test_the_registry_names_int8_once():
    assert "int8" in WIRES and "int8" in FEEDBACK_WIRES
    assert WIRES[0] == "fp32" and len(set(WIRES)) == len(WIRES)
    # A 256-value block travels as a float32 scale and 256 bytes.
    assert _C._wire_encoded_bytes("int8", 256) == 260
    assert _C._wire_encoded_bytes("int8", 257) == 257 + 8
    assert _C._wire_encoded_bytes("int8", 0) == 0


def _exchange(rank, world, store, algo):
    comm = pyring.init(rank=rank, world_size=world, store=store, set_default=False)
    want = [sum(_inputs(r, s) for r in range(world)) / world for s in range(CALLS)]
    state = pyring.OneBitState()
    total, exact = torch.zeros(N), torch.zeros(N)
    reset_counts(comm)
    for s in range(CALLS):
        t = _inputs(rank, s)
        comm.all_reduce(t, op="avg", wire="int8", state=state, algo=algo)
        total += t
        exact += want[s]
    per_call = received_since_reset(comm) / CALLS
    reset_counts(comm)
    comm.all_reduce(_inputs(rank, 0), op="avg")
    fp32 = received_since_reset(comm)
    one = _inputs(rank, 0)
    comm.all_reduce(one, op="avg", wire="int8", state=pyring.OneBitState(), algo=algo)
    rel = lambda a, b: float((a - b).norm() / b.norm())  # noqa: E731
    comm.close()
    return {"last": t.numpy(), "bytes": per_call, "fp32_bytes": fp32,
            "single": rel(one, want[0]), "accumulated": rel(total, exact),
            "zeros": bool((t[::5] == 0).all())}


@pytest.mark.parametrize("world,algo", [(3, "ring"), (4, "tree")])
def test_int8_averages_with_bounded_error_in_a_quarter_of_the_bytes(world, algo):
    topology = {"PYRING_TOPOLOGY": "0,1;2,3"} if algo == "tree" else None
    results = run_ranks(world, _exchange, algo, env=topology, timeout=300)
    for r in results:
        assert (r["last"] == results[0]["last"]).all()  # every rank ends with the same bits
        assert r["zeros"]
        # One quantization per hop: about 1% of the norm.
        assert r["single"] < 2e-2, r["single"]
        # Error feedback: what a call drops comes back in the next, so the sum of 24 outputs
        # is off by about one call's error, not 24 (nor sqrt(24)) of them.
        assert r["accumulated"] < r["single"] / 3, (r["accumulated"], r["single"])
        if algo == "ring":
            assert r["fp32_bytes"] / r["bytes"] >= 3.8, (r["fp32_bytes"], r["bytes"])


def _state_checkpoint(rank, world, store):
    comm = pyring.init(rank=rank, world_size=world, store=store, set_default=False)
    a = pyring.OneBitState()
    for s in range(3):
        comm.all_reduce(_inputs(rank, s), op="avg", wire="int8", state=a)
    b = pyring.OneBitState()
    b.load_state_dict(a.state_dict())
    x, y = _inputs(rank, 3), _inputs(rank, 3)
    comm.all_reduce(x, op="avg", wire="int8", state=a)
    comm.all_reduce(y, op="avg", wire="int8", state=b)
    errors = []
    for call in (lambda: comm.all_reduce(torch.ones(N), wire="onebit", state=a),
                 lambda: comm.all_reduce(torch.ones(7), wire="int8", state=a),
                 lambda: comm.all_reduce(torch.ones(4), wire="int8")):
        with pytest.raises(ValueError) as e:
            call()
        errors.append(str(e.value))
    worker = a.worker
    comm.close()
    return bool(torch.equal(x, y)), errors, float(worker.abs().max())


def test_the_state_resumes_bit_for_bit_and_serves_one_wire():
    for same, errors, residual in run_ranks(2, _state_checkpoint, timeout=120):
        assert same
        assert 0 < residual < 0.1  # what the last encoding dropped: under half a step
        assert "wire int8" in errors[0] and "wire onebit" in errors[0], errors[0]
        assert "one state per bucket" in errors[1], errors[1]
        assert "int8" in errors[2] and "OneBitState" in errors[2], errors[2]


def _train(rank, world, store, how):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 4))
    g = torch.Generator().manual_seed(rank)
    w = torch.randn(16, 4, generator=torch.Generator().manual_seed(7))  # a task to learn
    xs = torch.randn(64, 16, generator=g)
    ys = xs @ w
    losses = []
    if how == "optimizer":
        comm = pyring.init(rank=rank, world_size=world, store=store, set_default=False)
        opt = pyring.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                          compression="int8", comm=comm)
        step = model
    else:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
        step = DistributedDataParallel(model, bucket_cap_mb=0.001)  # several buckets
        step.register_comm_hook(hooks.CompressedHookState(None, "int8"), hooks.compressed_hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(30):
        opt.zero_grad()
        loss = nn.functional.mse_loss(step(xs), ys)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    if how == "optimizer":
        comm.close()
    else:
        pyring.destroy()
        dist.destroy_process_group()
    return losses[0], losses[-1], params


@pytest.mark.parametrize("how", ["optimizer", "ddp_hook"])
def test_training_on_int8_keeps_ranks_in_step(how):
    results = run_ranks(2, _train, how, timeout=180)
    for first, last, params in results:
        assert last < 0.5 * first, (first, last)
        assert (params == results[0][2]).all()  # every rank applies the same average


def test_a_hook_state_refuses_what_is_not_a_compressed_wire():
    with pytest.raises(ValueError, match="not a compressed wire"):
        hooks.CompressedHookState(None, "fp32")
