"""PYRING_DEBUG=DETAIL: every rank names the rank that called a different collective; the
flight recorder keeps the last collectives and is dumped on failure."""

from __future__ import annotations

import time

import pytest
import torch

import pyring
from pyring.launch import run_ranks

WORLD = 5
ODD = 4  # the rank that calls something else
TIMEOUT_S = 20.0

# What every rank but ODD calls (kind, count, dtype, op, root, algo), what ODD calls instead,
# and a word the message must show.
AR = ("all_reduce", 64, torch.float32, "sum", 0, None)
BC = ("broadcast", 64, torch.float32, None, 0, None)
CASES = {
    "kind": (AR, BC, "broadcast"),
    "count": (AR, AR[:1] + (65,) + AR[2:], "count=65"),
    "dtype": (AR, AR[:2] + (torch.float64,) + AR[3:], "dtype=float64"),
    "op": (AR, AR[:3] + ("max",) + AR[4:], "op=max"),
    "root": (BC, BC[:4] + (2, None), "root=2"),
    "algo": (AR, AR[:5] + ("ring",), "algo=ring"),
}


def _call(comm, call):
    kind, count, dtype, op, root, algo = call
    t = torch.ones(count, dtype=dtype)
    if kind == "all_reduce":
        comm.all_reduce(t, op=op, algo=algo)
    else:
        comm.broadcast(t, src=root)


def _desync(rank, world, store):
    """Every case in turn on one communicator, which stays usable after each DesyncError."""
    comm = pyring.init(rank, world, store, set_default=False, timeout=TIMEOUT_S)
    comm.all_reduce(torch.ones(8))  # #1: every rank agrees
    outs = {}
    for case, (common, odd, _) in CASES.items():
        start = time.monotonic()
        try:
            _call(comm, odd if rank == ODD else common)
            out = ("no error", "", 0.0)
        except pyring.Error as e:
            out = (type(e).__name__, str(e), time.monotonic() - start)
        ok = None
        if out[0] == "DesyncError":  # the communicator is still usable
            t = torch.ones(4)
            comm.all_reduce(t)
            ok = float(t[0])
        outs[case] = out + (ok,)
        if out[0] != "DesyncError":
            break  # the communicator may be unusable: the cases after it say nothing
    comm.close()
    return outs


def test_every_rank_names_the_rank_that_differs():
    res = run_ranks(WORLD, _desync, env={"PYRING_DEBUG": "DETAIL"}, timeout=120)
    for case, (_, _, word) in CASES.items():
        for rank, outs in enumerate(res):
            assert case in outs, (case, rank, outs)
            kind, msg, elapsed, ok = outs[case]
            assert kind == "DesyncError", (case, rank, kind, msg)
            assert f"rank {ODD} called" in msg and word in msg, (case, rank, msg)
            assert "ranks 0, 1, 2, 3 called" in msg, (case, rank, msg)
            assert elapsed < TIMEOUT_S / 2, (case, rank, elapsed)
            assert ok == WORLD, (case, rank, ok)


def _recorder(rank, world, store):
    comm = pyring.init(rank, world, store, set_default=False, timeout=2.0)
    for n in (10, 100_000):
        comm.all_reduce(torch.ones(n))
    comm.broadcast(torch.ones(3), src=1)
    comm.gather(torch.ones(2), [torch.empty(2) for _ in range(world)] if rank == 0 else None)
    before = comm.debug_dump()
    if rank == 1:
        return before, None
    try:
        comm.all_reduce(torch.ones(7))
    except pyring.CommError:
        pass
    return before, comm.debug_dump()


def test_flight_recorder_records_and_marks_the_failure(capfd):
    res = run_ranks(2, _recorder, timeout=60)
    before, after = res[0]
    assert [e["kind"] for e in before] == ["all_reduce", "all_reduce", "broadcast", "gather"]
    assert [e["seq"] for e in before] == [1, 2, 3, 4]
    assert before[1]["count"] == 100_000 and before[1]["dtype"] == "float32"
    assert before[1]["op"] == "sum" and before[1]["algo"] in pyring.config.ALGOS
    assert before[2]["root"] == 1 and all(e["state"] == "completed" for e in before)
    assert all(e["duration_s"] >= 0 and e["start"] > 1e9 for e in before)
    last = after[-1]
    assert last["count"] == 7 and last["state"] in ("failed", "timed out"), last
    assert "rank 1" in last["error"], last
    err = capfd.readouterr().err
    assert "flight recorder of rank 0" in err and "#5 all_reduce count=7" in err, err[-2000:]


def test_flight_recorder_size_is_validated(monkeypatch):
    monkeypatch.setenv("PYRING_FLIGHT_RECORDER", "lots")
    with pytest.raises(ValueError, match="PYRING_FLIGHT_RECORDER"):
        pyring.init(0, 1, set_default=False)


def _mismatch_without_detail(rank, world, store):
    comm = pyring.init(rank, world, store, set_default=False, timeout=TIMEOUT_S)
    try:
        comm.all_reduce(torch.ones(65 if rank == ODD else 64))
        return "no error"
    except pyring.CommError as e:
        return str(e)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_without_detail_every_rank_reports_the_original_cause(transport):
    """Only ODD's ring neighbours see its header; the others learn the cause relayed by the
    ranks that gave up, announced on the point-to-point links."""
    res = run_ranks(WORLD, _mismatch_without_detail, env={"PYRING_TRANSPORT": transport},
                    timeout=120)
    for rank, msg in enumerate(res):
        assert "count=65" in msg and f"rank {ODD}" in msg, (rank, msg)


def _scatter(comm, rank, odd):
    blocks = [torch.ones(4) for _ in range(comm.world_size)] if rank == 0 else None
    comm.scatter(torch.empty(6 if odd else 4), blocks, src=0)


def _gather(comm, rank, odd):
    dst = 1 if odd else 0
    comm.gather(torch.ones(2), [torch.empty(2) for _ in range(3)] if rank == dst else None, dst)


# Calls that differ only where the headers used not to look: a root, a wire, a size the root
# never receives. (what every rank but ODD_3 calls / what ODD_3 calls, a word of the message)
ODD_3 = 2
UNSEEN = {
    "broadcast src": (lambda c, r, odd: c.broadcast(torch.ones(4), src=1 if odd else 0), "src=1"),
    "broadcast size": (lambda c, r, odd: c.broadcast(torch.ones(6 if odd else 4), src=0),
                       "count=6"),
    "reduce dst": (lambda c, r, odd: c.reduce(torch.ones(4), dst=1 if odd else 0), "dst=1"),
    "gather dst": (_gather, "dst=1"),
    "scatter size": (_scatter, "count=24"),
    "wire": (lambda c, r, odd: c.all_reduce(torch.ones(64), wire="fp16" if odd else "bf16"),
             "wire=fp16"),
    "wire against fp32": (lambda c, r, odd: c.all_reduce(torch.ones(64),
                                                         wire="fp32" if odd else "bf16"),
                          "wire=bf16"),
}


def _unseen(rank, world, store, name):
    call, _ = UNSEEN[name]
    comm = pyring.init(rank, world, store, set_default=False, timeout=TIMEOUT_S)
    t0 = time.monotonic()
    try:
        call(comm, rank, rank == ODD_3)
        raised = None
    except pyring.CommError as e:
        raised = str(e)
    took = time.monotonic() - t0
    later = None
    if raised is None:  # a rank whose part was done (a gather's sender): its next call raises
        try:
            comm.barrier()
            later = "no error"
        except pyring.CommError as e:
            later = str(e)
    # No rank leaves (closing its links) before every rank has its error: a rank that died
    # would be reported instead of the cause.
    store.set(f"done/{rank}", "1")
    store.wait([f"done/{r}" for r in range(world)])
    return raised, later, took


@pytest.mark.parametrize("name", list(UNSEEN))
def test_roots_wires_and_sizes_that_differ_raise_at_once(name):
    """A rank naming another root (broadcast, reduce, gather), another wire (or the full
    precision all_reduce against a compressed one), or another size for a root that only
    sends: the odd rank raises CommError naming the difference, well before the deadline, and
    so does every other rank, in that call or (a sender whose part was done) in its next.
    Before, a broadcast's ranks each kept their own data, ranks on different 16-bit wires
    decoded each other's bytes, and a gather to different roots waited out its deadline
    blaming the link."""
    _, word = UNSEEN[name]
    for rank, (raised, later, took) in enumerate(run_ranks(3, _unseen, name, timeout=120)):
        assert took < TIMEOUT_S / 2, (rank, took)
        if rank == ODD_3:
            assert raised is not None and word in raised, (rank, raised)
        assert word in (raised or later), (rank, raised, later)
