"""The "pyring" torch.distributed backend: torch's collectives, subgroups, functional
collectives, DDP, async work, errors, torchrun.

One job of 3 spawned ranks (``dist.init_process_group("pyring", store=...)``) runs every part
in turn and each test checks its part's results; expected values have closed forms
(tests/cases.py). torchrun gets a job of its own.
"""

from __future__ import annotations

import datetime
import itertools
import json
import os
import subprocess
import sys
import threading
import time
import warnings

import pytest
import torch
import torch.distributed as dist
from cases import counts_for, expected, rank_input

import pyring
from pyring.launch import run_ranks

HERE = os.path.dirname(__file__)
TORCH_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX,
             "min": dist.ReduceOp.MIN, "prod": dist.ReduceOp.PRODUCT}


def _check(bad, what, got, want):
    if got.dtype != want.dtype or not torch.equal(got, want):
        bad.append(f"{what}: got {got.flatten()[:6].tolist()} want {want.flatten()[:6].tolist()}")


def _call(fn, *args, async_op, **kwargs):
    work = fn(*args, async_op=async_op, **kwargs)
    assert (work is None) != async_op
    if async_op:
        work.wait()


def _collectives(rank, world):
    assert isinstance(dist.group.WORLD, pyring.c10d.backend.ProcessGroupPyring)
    assert dist.get_backend() == "pyring"
    bad = []
    for dtype, n, a in itertools.product((torch.float32, torch.int64), counts_for(world),
                                         (False, True)):
        tag = f"{dtype} n={n} async_op={a}"
        for op, top in TORCH_OPS.items():
            x = rank_input(op, rank, n, dtype)
            _call(dist.all_reduce, x, op=top, async_op=a)
            _check(bad, f"all_reduce {op} {tag}", x, expected(op, world, n, dtype))
            mine = expected(op, world, world * n, dtype)[rank * n:(rank + 1) * n]
            for fn in (dist.reduce_scatter_tensor, dist.reduce_scatter_single):
                out = torch.full((n,), 7, dtype=dtype)
                _call(fn, out, rank_input(op, rank, world * n, dtype), op=top, async_op=a)
                _check(bad, f"{fn.__name__} {op} {tag}", out, mine)
            pieces = list(rank_input(op, rank, world * n, dtype).view(world, n))
            out = torch.full((n,), 7, dtype=dtype)
            _call(dist.reduce_scatter, out, pieces, op=top, async_op=a)
            _check(bad, f"reduce_scatter (list) {op} {tag}", out, mine)
        for src in range(world):
            t = torch.full((n,), rank + 1, dtype=dtype)
            _call(dist.broadcast, t, src=src, async_op=a)
            _check(bad, f"broadcast src={src} {tag}", t, torch.full((n,), src + 1, dtype=dtype))
        piece = rank_input("sum", rank, n, dtype)
        want = torch.cat([rank_input("sum", r, n, dtype) for r in range(world)])
        outs = [torch.full((n,), 7, dtype=dtype) for _ in range(world)]
        _call(dist.all_gather, outs, piece, async_op=a)
        _check(bad, f"all_gather (list) {tag}", torch.cat(outs), want)
        for fn in (dist.all_gather_into_tensor, dist.all_gather_single):
            out = torch.full((world * n,), 7, dtype=dtype)
            _call(fn, out, piece, async_op=a)
            _check(bad, f"{fn.__name__} {tag}", out, want)
        _call(dist.barrier, async_op=a)
    shaped = [torch.zeros(2, 3) for _ in range(world)]  # list outputs keep their shapes
    dist.all_gather(shaped, torch.full((2, 3), float(rank)))
    _check(bad, "all_gather 2x3", torch.stack(shaped),
           torch.arange(world, dtype=torch.float32).view(world, 1, 1).expand(world, 2, 3))
    return bad


def _reduce_opts(root):
    opts = dist.ReduceOptions()
    opts.rootRank = root
    return opts


def _async_and_errors(rank, world):
    main = threading.get_ident()
    # Async: rank 1 joins late, so the work is pending and its future completes later.
    dist.barrier()
    if rank == 1:
        time.sleep(1.0)
    t = torch.full((1000,), float(rank + 1))
    work = dist.all_reduce(t, async_op=True)
    seen = {}
    if rank == 0:
        seen["pending"] = not work.is_completed()
        where = work.get_future().then(lambda f: threading.get_ident())
        try:
            work.wait(timeout=datetime.timedelta(seconds=0.05))
            seen["timeout"] = False
        except TimeoutError:  # pyring.CommTimeout; the collective keeps running
            seen["timeout"] = True
    assert isinstance(work, dist.Work)
    assert work.wait() is True and work.is_completed() and work.exception() is None
    value = work.get_future().wait()
    seen["value_is_output"] = len(value) == 1 and value[0] is t and work.result()[0] is t
    seen["sum"] = float(t[0])
    if rank == 0:
        seen["callback_off_main"] = where.wait() != main
    outs = [torch.zeros(2) for _ in range(world)]
    fut = dist.all_gather(outs, torch.full((2,), float(rank)), async_op=True).get_future()
    seen["all_gather_future"] = [o.tolist() for o in fut.wait()] == [o.tolist() for o in outs]
    seen["barrier_future"] = dist.barrier(async_op=True).get_future().wait() == []
    # Errors: raised on every rank before any byte moves; the group stays usable.
    pg = dist.group.WORLD
    x = torch.ones(4)
    cases = {
        "two tensors": lambda: pg.allreduce([x, x.clone()]),
        "band": lambda: dist.all_reduce(x, op=dist.ReduceOp.BAND),
        "premul_sum": lambda: dist.all_reduce(x, op=dist._make_nccl_premul_sum(2.0)),
        "gather list length": lambda: dist.all_gather([torch.zeros(4)], x),
        "gather list dtype": lambda: dist.all_gather([torch.zeros(4, dtype=torch.int32)] * world,
                                                     x),
        "non-contiguous send": lambda: pg.send([torch.ones(4, 2).t()], (rank + 1) % world, 0),
        "reduce root": lambda: pg.reduce([x], _reduce_opts(world)),
        "send to self": lambda: pg.send([x], rank, 0),
        "splits": lambda: dist.all_to_all_single(torch.empty(world), torch.ones(world),
                                                 [1] * world, [2] * world),
        "sparse max": lambda: dist.all_reduce(torch.eye(2).to_sparse(), op=dist.ReduceOp.MAX),
    }
    errors = {}
    for name, call in cases.items():
        try:
            call()
            errors[name] = None
        except Exception as e:
            errors[name] = (type(e).__name__, str(e))
    y = torch.ones(3)
    dist.all_reduce(y)
    seen["after_errors"] = y.tolist()
    return seen, errors

def _subgroups_and_functional(rank, world):
    import torch.distributed._functional_collectives as fc

    # Rank 1 joins both subgroups, rank 2 only the second: their rendezvous counts differ.
    groups = [dist.new_group([0, 1]), dist.new_group([1, 2]), dist.new_group([2])]
    got = {}
    for i, g in enumerate(groups):
        if dist.get_rank(g) < 0:
            continue
        assert isinstance(g, pyring.c10d.backend.ProcessGroupPyring)
        assert g.comm.world_size == g.size()
        t = torch.full((5,), float(rank + 1))
        dist.all_reduce(t, group=g)
        out = torch.zeros(g.size())
        dist.all_gather_into_tensor(out, torch.full((1,), float(rank)), group=g)
        got[f"group{i}"] = (float(t[0]), out.tolist())
        got[f"group{i} functional"] = fc.all_reduce(torch.full((2,), float(rank)), "max",
                                                    g).tolist()
    got["all_reduce"] = fc.wait_tensor(fc.all_reduce(torch.ones(3), "sum",
                                                     dist.group.WORLD)).tolist()
    got["all_gather"] = fc.all_gather_single(torch.full((2,), float(rank)), 0,
                                             dist.group.WORLD).tolist()
    got["reduce_scatter"] = fc.reduce_scatter_single(torch.arange(2.0 * world), "sum", 0,
                                                     dist.group.WORLD).tolist()
    return got
def _train(pg, rank, hook=None):
    torch.manual_seed(rank)  # ranks start apart; DDP broadcasts rank 0's weights
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                                torch.nn.ReLU(), torch.nn.Linear(16, 4))
    # A tiny bucket cap splits the gradients into several allreduces in flight at once.
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=pg,
                                                    bucket_cap_mb=0.0005)
    if hook is not None:
        ddp.register_comm_hook(*hook(pg))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(4):
        x, y = torch.randn(6, 8, generator=gen), torch.randn(6, 4, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return [p.detach().numpy().copy() for p in model.parameters()]


def _ddp(rank, world):
    gloo = dist.new_group(backend="gloo")
    return {"pyring": _train(None, rank), "gloo": _train(gloo, rank)}


def _powersgd(pg):
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

    # Its then() callbacks launch allreduces and wait on them.
    state = ps.PowerSGDState(process_group=pg, matrix_approximation_rank=1,
                             start_powerSGD_iter=2, min_compression_rate=0.5, random_seed=0)
    return state, ps.powerSGD_hook


def _default_hook(pg):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return pg, default_hooks.fp16_compress_hook


def _local_sgd(backend):
    from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as pl

    # After two global steps, gradients are averaged only within ranks {0, 1} and {2}.
    sub, _ = dist.new_subgroups_by_enumeration([[0, 1], [2]], backend=backend)

    def hook(pg):
        return pl.PostLocalSGDState(process_group=pg, subgroup=sub,
                                    start_localSGD_iter=2), pl.post_localSGD_hook

    return hook


def _comm_hooks(rank, world):
    gloo = dist.new_group(backend="gloo")
    hooks = {"powerSGD": (_powersgd, _powersgd), "fp16": (_default_hook, _default_hook),
             "post_localSGD": (_local_sgd("pyring"), _local_sgd("gloo"))}
    return {name: {"pyring": _train(None, rank, mine), "gloo": _train(gloo, rank, theirs)}
            for name, (mine, theirs) in hooks.items()}


def _coalesced(rank, world):
    """Tensors of several shapes in one all_reduce_coalesced, sync and async."""
    got = {}
    for async_op in (False, True):
        ts = [torch.full((3,), float(rank)), torch.full((2, 2), rank + 1.0), torch.ones(0)]
        work = dist.all_reduce_coalesced(ts, async_op=async_op)
        if async_op:
            work.wait()
        got[async_op] = [t.tolist() for t in ts]
    try:
        dist.all_reduce_coalesced([torch.ones(2), torch.ones(2, dtype=torch.float64)])
    except ValueError as e:
        got["mixed"] = str(e)
    return got


def _callbacks(rank, world):
    """A callback on one collective's future launches a second one and waits on it."""
    y = torch.ones(1000)

    def then(fut):
        dist.all_reduce(y, async_op=True).get_future().wait()
        return float(y[0])

    start = time.monotonic()
    value = dist.all_reduce(torch.ones(10), async_op=True).get_future().then(then).wait()
    return value, time.monotonic() - start


def _objects(rank, world):
    """torch's object collectives and object point-to-point over the pyring backend."""
    got = [None] * world
    dist.all_gather_object(got, {"rank": rank, "sq": [rank] * rank})
    objs = [f"from {rank}", rank] if rank == 1 else [None, None]
    dist.broadcast_object_list(objs, src=1)
    gathered = [None] * world if rank == 2 else None
    dist.gather_object(("g", rank), gathered, dst=2)
    out = [None]
    dist.scatter_object_list(out, [("s", r) for r in range(world)] if rank == 0 else None, src=0)
    p2p = [None]
    if rank == 0:
        dist.send_object_list([{"to": 1}], dst=1)
    elif rank == 1:
        dist.recv_object_list(p2p, src=0)
    return got, objs, gathered, out, p2p


def _layouts(rank, world):
    """Complex SUM/AVG in reduce and reduce_scatter, bool SUM and PRODUCT, and non-contiguous
    tensors (transposed views, channels_last) in the collectives and rooted ops, as gloo
    takes them."""
    bad, k = [], float(sum(range(1, world + 1)))  # the sum of the ranks' factors (rank + 1)
    f = rank + 1
    z = torch.tensor([1 + 2j, 3j]) * f
    dist.reduce(z, dst=0)
    if rank == 0:
        _check(bad, "complex reduce sum", z, torch.tensor([1 + 2j, 3j]) * k)
    z = torch.tensor([1 + 2j, 3j]) * f
    dist.reduce(z, dst=1, op=dist.ReduceOp.AVG)
    if rank == 1:
        _check(bad, "complex reduce avg", z, torch.tensor([1 + 2j, 3j]) * (k / world))
    zin = torch.arange(2.0 * world).to(torch.complex64) * (1 + 1j) * f
    zout = torch.empty(2, dtype=torch.complex64)
    dist.reduce_scatter_tensor(zout, zin)
    _check(bad, "complex reduce_scatter", zout, zin[2 * rank:2 * rank + 2] / f * k)
    flags = torch.tensor([rank == 0, True, False])
    dist.all_reduce(flags)  # any
    _check(bad, "bool sum", flags, torch.tensor([True, True, False]))
    flags = torch.tensor([rank == 0, True, False])
    dist.all_reduce(flags, op=dist.ReduceOp.PRODUCT)  # all
    _check(bad, "bool product", flags, torch.tensor([False, True, False]))
    base = torch.arange(6.0).reshape(2, 3)
    t = (base * f).t()  # a transposed view
    dist.all_reduce(t)
    _check(bad, "transposed all_reduce", t, (base * k).t())
    img = torch.full((1, 2, 2, 2), float(rank)).to(memory_format=torch.channels_last)
    dist.broadcast(img, src=1)
    _check(bad, "channels_last broadcast", img.contiguous(), torch.ones(1, 2, 2, 2))
    if not img.is_contiguous(memory_format=torch.channels_last):
        bad.append("channels_last broadcast: the layout changed")
    out = torch.empty(2, world).t()
    dist.all_gather_into_tensor(out, torch.full((2,), float(rank)))
    _check(bad, "transposed all_gather out", out,
           torch.arange(world, dtype=torch.float32)[:, None].expand(world, 2))
    inp = (torch.arange(2.0 * world).reshape(2, world) * f).t()
    got = torch.empty(2)
    dist.reduce_scatter_tensor(got, inp)
    _check(bad, "transposed reduce_scatter in", got, torch.tensor([rank, world + rank]) * k)
    outs = [torch.empty(2, 2).t() for _ in range(world)] if rank == 0 else None
    dist.gather(torch.full((2, 2), float(rank)).t(), outs, dst=0)
    if rank == 0:
        for r, o in enumerate(outs):
            _check(bad, f"transposed gather [{r}]", o, torch.full((2, 2), float(r)))
    o = torch.empty(2, 2).t()
    dist.scatter(o, [torch.full((2, 2), float(r)).t() for r in range(world)]
                 if rank == 0 else None, src=0)
    _check(bad, "transposed scatter", o, torch.full((2, 2), float(rank)))
    return bad


PARTS = {"objects": _objects, "collectives": _collectives, "async_and_errors": _async_and_errors,
         "groups": _subgroups_and_functional, "ddp": _ddp, "callbacks": _callbacks,
         "comm_hooks": _comm_hooks, "coalesced": _coalesced, "layouts": _layouts}


def _job(rank, world, store):
    # all_gather_into_tensor / reduce_scatter_tensor are deprecated aliases in torch 2.13.
    warnings.simplefilter("ignore", FutureWarning)
    dist.init_process_group("pyring", store=store, rank=rank, world_size=world)
    res = {name: part(rank, world) for name, part in PARTS.items()}
    dist.destroy_process_group()
    return res


@pytest.fixture(scope="module")
def ranks():
    """Each rank's results of every part, from one job of 3 ranks."""
    return run_ranks(3, _job, timeout=150)


def test_object_collectives(ranks):
    for rank, (got, objs, gathered, out, p2p) in enumerate(r["objects"] for r in ranks):
        assert got == [{"rank": r, "sq": [r] * r} for r in range(3)]
        assert objs == ["from 1", 1] and out == [("s", rank)]
        assert gathered == ([("g", r) for r in range(3)] if rank == 2 else None)
        assert p2p == ([{"to": 1}] if rank == 1 else [None])


def test_collectives_match_closed_forms(ranks):
    assert [r["collectives"] for r in ranks] == [[], [], []]


def test_complex_reductions_and_non_contiguous_tensors(ranks):
    assert [r["layouts"] for r in ranks] == [[], [], []]


def test_async_work_and_errors(ranks):
    for rank, res in enumerate(ranks):
        seen, errors = res["async_and_errors"]
        assert seen["sum"] == 6.0 and seen["value_is_output"], seen
        assert seen["all_gather_future"] and seen["barrier_future"], seen
        assert seen["after_errors"] == [3.0, 3.0, 3.0], seen
        if rank == 0:
            assert seen["pending"] and seen["timeout"] and seen["callback_off_main"], seen
        for name, want_type, words in [
            ("two tensors", "ValueError", "2 tensors"),
            ("band", "ValueError", "BAND is not supported"),
            ("premul_sum", "ValueError", "PREMUL_SUM is not supported"),
            ("gather list length", "ValueError", "needs 3 tensors"),
            ("gather list dtype", "ValueError", "torch.int32"),
            ("non-contiguous send", "ValueError", "not contiguous"),
            ("reduce root", "ValueError", "dst=3 is not a rank of a world of 3"),
            ("send to self", "ValueError", "is this rank"),
            ("splits", "ValueError", "sum to 6 but input has 3 rows"),
            ("sparse max", "ValueError", "SUM only"),
        ]:
            assert errors[name] is not None, f"{name} did not raise"
            assert errors[name][0] == want_type and words in errors[name][1], (name, errors[name])


def test_subgroups_and_functional_collectives(ranks):
    res = [r["groups"] for r in ranks]
    world = {"all_reduce": [3.0] * 3, "all_gather": [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]}
    assert res[0] == {**world, "group0": (3.0, [0.0, 1.0]), "group0 functional": [1.0, 1.0],
                      "reduce_scatter": [0.0, 3.0]}
    assert res[1] == {**world, "group0": (3.0, [0.0, 1.0]), "group0 functional": [1.0, 1.0],
                      "group1": (5.0, [1.0, 2.0]), "group1 functional": [2.0, 2.0],
                      "reduce_scatter": [6.0, 9.0]}
    assert res[2] == {**world, "group1": (5.0, [1.0, 2.0]), "group1 functional": [2.0, 2.0],
                      "group2": (3.0, [2.0]), "group2 functional": [2.0, 2.0],
                      "reduce_scatter": [12.0, 15.0]}


def test_ddp_matches_gloo(ranks):
    res = [r["ddp"] for r in ranks]
    for r in range(3):
        for a, b in zip(res[r]["pyring"], res[0]["pyring"]):
            assert (a == b).all(), f"rank {r} parameters differ from rank 0's"
        for a, b in zip(res[r]["pyring"], res[r]["gloo"]):
            assert abs(a - b).max() <= 1e-6 * abs(b).max(), abs(a - b).max()


def test_all_reduce_coalesced(ranks):
    for r in ranks:
        for async_op in (False, True):
            assert r["coalesced"][async_op] == [[3.0] * 3, [[6.0, 6.0], [6.0, 6.0]], []]
        assert "dtype" in r["coalesced"]["mixed"] or "float64" in r["coalesced"]["mixed"]


def test_callback_may_run_collectives(ranks):
    for value, seconds in (r["callbacks"] for r in ranks):
        assert value == 3.0 and seconds < 10, (value, seconds)


# fp16: gloo adds float16 in float16, pyring in float32 with one rounding; they agree to
# float16's precision.
@pytest.mark.parametrize("hook,tolerance", [("powerSGD", 1e-5), ("fp16", 1e-3),
                                            ("post_localSGD", 1e-5)])
def test_torch_comm_hooks_match_gloo(ranks, hook, tolerance):
    res = [r["comm_hooks"][hook] for r in ranks]
    # Local SGD keeps rank 2 apart from {0, 1} after its switch.
    same_as = {0: 0, 1: 0, 2: 2} if hook == "post_localSGD" else {0: 0, 1: 0, 2: 0}
    for r in range(3):
        for a, b in zip(res[r]["pyring"], res[same_as[r]]["pyring"]):
            assert (a == b).all(), f"rank {r} parameters differ from rank {same_as[r]}'s"
        for a, b in zip(res[r]["pyring"], res[r]["gloo"]):
            assert abs(a - b).max() <= tolerance * abs(b).max(), abs(a - b).max()


def test_torchrun(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--standalone", os.path.join(HERE, "scripts", "torchrun_backend_job.py"),
           str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for r in range(2):
        rep = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert rep == {"rank": r, "world": 2, "backend": "pyring", "value": 3.0,
                       "grad": [[1.5, 1.5, 1.5]]}
