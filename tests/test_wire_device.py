"""The compressed wires on device buffers (the sim device): the codec runs on the device, only
encoded bytes cross to the host, and the results, the exact tail and the one-bit state are
those of the same calls on host tensors: bit for bit on the 16-bit wires; on the one-bit wire
to the scales' rounding, since the sim runs the CUDA encoder's body (kernels/host_grid.cc),
which sums a segment's squares in another order than the host's (a value within that of zero
may take the other sign, as on a GPU: test_gpu_collectives). The sim device delays every
operation at random, so a missing stream wait shows as a wrong result."""

from __future__ import annotations

import torch

import pyring
from pyring.launch import run_ranks
from pyring.optim.compression import FEEDBACK_WIRES, all_reduce_wire

_DELAY = {"PYRING_SIM_DELAY_US": "100"}


def _inputs(rank: int, n: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(n, generator=g)
    x[::97] = 0.0  # exact zeros: the one-bit masks and their caches
    return x


def _onebit_close(host: torch.Tensor, dev: torch.Tensor) -> bool:
    """dev is host to a few bfloat16 roundings, but for one value in 10,000 (one that took the
    other sign)."""
    if host.numel() == 0:
        return dev.numel() == 0
    host, dev = host.float(), dev.float()
    far = (dev - host).abs() > 1e-5 * host.abs().max() + 2**-6 * host.abs()
    return int(far.sum()) <= host.numel() // 10_000


def _on_both(rank, world, store, n, wires, ops, dtype, steps, tail, topology=None):
    """Each (wire, op) run `steps` times on host tensors and on sim arrays, side by side;
    returns {key: (max abs difference, bitwise equal, states equal)}."""
    from pyring.testing.sim import SimArray

    comm = pyring.init(rank=rank, world_size=world, store=store, set_default=False,
                       topology=topology)
    out = {}
    for wire in wires:
        for op in ops:
            states = (pyring.OneBitState(), pyring.OneBitState()) if wire in FEEDBACK_WIRES else (
                None, None)
            worst, same = 0.0, True
            for step in range(steps):
                x = _inputs(rank, n, step).to(dtype)
                host = x.clone()
                all_reduce_wire(comm, host, op, wire, states[0], exact_tail=tail)
                dev = SimArray.from_tensor(x, rank % 2)
                all_reduce_wire(comm, dev, op, wire, states[1], exact_tail=tail)
                got = dev.to_host()
                diff = (got.float() - host.float()).abs().max().item()
                worst = max(worst, diff)
                same = same and (_onebit_close(host, got) if wire == "onebit" else
                                 torch.equal(got, host))
                if tail:
                    want = sum(_inputs(r, n, step).to(dtype)[n - tail:].double()
                               for r in range(world))
                    if op == "avg":
                        want = want / world
                    # Full precision: the host's exact allreduce, and the true sum.
                    assert torch.equal(got[n - tail:], host[n - tail:]), (wire, op, "tail")
                    assert torch.allclose(got[n - tail:].double(), want, atol=1e-5), (wire, op)
            state_same = None
            if wire in FEEDBACK_WIRES:
                a, b = states[0].state_dict(), states[1].state_dict()
                close = _onebit_close if wire == "onebit" else torch.equal
                # Members of a group below its leader hold no state (both None).
                state_same = all(a[k] is b[k] is None or close(a[k], b[k]) for k in a)
            out[f"{wire}/{op}"] = (worst, same, state_same)
    stats = comm.stats()
    comm.close()
    return out, stats["device_host_bytes"]


def _matrix(rank, world, store):
    return _on_both(rank, world, store, 50_003, ("fp16", "bf16", "onebit"), ("sum", "avg"),
                    torch.float32, steps=3, tail=3)


def _check(results):
    for out, _ in results:
        for key, (worst, same, state_same) in out.items():
            # The same codec arithmetic in the same order (the 16-bit wires' avg divides the
            # owner's float32 sum once on both paths): bit for bit.
            assert same, (key, worst)
            if state_same is not None:
                assert state_same, key


def test_device_codec_matches_the_host_at_2_and_3_ranks():
    for world in (2, 3):
        _check(run_ranks(world, _matrix, env=_DELAY, timeout=300))


def _bf16_tensor(rank, world, store):
    return _on_both(rank, world, store, 20_001, ("onebit", "bf16"), ("avg",), torch.bfloat16,
                    steps=2, tail=0)


def test_device_codec_on_bfloat16_buffers():
    for out, _ in run_ranks(2, _bf16_tensor, env=_DELAY, timeout=300):
        assert out["onebit/avg"][1], out
        assert out["bf16/avg"][0] <= 5e-2, out


def _segments(rank, world, store):
    # Three onebit segments per chunk: the host keeps each segment's residual
    # deferred (kernels/onebit.h) with its own scale, the device settles it in the call.
    return _on_both(rank, world, store, 2 * (1 << 20) * world + 2 * 4099 + 1, ("onebit",),
                    ("avg",), torch.float32, steps=3, tail=1)


def test_device_codec_matches_the_host_over_several_segments():
    _check(run_ranks(2, _segments, env=_DELAY, timeout=300))


def _hierarchical(rank, world, store):
    return _on_both(rank, world, store, 30_001, ("onebit", "fp16"), ("sum",), torch.float32,
                    steps=2, tail=2, topology="0,1;2,3")


def test_device_codec_in_the_hierarchical_form():
    _check(run_ranks(4, _hierarchical, env=_DELAY, timeout=300))


def _int8(rank, world, store):
    return _on_both(rank, world, store, 40_003, ("int8",), ("sum", "avg"), torch.float32,
                    steps=3, tail=2)


def _int8_hierarchical(rank, world, store):
    return _on_both(rank, world, store, 30_001, ("int8",), ("avg",), torch.float32, steps=2,
                    tail=0, topology="0,1;2,3")


def test_int8_on_a_device_is_staged_and_matches_the_host():
    """int8 has host kernels only: a device buffer is staged through pinned host memory
    (placement.cc), and its results and state are the host's, bit for bit."""
    _check(run_ranks(2, _int8, env=_DELAY, timeout=300))
    _check(run_ranks(4, _int8_hierarchical, env=_DELAY, timeout=300))


def _crossing(rank, world, store):
    """Only encoded bytes cross between the device and the host."""
    from pyring.testing.sim import SimArray

    comm = pyring.init(rank=rank, world_size=world, store=store, set_default=False)
    n = 1 << 20
    state = pyring.OneBitState()
    x = SimArray.from_tensor(_inputs(rank, n, 0), 0)
    all_reduce_wire(comm, x, "avg", "onebit", state)  # first call: residuals go up once
    comm.reset_stats()
    all_reduce_wire(comm, x, "avg", "onebit", state)
    onebit = comm.stats()["device_host_bytes"]
    comm.reset_stats()
    all_reduce_wire(comm, x, "avg", "bf16")
    bf16 = comm.stats()["device_host_bytes"]
    comm.reset_stats()
    comm.all_reduce(x, op="avg")  # staged float32: in and out
    fp32 = comm.stats()["device_host_bytes"]
    comm.close()
    return onebit, bf16, fp32


def test_only_encoded_bytes_cross_to_the_host():
    for onebit, bf16, fp32 in run_ranks(2, _crossing, env=_DELAY, timeout=300):
        assert fp32 == 2 * 4 * (1 << 20), fp32
        # bf16 at 2 ranks: the chunk sent, the copy received, the sum sent, the result
        # received, 2 bytes a value each: half of float32's staging.
        assert bf16 == fp32 // 2, (bf16, fp32)
        # onebit: signs and masks, about 1/16 of float32's staging.
        assert onebit <= fp32 // 12, (onebit, fp32)


def _moves(rank, world, store):
    """A one-bit state used on the device, checkpointed, and used on the host goes on as a
    state that stayed on the host."""
    from pyring.testing.sim import SimArray

    comm = pyring.init(rank=rank, world_size=world, store=store, set_default=False)
    n = 10_007
    moved, stayed = pyring.OneBitState(), pyring.OneBitState()
    diffs = []
    for step in range(4):
        x = _inputs(rank, n, step)
        ref = x.clone()
        all_reduce_wire(comm, ref, "sum", "onebit", stayed)
        if step % 2 == 0:
            dev = SimArray.from_tensor(x, 0)
            all_reduce_wire(comm, dev, "sum", "onebit", moved)
            got = dev.to_host()
        else:
            sd = moved.state_dict()  # from the device
            moved = pyring.OneBitState()
            moved.load_state_dict(sd)
            got = x.clone()
            all_reduce_wire(comm, got, "sum", "onebit", moved)
        diffs.append(0 if _onebit_close(ref, got) else int((got != ref).sum()))
    comm.close()
    return diffs


def test_onebit_state_moves_between_device_and_host():
    for diffs in run_ranks(2, _moves, env=_DELAY, timeout=300):
        assert diffs == [0, 0, 0, 0], diffs
