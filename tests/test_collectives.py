"""The collective matrix: world {1..5} x transport {shm, tcp} x count x dtype x op x placement.

Each (world, transport) pair runs in one set of processes; inside, a ring communicator with a
tiny segment_bytes forces the multi-segment path for the small and odd counts, and one with the
defaults (auto: direct for small messages, ring for large) repeats them and carries about a
million elements.
"""

from __future__ import annotations

import pytest
import torch
from cases import DTYPES, OPS, counts_for, expected, rank_input

from pyring.launch import run_ranks

LARGE = (1 << 20) + 3


def _check(bad: list, what: str, got: torch.Tensor, want: torch.Tensor) -> None:
    if not torch.equal(got, want):
        diff = (got.to(torch.float64) != want.to(torch.float64)).nonzero()
        bad.append(f"{what}: {diff.numel()} wrong, first at {diff[:3].flatten().tolist()} "
                   f"got {got.flatten()[diff[:3].flatten()].tolist()} "
                   f"want {want.flatten()[diff[:3].flatten()].tolist()}")


def _all_reduce_cases(comm, rank, world, counts, bad, tag):
    for count in counts:
        for dtype in DTYPES:
            for op in OPS:
                want = expected(op, world, count, dtype)
                x = rank_input(op, rank, count, dtype)
                comm.all_reduce(x, op=op)
                _check(bad, f"{tag} in-place all_reduce {op} {dtype} n={count}", x, want)
                x = rank_input(op, rank, count, dtype)
                out = torch.full_like(x, 9)
                comm.all_reduce(x, op=op, out=out)
                _check(bad, f"{tag} out-of-place all_reduce {op} {dtype} n={count}", out, want)
                _check(bad, f"{tag} input kept {op} {dtype} n={count}", x,
                       rank_input(op, rank, count, dtype))


def _other_cases(comm, rank, world, bad):
    for dtype in DTYPES:
        for count in (0, 1, 5, 1001):
            for src in range(world):
                t = torch.full((count,), rank + 1, dtype=dtype)
                comm.broadcast(t, src=src)
                _check(bad, f"broadcast {dtype} n={count} src={src}", t,
                       torch.full((count,), src + 1, dtype=dtype))
            piece = rank_input("sum", rank, count, dtype)
            want = torch.cat([rank_input("sum", r, count, dtype) for r in range(world)])
            out = torch.zeros(world * count, dtype=dtype)
            comm.all_gather_into_tensor(out, piece)
            _check(bad, f"all_gather {dtype} n={count}", out, want)
            out = torch.zeros(world * count, dtype=dtype)
            out[rank * count:(rank + 1) * count] = piece
            comm.all_gather_into_tensor(out, out[rank * count:(rank + 1) * count])
            _check(bad, f"in-place all_gather {dtype} n={count}", out, want)
            for op in OPS:
                full = expected(op, world, world * count, dtype)
                mine = full[rank * count:(rank + 1) * count]
                x = rank_input(op, rank, world * count, dtype)
                out = torch.zeros(count, dtype=dtype)
                comm.reduce_scatter_tensor(out, x, op=op)
                _check(bad, f"reduce_scatter {op} {dtype} n={count}", out, mine)
                comm.reduce_scatter_tensor(x[rank * count:(rank + 1) * count], x, op=op)
                _check(bad, f"in-place reduce_scatter {op} {dtype} n={count}",
                       x[rank * count:(rank + 1) * count], mine)
    comm.barrier()


def _async_cases(comm, rank, world, bad):
    xs = [torch.full((3000 + k,), float(rank + k)) for k in range(6)]
    works = [comm.all_reduce(x, async_op=True) for x in xs]
    futs = [w.get_future() for w in works[:3]]
    for k, (x, w) in enumerate(zip(xs, works)):
        w.wait(timeout=60)
        assert w.is_completed()
        _check(bad, f"async all_reduce #{k}", x,
               torch.full_like(x, sum(r + k for r in range(world))))
    for k, f in enumerate(futs):
        assert f.wait() is xs[k]
    # A synchronous call after queued work runs after it.
    y = torch.ones(10)
    w = comm.all_reduce(torch.ones(1 << 16), async_op=True)
    comm.all_reduce(y)
    assert w.is_completed()
    _check(bad, "sync after async", y, torch.full_like(y, world))
    b = comm.barrier(async_op=True)
    assert b.wait(timeout=60)


def matrix_body(rank, world, store, transport):
    import numpy as np

    import pyring

    bad: list[str] = []
    with pyring.init(rank, world, store, transport=transport, segment_bytes=128, algo="ring",
                     set_default=False) as tiny:
        if world > 1:
            assert tiny.transport((rank + 1) % world) == transport
        _all_reduce_cases(tiny, rank, world, counts_for(world), bad, "seg=128")
        _other_cases(tiny, rank, world, bad)
        _async_cases(tiny, rank, world, bad)
        a = np.full(7, rank + 1, dtype=np.int32)
        tiny.all_reduce(a, op="max")
        if not (a == world).all():
            bad.append(f"numpy all_reduce max: {a}")
    with pyring.init(rank, world, store, transport=transport, set_default=False) as big:
        # auto: the direct algorithm for the small counts, the ring for the large one.
        _all_reduce_cases(big, rank, world, counts_for(world) + [LARGE], bad, "auto")
    return bad


# A single rank has no links, so world 1 runs once.
@pytest.mark.parametrize("world,transport", [(1, "shm")] + [
    (w, t) for w in (2, 3, 4, 5) for t in ("shm", "tcp")])
def test_matrix(world, transport):
    results = run_ranks(world, matrix_body, transport, timeout=400)
    for rank, bad in enumerate(results):
        assert not bad, f"rank {rank}: {len(bad)} wrong results:\n" + "\n".join(bad[:20])
