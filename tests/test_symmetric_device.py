"""Symmetric device memory (pyring.empty on a device) and the host-driven zero-copy collectives
on it (csrc/collectives/zero_copy.h), on the sim device under random stream delays: ranks share
sim:0 as ranks share a GPU. Inputs are written by operations queued on the rank's stream and
results read by operations queued after the call, so a step that does not wait for the
device's work before raising its phase (or a call that returns before its peers are done with
its memory) reads or leaves stale values."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
import torch
from cases import DTYPES, OPS, expected, rank_input

from pyring.launch import run_ranks

ENV = {"PYRING_SIM_DELAY_US": "200"}
COUNTS = (1, 3, 1001, 20_003)


def _check(bad: list, what: str, got: torch.Tensor, want: torch.Tensor) -> None:
    got = got.cpu()
    if not torch.equal(got, want):
        diff = (got.to(torch.float64) != want.to(torch.float64)).nonzero()
        bad.append(f"{what}: {diff.numel()} wrong, first at {diff[:3].flatten().tolist()}")


def _attempt(fn, *args, **kwargs) -> tuple[str, float]:
    """fn(*args, **kwargs)'s error ("Type: message", or "no error") and the seconds it took."""
    t0 = time.monotonic()
    try:
        fn(*args, **kwargs)
        torch.zeros(1, device="sim:0").cpu()  # the device work queued behind it
    except Exception as e:  # noqa: BLE001 (the message is the result)
        return f"{type(e).__name__}: {e}", time.monotonic() - t0
    return "no error", time.monotonic() - t0


def _init(rank, world, store, **kw):
    import pyring
    from pyring.testing import sim_torch

    sim_torch.enable()
    return pyring.init(rank, world, store, set_default=False, **kw)


def _sym(comm, src: torch.Tensor) -> torch.Tensor:
    t = comm.empty(*src.shape, dtype=src.dtype, device="sim:0")
    t.copy_(src.to("sim:0"))  # queued on the stream: the collective must wait for it
    return t


def matrix_body(rank, world, store, counts, dtypes):
    bad: list[str] = []
    comm = _init(rank, world, store)
    calls = 0
    for count in counts:
        for dtype in dtypes:
            for op in OPS:
                want = expected(op, world, count, dtype)
                x = _sym(comm, rank_input(op, rank, count, dtype))
                comm.all_reduce(x, op=op)
                _check(bad, f"in-place all_reduce {op} {dtype} n={count}", x, want)
                x = _sym(comm, rank_input(op, rank, count, dtype))
                out = comm.empty(count, dtype=dtype, device="sim:0")
                comm.all_reduce(x, op=op, out=out)
                _check(bad, f"all_reduce into symmetric {op} {dtype} n={count}", out, want)
                out = torch.full((count,), 9, dtype=dtype, device="sim:0")
                comm.all_reduce(x, op=op, out=out)
                _check(bad, f"all_reduce into private {op} {dtype} n={count}", out, want)
                _check(bad, f"input kept {op} {dtype} n={count}", x,
                       rank_input(op, rank, count, dtype))
                full = expected(op, world, world * count, dtype)
                mine = full[rank * count:(rank + 1) * count]
                x = _sym(comm, rank_input(op, rank, world * count, dtype))
                out = torch.zeros(count, dtype=dtype, device="sim:0")
                comm.reduce_scatter_tensor(out, x, op=op)
                _check(bad, f"reduce_scatter {op} {dtype} n={count}", out, mine)
                calls += 4
            piece = _sym(comm, rank_input("sum", rank, count, dtype))
            want = torch.cat([rank_input("sum", r, count, dtype) for r in range(world)])
            out = torch.zeros(world * count, dtype=dtype, device="sim:0")
            comm.all_gather_into_tensor(out, piece)
            _check(bad, f"all_gather {dtype} n={count}", out, want)
            out = comm.empty(world * count, dtype=dtype, device="sim:0")
            out[rank * count:(rank + 1) * count] = piece
            comm.all_gather_into_tensor(out, out[rank * count:(rank + 1) * count])
            _check(bad, f"in-place all_gather {dtype} n={count}", out, want)
            for src in range(world):
                t = _sym(comm, torch.full((count,), rank + 1, dtype=dtype))
                comm.broadcast(t, src=src)
                _check(bad, f"broadcast {dtype} n={count} src={src}", t,
                       torch.full((count,), src + 1, dtype=dtype))
            calls += 2 + world
    # Back to back, each result read only after the next call: the stream orders them.
    xs = [_sym(comm, torch.full((5000,), float(rank + k))) for k in range(4)]
    works = [comm.all_reduce(x, async_op=True) for x in xs]
    for k, (x, w) in enumerate(zip(xs, works)):
        w.wait(timeout=60)
        _check(bad, f"async #{k}", x, torch.full((5000,), float(sum(r + k for r in range(world)))))
    calls += 4
    zc = comm.stats()["zero_copy"]
    if zc["calls"] != calls or zc["slot_schedule"] != 0:
        bad.append(f"zero-copy calls {zc} of {calls}")
    comm.close()
    return bad


@pytest.mark.parametrize("world", [2, 3, 4])
def test_matrix_on_symmetric_device_tensors(world):
    # Every dtype at 2 ranks; the float ones (the kernels' widening paths) beyond.
    dtypes = DTYPES if world == 2 else [torch.float32, torch.float16, torch.bfloat16]
    results = run_ranks(world, matrix_body, COUNTS, dtypes, env=ENV, timeout=600)
    for rank, bad in enumerate(results):
        assert not bad, f"rank {rank}: {len(bad)} wrong:\n" + "\n".join(bad[:20])


def mismatch_body(rank, world, store):
    comm = _init(rank, world, store)
    out = _attempt(comm.empty, 10, dtype=torch.float32, device="cpu" if rank == 1 else "sim:0")
    t = comm.empty(4, device="sim:0")  # the communicator stays usable
    t.fill_(rank)
    comm.all_reduce(t)
    return out[0], t.cpu().tolist()


def test_ranks_allocating_on_different_kinds_of_device_raise_naming_both():
    for msg, after in run_ranks(2, mismatch_body, env=ENV, timeout=120):
        assert "rank 0 allocated on sim:0 but rank 1 on cpu" in msg, msg
        assert after == [1.0] * 4


def slot_mismatch_body(rank, world, store):
    comm = _init(rank, world, store, timeout=60)
    t = comm.empty(1000, device="sim:0")
    if rank == 1:
        t = torch.zeros(1000, device="sim:0")  # a private tensor: the device ring
    return _attempt(comm.all_reduce, t)


def test_a_rank_on_the_device_ring_fails_the_zero_copy_call_at_once():
    results = run_ranks(2, slot_mismatch_body, env=ENV, timeout=120)
    assert re.search(r"rank 1 entered this collective \(#\d+\) on the slot path",
                     results[0][0]), results
    for msg, took in results:
        assert msg != "no error"
        assert took < 20, results


def killed_body(rank, world, store):
    comm = _init(rank, world, store, timeout=60)
    t = comm.empty(100_000, device="sim:0")
    comm.all_reduce(t)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return _attempt(comm.all_reduce, t)


@pytest.mark.parametrize("world", [2, 3])
def test_a_killed_peer_fails_every_survivor(world):
    results = run_ranks(world, killed_body, env=ENV, timeout=120, allow_failures=True)
    for rank, r in enumerate(results):
        if rank == 1:
            continue
        msg, took = r
        assert "CommError" in msg or "PeerLost" in msg, results
        assert took < 20, results


def lifetime_body(rank, world, store):
    import gc

    comm = _init(rank, world, store)
    held = []
    for k in range(30):  # freed tensors' memory returns through the device queue
        t = comm.empty(4096, device="sim:0")
        t.fill_(rank + k)
        comm.all_reduce(t)
        if t[0].item() != 2 * k + 1:
            return f"#{k}: {t[0].item()}"
        del t
        gc.collect()
        held.append(comm.stats()["symmetric_memory"]["allocations"])
    comm.close()
    return max(held)


def test_freed_device_tensors_are_forgotten():
    # At most the tensor of the last call (held until its device results are in place) and the
    # one the sim lets go of at its next allocation: 30 allocations never pile up.
    for most in run_ranks(2, lifetime_body, env=ENV, timeout=120):
        assert most <= 2, most


def reuse_body(rank, world, store, iters):
    """One symmetric tensor written by the caller's stream right after each call: a rank that
    returned while a peer still read its memory would hand that peer the next values. Rank 0's
    streams are slow and the others' fast, so that the window is wide."""
    os.environ["PYRING_SIM_DELAY_US"] = "5000" if rank == 0 else "0"
    comm = _init(rank, world, store)
    n = 30_001
    x = comm.empty(n, device="sim:0")
    g = comm.empty(world * n, device="sim:0")
    outs, gathered = [], []
    for i in range(iters):
        x.fill_(float(rank + i))
        comm.all_reduce(x)
        outs.append(x.clone())  # queued after the call: it must see the result
        x.fill_(-1.0)  # and a peer must not
    for i in range(iters):
        g[rank * n:(rank + 1) * n].fill_(float(rank * i))
        comm.all_gather_into_tensor(g, g[rank * n:(rank + 1) * n])
        gathered.append(g.clone())
        g.fill_(-1.0)
    bad = []
    for i, (o, a) in enumerate(zip(outs, gathered)):
        total = float(sum(r + i for r in range(world)))
        _check(bad, f"all_reduce #{i}", o, torch.full((n,), total))
        _check(bad, f"all_gather #{i}", a,
               torch.cat([torch.full((n,), float(r * i)) for r in range(world)]))
    comm.close()
    return bad


@pytest.mark.parametrize("world", [2, 3])
def test_a_reused_tensor_is_never_read_after_its_call(world):
    results = run_ranks(world, reuse_body, 10, timeout=300)
    for rank, bad in enumerate(results):
        assert not bad, f"rank {rank}: {len(bad)} wrong:\n" + "\n".join(bad[:20])


def barrier_body(rank, world, store):
    comm = _init(rank, world, store)
    x = comm.empty(1001, device="sim:0")  # the control pages are mapped from here on
    wrong = 0
    for i in range(20):
        x.copy_(torch.full((1001,), float(rank + i)).to("sim:0"))
        comm.barrier()
        comm.all_reduce(x)
        wrong += int((x.cpu() != world * i + world * (world - 1) / 2).sum())
    return wrong, comm.stats()["zero_copy"]["barriers"]


def test_the_barrier_runs_on_the_flags_after_a_device_allocation():
    for wrong, barriers in run_ranks(3, barrier_body, env=ENV, timeout=120):
        assert (wrong, barriers) == (0, 20)
