"""The collective matrix on the sim device: every collective (the rooted and personalised ones
too), dtype and op, in place and out of place, sync and async, at 2, 3 and 4 ranks with two
ranks per sim device, under random stream delays. Inputs are written by operations queued on
the rank's stream and results read by operations queued after the call, so a collective that
does not order itself on the caller's stream reads or leaves stale values."""

from __future__ import annotations

import pytest
import torch
from cases import DTYPES, OPS, counts_for, expected, rank_input

from pyring.launch import run_ranks

DELAY_US = "200"


def _check(bad: list, what: str, got: torch.Tensor, want: torch.Tensor) -> None:
    if not torch.equal(got, want):
        diff = (got.to(torch.float64) != want.to(torch.float64)).nonzero()
        bad.append(f"{what}: {diff.numel()} wrong, first at {diff[:3].flatten().tolist()}")


def _dev(rank: int) -> int:
    return rank // 2  # two ranks per sim device


def _all_reduce_cases(comm, rank, world, bad, tag):
    from pyring.testing.sim import SimArray

    d = _dev(rank)
    for count in counts_for(world):
        for dtype in DTYPES:
            for op in OPS:
                want = expected(op, world, count, dtype)
                x = SimArray.from_tensor(rank_input(op, rank, count, dtype), d)
                comm.all_reduce(x, op=op)
                _check(bad, f"{tag} in-place all_reduce {op} {dtype} n={count}", x.to_host(),
                       want)
                out = SimArray(count, dtype, d).fill_(9)
                comm.all_reduce(x.copy_(rank_input(op, rank, count, dtype)), op=op, out=out)
                _check(bad, f"{tag} out-of-place all_reduce {op} {dtype} n={count}",
                       out.to_host(), want)
                _check(bad, f"{tag} input kept {op} {dtype} n={count}", x.to_host(),
                       rank_input(op, rank, count, dtype))


def _other_cases(comm, rank, world, bad):
    from pyring.testing.sim import SimArray

    d = _dev(rank)
    for count in (1, 1001):
        for dtype in (torch.float32, torch.bfloat16, torch.int64):
            x = SimArray.from_tensor(torch.arange(count).to(dtype) + rank, d)
            out = SimArray(world * count, dtype, d).fill_(-1)
            comm.all_gather_into_tensor(out, x)
            want = torch.cat([torch.arange(count).to(dtype) + r for r in range(world)])
            _check(bad, f"all_gather {dtype} n={count}", out.to_host(), want)
            b = SimArray.from_tensor(torch.full((count,), rank).to(dtype), d)
            comm.broadcast(b, src=world - 1)
            _check(bad, f"broadcast {dtype} n={count}", b.to_host(),
                   torch.full((count,), world - 1).to(dtype))
            for op in ("sum", "max"):
                full = expected(op, world, world * count, dtype)
                src = SimArray.from_tensor(rank_input(op, rank, world * count, dtype), d)
                out = SimArray(count, dtype, d).fill_(7)
                comm.reduce_scatter_tensor(out, src, op=op)
                _check(bad, f"reduce_scatter {op} {dtype} n={count}", out.to_host(),
                       full[rank * count:(rank + 1) * count])


def _chunked_cases(comm, rank, world, bad):
    """All_reduce larger than the staging chunk: chunks are copied in and back while their
    neighbours are exchanged."""
    from pyring.testing.sim import SimArray

    n = (3 << 20) // 2 * 2 + 5  # 3 chunks of 4 MiB of float32, the last one short
    base = torch.arange(n, dtype=torch.int64) % 7
    x = SimArray.from_tensor((base + rank).to(torch.float32), _dev(rank))
    out = SimArray(n, torch.float32, _dev(rank)).fill_(-1)
    comm.all_reduce(x, out=out)
    want = (base * world + sum(range(world))).to(torch.float32)
    _check(bad, "chunked all_reduce", out.to_host(), want)
    w = comm.all_reduce(x, async_op=True)
    w.wait()
    _check(bad, "chunked async all_reduce", x.to_host(), want)


def _rooted_cases(comm, rank, world, bad):
    from pyring.testing.sim import SimArray

    d, root = _dev(rank), world - 1
    x = SimArray.from_tensor(torch.arange(6, dtype=torch.int64) + 10 * rank, d)
    got = [SimArray(6, torch.int64, d).fill_(-1) for _ in range(world)] if rank == root else None
    comm.gather(x, got, dst=root)
    if rank == root:
        for r, g in enumerate(got):
            _check(bad, f"gather from {r}", g.to_host(), torch.arange(6) + 10 * r)
    out = SimArray(4, torch.float32, d).fill_(-1)
    blocks = [SimArray.from_tensor(torch.full((4,), float(r)), d) for r in range(world)] \
        if rank == root else None
    comm.scatter(out, blocks, src=root)
    _check(bad, "scatter", out.to_host(), torch.full((4,), float(rank)))
    ins = [SimArray.from_tensor(torch.full((3,), float(100 * rank + j)), d) for j in range(world)]
    outs = [SimArray(3, torch.float32, d).fill_(-1) for _ in range(world)]
    comm.all_to_all(outs, ins)
    for j, o in enumerate(outs):
        _check(bad, f"all_to_all from {j}", o.to_host(), torch.full((3,), float(100 * j + rank)))
    flat_in = SimArray.from_tensor(torch.arange(2 * world, dtype=torch.int32) + 1000 * rank, d)
    flat_out = SimArray(2 * world, torch.int32, d).fill_(-1)
    comm.all_to_all_single(flat_out, flat_in)
    want = torch.cat([torch.arange(2 * rank, 2 * rank + 2, dtype=torch.int32) + 1000 * j
                      for j in range(world)])
    _check(bad, "all_to_all_single", flat_out.to_host(), want)
    r = SimArray.from_tensor(torch.full((5,), float(rank + 1)), d)
    comm.reduce(r, dst=root)
    _check(bad, "reduce", r.to_host(), torch.full((5,), float(
        sum(k + 1 for k in range(world)) if rank == root else rank + 1)))


def _async_cases(comm, rank, world, bad):
    from pyring.testing.sim import SimArray

    d = _dev(rank)
    xs = [SimArray(3000 + k, torch.float32, d).fill_(float(rank + k)) for k in range(6)]
    works = [comm.all_reduce(x, async_op=True) for x in xs]
    futs = [w.get_future() for w in works[:3]]
    for k, (x, w) in enumerate(zip(xs, works)):
        assert w.wait()  # orders the current stream after the result; the host goes on
        _check(bad, f"async all_reduce #{k}", x.to_host(),
               torch.full((3000 + k,), float(sum(r + k for r in range(world)))))
        assert w.is_completed()
    for k, f in enumerate(futs):
        assert f.wait() is xs[k]
    g = SimArray(world * 5, torch.int32, d)
    w = comm.all_gather_into_tensor(g, SimArray(5, torch.int32, d).fill_(rank), async_op=True)
    assert w.synchronize()
    assert w.is_completed()
    _check(bad, "async all_gather", g.to_host(),
           torch.arange(world, dtype=torch.int32).repeat_interleave(5))


def matrix_body(rank, world, store):
    import pyring

    bad: list[str] = []
    with pyring.init(rank, world, store, segment_bytes=128, algo="ring",
                     set_default=False) as tiny:
        _all_reduce_cases(tiny, rank, world, bad, "seg=128")
        _other_cases(tiny, rank, world, bad)
        _rooted_cases(tiny, rank, world, bad)
        _async_cases(tiny, rank, world, bad)
        assert tiny.device == f"sim:{_dev(rank)}"
    with pyring.init(rank, world, store, set_default=False) as auto:
        _all_reduce_cases(auto, rank, world, bad, "auto")
        _chunked_cases(auto, rank, world, bad)
    return bad


@pytest.mark.parametrize("world", [2, 3, 4])
def test_sim_matrix(world):
    results = run_ranks(world, matrix_body, env={"PYRING_SIM_DELAY_US": DELAY_US}, timeout=400)
    for rank, bad in enumerate(results):
        assert not bad, f"rank {rank}: {len(bad)} wrong results:\n" + "\n".join(bad[:20])
