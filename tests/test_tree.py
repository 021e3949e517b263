"""The algorithm axis of the collective matrix, crossed with explicit topologies on one host;
byte counters against the formulas; topology agreement and the selector's log.

Each world size runs in one set of processes that builds one communicator per topology.
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
from cases import DTYPES, OPS, counts_for, expected, rank_input
from test_collectives import _check, _other_cases

from pyring.launch import run_ranks

ALGOS = ("ring", "direct", "tree")
# Uneven groups, groups of one, non-contiguous groups and two levels, per world size.
TOPOLOGIES = {
    2: ["0;1", "0,1"],
    3: ["0;1;2", "0,2;1"],
    4: ["0,1;2,3", "0,2;1,3", "0,1,2;3"],
    5: ["0,1,2;3,4", "0;1,2,3,4", [[[0, 1], [2]], [[3, 4]]]],
    6: ["0,1;2,3|4,5"],
}
HEADER = 32  # bytes each collective sends ahead of its data on every link it uses


def _all_reduce_algo_cases(comm, rank, world, bad, tag):
    for algo in ALGOS:
        # The tree gets every dtype; the flat algorithms' dtype handling is test_collectives'.
        dtypes = DTYPES if algo == "tree" else (torch.float32, torch.bfloat16, torch.int64)
        for count in counts_for(world):
            for dtype in dtypes:
                for op in OPS:
                    want = expected(op, world, count, dtype)
                    x = rank_input(op, rank, count, dtype)
                    comm.all_reduce(x, op=op, algo=algo)
                    _check(bad, f"{tag} {algo} in-place {op} {dtype} n={count}", x, want)
                    x = rank_input(op, rank, count, dtype)
                    out = torch.full_like(x, 9)
                    comm.all_reduce(x, op=op, out=out, algo=algo)
                    _check(bad, f"{tag} {algo} out-of-place {op} {dtype} n={count}", out, want)
        big = 20_003
        x = rank_input("sum", rank, big, torch.bfloat16)
        comm.all_reduce(x, algo=algo)
        _check(bad, f"{tag} {algo} bfloat16 n={big}", x, expected("sum", world, big,
                                                                  torch.bfloat16))


def topology_body(rank, world, store, topologies):
    import pyring

    bad: list[str] = []
    for spec in topologies:
        # algo="tree" also makes reduce-scatter and allgather take the tree where it is even.
        for algo in ("tree", "ring"):
            with pyring.init(rank, world, store, segment_bytes=128, topology=spec, algo=algo,
                             set_default=False) as comm:
                tag = f"topology {comm.topology.spec()} algo={algo}"
                if algo == "tree":
                    _all_reduce_algo_cases(comm, rank, world, bad, tag)
                _other_cases(comm, rank, world, bad)
                calls = comm.stats()["calls"]
                if world > 1 and algo == "tree" and not all(calls[a] > 0 for a in ALGOS):
                    bad.append(f"{tag}: calls per algorithm {calls}")
    return bad


@pytest.mark.parametrize("world", sorted(TOPOLOGIES))
def test_topology_matrix(world):
    results = run_ranks(world, topology_body, TOPOLOGIES[world], timeout=400)
    for rank, bad in enumerate(results):
        assert not bad, f"rank {rank}: {len(bad)} wrong results:\n" + "\n".join(bad[:20])


def counters_body(rank, world, store, spec, nbytes):
    import pyring

    out = {}
    with pyring.init(rank, world, store, topology=spec, set_default=False) as comm:
        x = torch.ones(nbytes // 4)
        for algo in ("tree", "ring"):
            comm.all_reduce(x, algo=algo)  # warm-up, then counters from zero
            comm.reset_stats()
            comm.all_reduce(x, algo=algo)
            out[algo] = comm.stats()
        # Several pipelined slices (2 MiB each) through every level, out of place and in place.
        bad: list[str] = []
        for dtype, op in ((torch.float32, "sum"), (torch.bfloat16, "avg")):
            count = 3 * (1 << 20) + 5
            x = rank_input(op, rank, count, dtype)
            got = torch.empty_like(x)
            comm.all_reduce(x, op=op, out=got, algo="tree")
            _check(bad, f"sliced tree {dtype} {op}", got, expected(op, world, count, dtype))
            comm.all_reduce(x, op=op, algo="tree")
            _check(bad, f"sliced tree in place {dtype} {op}", x, expected(op, world, count, dtype))
        out["bad"] = bad
        return out, comm.topology.groups[-1]


@pytest.mark.parametrize("world,spec", [(4, "0,1;2,3"), (4, "0,2;1,3"), (6, "0,1,2;3,4,5"),
                                        (6, "0,1;2,3;4,5"), (8, "0,1;2,3|4,5;6,7")])
def test_counters_match_formulas(world, spec):
    nbytes = 1 << 20
    results = run_ranks(world, counters_body, spec, nbytes)
    groups = results[0][1]
    h, n = len(groups), world
    for rank, (r, _) in enumerate(results):
        assert not r["bad"], f"rank {rank}: " + "\n".join(r["bad"])
    group_of = {r: g for g, members in enumerate(groups) for r in members}
    for algo in ("tree", "ring"):
        stats = [r[0][algo] for r in results]
        for s in stats:
            assert s["calls"][algo] == 1 and sum(s["calls"].values()) == 1, s
            assert s["bytes_sent"] == sum(v["bytes_sent"] for v in s["links"].values())
        if algo == "ring":
            # Every rank sends 2(N-1)/N of the buffer, give or take a float per chunk.
            want = 2 * (n - 1) / n * nbytes
            for rank, s in enumerate(stats):
                got = s["bytes_sent"]
                assert want <= got <= want + 8 * n + HEADER, (rank, got, want)
            continue
        # The tree sends 2(H-1)/H of the buffer out of each group, headers aside.
        want = 2 * (h - 1) / h * nbytes
        for g, members in enumerate(groups):
            out = sum(v["bytes_sent"] for r in members
                      for peer, v in stats[r]["links"].items() if group_of[peer] != g)
            allowance = len(members) * (2 * HEADER + 8 * n)
            assert want - allowance <= out <= want + allowance, (g, out, want)


def stats_body(rank, world, store):
    import pyring

    pyring.init(rank, world, store)
    pyring.all_reduce(torch.ones(1000))
    pyring.reset_stats()
    pyring.all_reduce(torch.ones(1000))
    s = pyring.stats()
    pyring.destroy()
    return s


def test_counters_stats_structure():
    for rank, s in enumerate(run_ranks(2, stats_body)):
        peer = 1 - rank
        assert set(s) == {"bytes_sent", "bytes_received", "links", "calls", "p2p", "device_links",
                          "device_host_bytes", "device_memory", "zero_copy",
                          "symmetric_memory"}
        assert s["device_links"] == {} and s["device_host_bytes"] == 0  # host tensors only
        assert s["device_memory"] == {}
        assert s["links"][peer]["transport"] == "shm"
        assert s["links"][peer]["bytes_sent"] == s["bytes_sent"] == 4000 + HEADER
        assert s["calls"] == {"ring": 0, "direct": 1, "tree": 0}


def bad_spec_body(rank, world, store, specs):
    import pyring

    pyring.init(rank, world, store, topology=specs[rank], set_default=False)


@pytest.mark.parametrize("specs,text", [
    (["0,1", "0,1", "0,1"], "rank 2 is missing"),
    (["0,1;1,2"] * 3, "rank 1 appears twice"),
    (["0,1;2,3"] * 3, "rank 3 is out of range for world size 3"),
    (["0,1;2", "0,1;2", "0;1,2"], "here but ranks"),
])
def test_bad_topology_fails_on_every_rank(specs, text):
    results = run_ranks(3, bad_spec_body, specs, allow_failures=True, timeout=60)
    for rank, r in enumerate(results):
        assert r is not None and r[0] == "ValueError" and text in r[1], (rank, r)


def log_body(rank, world, store):
    import pyring

    with tempfile.TemporaryFile() as f:
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        try:
            comm = pyring.init(rank, world, store, topology="0,1;2,3", set_default=False)
            for n in (1024, 1024, 1 << 22):
                comm.all_reduce(torch.ones(n))
            comm.all_reduce(torch.ones(1024), algo="ring")
            comm.all_reduce(torch.ones(1024), algo="ring")
            comm.broadcast(torch.ones(8))
            comm.close()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        return f.read().decode()


def test_debug_info_logs_topology_and_decisions():
    logs = run_ranks(4, log_body, env={"PYRING_DEBUG": "INFO"})
    assert "topology" in logs[0] and "0,1;2,3" in logs[0], logs[0]
    assert all("topology (" not in log for log in logs[1:])
    for log in logs:
        # One line per distinct decision: the repeated 4 KiB call and the forced ring once each.
        decisions = [line for line in log.splitlines() if "all_reduce " in line]
        assert 2 <= len(decisions) <= 3, log  # auto's one or two choices, the forced ring
        assert log.count("all_reduce 4 KiB: ring (requested)") == 1, log
        assert "broadcast 32 B: ring (" in log, log
