"""Symmetric memory (pyring.empty) and the zero-copy collectives on it
(csrc/core/symmetric.h, csrc/collectives/zero_copy.h)."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
import torch
from cases import DTYPES, OPS, expected, rank_input

from pyring.launch import run_ranks

# 0, 1, fewer than 5 ranks, odd, and past the one-shot size (two-shot) for every dtype.
COUNTS = (1, 3, 1001, 40_003)


def _segments() -> set[str]:
    """The names of pyring's symmetric segments in /dev/shm."""
    return {n for n in os.listdir("/dev/shm") if n.startswith("pyring-") and "-y" in n}


def _check(bad: list, what: str, got: torch.Tensor, want: torch.Tensor) -> None:
    if not torch.equal(got, want):
        diff = (got.to(torch.float64) != want.to(torch.float64)).nonzero()
        bad.append(f"{what}: {diff.numel()} wrong, first at {diff[:3].flatten().tolist()}")


def _attempt(fn, *args) -> tuple[str, float]:
    """fn(*args)'s error ("Type: message", or "no error") and the seconds it took."""
    t0 = time.monotonic()
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 (the message is the result)
        return f"{type(e).__name__}: {e}", time.monotonic() - t0
    return "no error", time.monotonic() - t0


def _sym(comm, src: torch.Tensor) -> torch.Tensor:
    t = comm.empty(*src.shape, dtype=src.dtype)
    t.copy_(src)
    return t


def matrix_body(rank, world, store):
    import pyring

    bad: list[str] = []
    shared = world > len(os.sched_getaffinity(0))  # before init, which may bind this rank
    comm = pyring.init(rank, world, store, set_default=False)
    comm.reset_stats()
    calls = 0
    for count in COUNTS:
        for dtype in DTYPES:
            for op in OPS:
                want = expected(op, world, count, dtype)
                x = _sym(comm, rank_input(op, rank, count, dtype))
                comm.all_reduce(x, op=op)
                _check(bad, f"in-place all_reduce {op} {dtype} n={count}", x, want)
                x = _sym(comm, rank_input(op, rank, count, dtype))
                out = comm.empty(count, dtype=dtype)
                comm.all_reduce(x, op=op, out=out)
                _check(bad, f"all_reduce into symmetric {op} {dtype} n={count}", out, want)
                out = torch.full_like(x, 9)
                comm.all_reduce(x, op=op, out=out)
                _check(bad, f"all_reduce into private {op} {dtype} n={count}", out, want)
                _check(bad, f"input kept {op} {dtype} n={count}", x,
                       rank_input(op, rank, count, dtype))
                full = expected(op, world, world * count, dtype)
                mine = full[rank * count:(rank + 1) * count]
                x = _sym(comm, rank_input(op, rank, world * count, dtype))
                out = torch.zeros(count, dtype=dtype)
                comm.reduce_scatter_tensor(out, x, op=op)
                _check(bad, f"reduce_scatter {op} {dtype} n={count}", out, mine)
                comm.reduce_scatter_tensor(x[rank * count:(rank + 1) * count], x, op=op)
                _check(bad, f"in-place reduce_scatter {op} {dtype} n={count}",
                       x[rank * count:(rank + 1) * count], mine)
                calls += 5
            piece = _sym(comm, rank_input("sum", rank, count, dtype))
            want = torch.cat([rank_input("sum", r, count, dtype) for r in range(world)])
            out = torch.zeros(world * count, dtype=dtype)
            comm.all_gather_into_tensor(out, piece)
            _check(bad, f"all_gather {dtype} n={count}", out, want)
            out = comm.empty(world * count, dtype=dtype)
            out[rank * count:(rank + 1) * count] = piece
            comm.all_gather_into_tensor(out, out[rank * count:(rank + 1) * count])
            _check(bad, f"in-place all_gather {dtype} n={count}", out, want)
            for src in range(world):
                t = _sym(comm, torch.full((count,), rank + 1, dtype=dtype))
                comm.broadcast(t, src=src)
                _check(bad, f"broadcast {dtype} n={count} src={src}", t,
                       torch.full((count,), src + 1, dtype=dtype))
            calls += 2 + world
    xs = [_sym(comm, torch.full((5000,), float(rank + k))) for k in range(4)]
    works = [comm.all_reduce(x, async_op=True) for x in xs]
    for k, (x, w) in enumerate(zip(xs, works)):
        w.wait(timeout=60)
        _check(bad, f"async #{k}", x, torch.full((5000,), float(sum(r + k for r in range(world)))))
    calls += 4
    zc = comm.stats()["zero_copy"]
    # Every call took the zero-copy placement; those of 8 KiB and more time both schedules (the
    # first of each size class alternate), so both ran, except where the ranks outnumber the
    # cores, which keeps zero-copy.
    if (zc["calls"] + zc["slot_schedule"] != calls or zc["calls"] == 0
            or (zc["slot_schedule"] == 0) != shared):
        bad.append(f"zero-copy calls {zc} of {calls} (cores shared: {shared})")
    comm.close()
    return bad


@pytest.mark.parametrize("world", [2, 3, 4, 5])
def test_matrix_on_symmetric_tensors(world):
    results = run_ranks(world, matrix_body, timeout=600)
    for rank, bad in enumerate(results):
        assert not bad, f"rank {rank}: {len(bad)} wrong:\n" + "\n".join(bad[:20])
    assert not _segments()


def mismatch_body(rank, world, store):
    import pyring

    comm = pyring.init(rank, world, store, set_default=False)
    try:
        comm.empty(10 + (rank == 1), dtype=torch.float32)
    except Exception as e:  # noqa: BLE001 (the message is the result)
        out = f"{type(e).__name__}: {e}"
    else:
        out = "no error"
    # The communicator stays usable.
    t = comm.empty(4)
    t.fill_(rank)
    comm.all_reduce(t)
    return out, t.tolist()


def test_mismatched_allocations_raise_on_every_rank_naming_both():
    results = run_ranks(3, mismatch_body, timeout=120)
    for msg, after in results:
        assert "rank 0 called empty(10, dtype=float32)" in msg, msg
        assert "rank 1 called empty(11, dtype=float32)" in msg, msg
        assert after == [3.0] * 4
    assert not _segments()


def slot_mismatch_body(rank, world, store):
    import pyring

    comm = pyring.init(rank, world, store, set_default=False, timeout=60)
    t = comm.empty(1000)  # collective: every rank allocates
    if rank == 1:
        t = torch.zeros(1000)  # but passes a private tensor
    return _attempt(comm.all_reduce, t)


def test_a_rank_on_the_slot_path_fails_the_call_at_once():
    results = run_ranks(2, slot_mismatch_body, timeout=120)
    assert re.search(r"rank 1 entered this collective \(#\d+\) on the slot path",
                     results[0][0]), results
    for msg, took in results:
        assert msg != "no error"
        assert took < 10, results


def killed_body(rank, world, store, call):
    import pyring

    comm = pyring.init(rank, world, store, set_default=False, timeout=60)
    t = comm.empty(100_000)
    run = comm.barrier if call == "barrier" else lambda: comm.all_reduce(t)
    run()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return _attempt(run)


@pytest.mark.parametrize("world,call", [(2, "all_reduce"), (4, "all_reduce"), (3, "barrier")])
def test_a_killed_peer_fails_every_survivor_and_leaves_no_segment(world, call):
    before = _segments()
    results = run_ranks(world, killed_body, call, timeout=120, allow_failures=True)
    for rank, r in enumerate(results):
        if rank == 1:
            continue
        msg, took = r
        assert "CommError" in msg or "PeerLost" in msg, results
        assert took < 10, results
    assert _segments() <= before


def massacre_body(rank, world, store):
    import threading

    import pyring

    comm = pyring.init(rank, world, store, set_default=False, timeout=60)
    store.set(f"massacre-pid{rank}", str(os.getpid()))
    comm.all_reduce(torch.zeros(1))
    if rank == 0:
        pids = [int(store.get(f"massacre-pid{r}")) for r in range(world)]

        def kill_all() -> None:
            time.sleep(0.5)
            for pid in pids[1:] + pids[:1]:  # this rank last
                os.kill(pid, signal.SIGKILL)

        threading.Thread(target=kill_all, daemon=True).start()
    while True:  # nearly all of the time inside an allocation, mid-exchange
        comm.empty(1000)


@pytest.mark.parametrize("world", [2, 3])
def test_every_rank_killed_inside_allocations_leaves_nothing_in_dev_shm(world):
    """No survivor cleans up here: the segments must never have had a name. (Named segments,
    unlinked once every rank had mapped them, left the names of the allocation in flight.)"""
    before = set(os.listdir("/dev/shm"))
    results = run_ranks(world, massacre_body, timeout=60, allow_failures=True)
    assert results == [None] * world, results  # every rank died by the signal
    left = {n for n in set(os.listdir("/dev/shm")) - before if n.startswith("pyring-")}
    assert not left, sorted(left)


def churn_body(rank, world, store, n):
    import resource  # noqa: F401

    import pyring

    def level():
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        return len(os.listdir("/proc/self/fd")), rss

    comm = pyring.init(rank, world, store, set_default=False)
    for _ in range(50):  # warm: the control pages, torch's and the allocator's first blocks
        x = comm.empty(1000)
        comm.all_reduce(x)
    del x
    fds0, rss0 = level()
    for k in range(n):
        x = comm.empty(1000 + k % 7 * 4096, dtype=torch.float32)
        if k % 50 == 0:
            comm.all_reduce(x)
        del x
    fds1, rss1 = level()
    left = comm.stats()["symmetric_memory"]
    comm.close()
    return fds1 - fds0, rss1 - rss0, left


@pytest.mark.skipif(bool(os.environ.get("PYRING_SANITIZED")),
                    reason="a sanitizer's quarantine keeps freed memory in the RSS")
def test_a_thousand_allocations_leave_nothing_behind():
    before = _segments()
    results = run_ranks(4, churn_body, 1000, timeout=300)
    for fds, rss, left in results:
        assert fds == 0, results
        assert rss < 4 << 20, results  # a few MiB of allocator noise, not 1000 mappings
        assert left == {"allocations": 0, "bytes": 0}, results
    assert _segments() <= before


def large_body(rank, world, store, count, calls):
    import pyring

    comm = pyring.init(rank, world, store, set_default=False)
    comm.reset_stats()
    base = torch.arange(count, dtype=torch.float32) % 1021
    want = base * sum(r + 1 for r in range(world))
    x = comm.empty(count)
    bad: list[str] = []
    for k in range(calls):
        x.copy_(base * (rank + 1))
        comm.all_reduce(x)
        _check(bad, f"call {k}", x, want)
    zc = comm.stats()["zero_copy"]
    comm.close()
    return bad, zc


@pytest.mark.parametrize("world", [2, 3])
def test_large_all_reduces_time_both_kinds_of_store_and_are_exact(world):
    # 16 MiB and an odd tail: the two-shot all_reduce times cached against non-temporal stores
    # for its outputs, and the first calls alternate (as they alternate with the slots), so
    # both kinds wrote results here.
    for rank, (bad, zc) in enumerate(run_ranks(world, large_body, (4 << 20) + 5, 24,
                                               timeout=300)):
        assert not bad, f"rank {rank}: " + "; ".join(bad[:5])
        assert zc["calls"] + zc["slot_schedule"] == 24, zc
        assert 0 < zc["streamed"] < zc["calls"], zc


def lifetime_body(rank, world, store):
    import gc

    import pyring

    comm = pyring.init(rank, world, store, set_default=False)
    t = comm.empty(2, 8)
    view = t[1]
    del t
    gc.collect()
    held = comm.stats()["symmetric_memory"]["allocations"]
    view.fill_(rank + 1)
    comm.all_reduce(view)  # a view of a symmetric tensor is symmetric
    zc = comm.stats()["zero_copy"]["calls"]
    out = view.tolist()
    del view
    gc.collect()
    return held, zc, out, comm.stats()["symmetric_memory"]["allocations"]


def test_views_keep_the_mapping_and_are_symmetric():
    for held, zc, out, after in run_ranks(2, lifetime_body, timeout=60):
        assert (held, zc, out, after) == (1, 1, [3.0] * 8, 0)


def optimizer_body(rank, world, store, symmetric):
    import pyring

    comm = pyring.init(rank, world, store, set_default=False)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = pyring.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), comm=comm,
                                      named_parameters=model.named_parameters(),
                                      symmetric_buckets=None if symmetric else False)
    g = torch.Generator().manual_seed(rank)
    for _ in range(5):
        opt.zero_grad()
        model(torch.randn(16, 32, generator=g)).square().mean().backward()
        opt.step()
    return ([p.detach().numpy().copy() for p in model.parameters()],
            comm.stats()["zero_copy"]["calls"])


def test_distributed_optimizer_buckets_are_symmetric_and_bitwise_equal():
    import numpy as np

    sym = run_ranks(2, optimizer_body, True, timeout=120)
    private = run_ranks(2, optimizer_body, False, timeout=120)
    for (ps, zc), (pp, zp) in zip(sym, private):
        assert zc > 0 and zp == 0, (zc, zp)
        for a, b in zip(ps, pp):
            assert np.array_equal(a, b)


def backend_body(rank, world, store):
    import torch.distributed as dist

    import pyring

    dist.init_process_group("pyring", store=store, rank=rank, world_size=world)
    comm = dist.group.WORLD._get_backend(torch.device("cpu")).comm
    t = pyring.empty(1 << 16, comm=comm)
    t.fill_(rank + 1)
    dist.all_reduce(t)
    inp = pyring.empty(world * 8, comm=comm)
    inp.fill_(rank + 1)
    out = torch.empty(8)
    dist.reduce_scatter_tensor(out, inp)
    g = pyring.empty(8, comm=comm)
    g.fill_(rank)
    gathered = torch.empty(8 * world)
    dist.all_gather_into_tensor(gathered, g)
    b = pyring.empty(8, comm=comm)
    b.fill_(rank)
    dist.broadcast(b, src=1)
    zc = comm.stats()["zero_copy"]
    dist.destroy_process_group()
    return (t[0].item(), out.tolist(), gathered.tolist(), b.tolist(),
            zc["calls"] + zc["slot_schedule"])


def test_the_torch_backend_takes_the_zero_copy_path():
    for got in run_ranks(2, backend_body, timeout=120):
        assert got == (3.0, [3.0] * 8, [0.0] * 8 + [1.0] * 8, [1.0] * 8, 4), got


def test_cores_are_shared_only_where_ranks_outnumber_their_cpus():
    from pyring.api import _shares_cores

    assert not _shares_cores([[0, 1], [0, 1]])  # free to run anywhere: one core each
    assert not _shares_cores([[0], [1]])  # bound apart by an earlier communicator
    assert _shares_cores([[0, 1]] * 4)  # 4 ranks on 2 cores
    assert _shares_cores([[0], [0]])


def output_mismatch_body(rank, world, store):
    import pyring

    comm = pyring.init(rank, world, store, set_default=False, timeout=60)
    x = comm.empty(1000)
    out = comm.empty(1000)
    # Rank 0 reduces in place, rank 1 into its symmetric out: their two-shot writes would miss.
    if rank == 0:
        return _attempt(comm.all_reduce, x)
    return _attempt(lambda: comm.all_reduce(x, out=out))


def test_ranks_whose_outputs_differ_fail_naming_both():
    for msg, took in run_ranks(2, output_mismatch_body, timeout=120):
        assert "ranks disagree on the zero-copy call" in msg and "output" in msg, msg
        assert took < 10


def barrier_body(rank, world, store):
    import pyring

    comm = pyring.init(rank, world, store, set_default=False, timeout=60)
    comm.barrier()  # before the first allocation: along the ring
    ring = comm.stats()["zero_copy"]["barriers"]
    x = comm.empty(1001)
    if rank == 0:
        time.sleep(0.3)
    t0 = time.monotonic()
    comm.barrier()
    waited = time.monotonic() - t0
    comm.barrier(async_op=True).wait()
    wrong = 0
    for i in range(200):  # barriers between one-shot and two-shot calls on the same tensors
        n = 1001 if i % 2 else 40_003
        y = x if n == 1001 else comm.empty(n)
        y.fill_(rank + i)
        comm.barrier()
        comm.all_reduce(y)
        wrong += int((y != world * i + world * (world - 1) / 2).sum())
    return ring, waited, wrong, comm.stats()["zero_copy"]["barriers"]


@pytest.mark.parametrize("world", [2, 4])
def test_the_barrier_runs_on_the_flags_once_memory_is_symmetric(world):
    for rank, (ring, waited, wrong, flags) in enumerate(run_ranks(world, barrier_body,
                                                                  timeout=120)):
        assert ring == 0 and flags == 202, (rank, ring, flags)
        if rank != 0:  # nobody leaves before the late rank entered
            assert waited >= 0.25, (rank, waited)
        assert wrong == 0


def barrier_desync_body(rank, world, store, private):
    import pyring

    comm = pyring.init(rank, world, store, set_default=False, timeout=60)
    x = comm.empty(1000)
    if rank == 0:
        return _attempt(comm.barrier)
    return _attempt(comm.all_reduce, torch.zeros(1000) if private else x)


def test_a_barrier_beside_another_collective_fails_both_ranks():
    (mine, took0), (theirs, took1) = run_ranks(2, barrier_desync_body, False, timeout=120)
    for msg in (mine, theirs):
        assert "ranks disagree on the zero-copy call" in msg, msg
        assert f"kind {6}" in msg and f"kind {1}" in msg, msg
    (mine, took0), (theirs, took1) = run_ranks(2, barrier_desync_body, True, timeout=120)
    assert "rank 1 entered this collective" in mine and "another collective" in mine, mine
    assert theirs != "no error"
    assert took0 < 10 and took1 < 10, (mine, theirs)
