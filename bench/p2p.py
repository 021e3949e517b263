"""Point-to-point and all-to-all through torch.distributed: the pyring backend beside gloo,
in one run, rounds alternating between the two.

    python bench/p2p.py [--rounds 5] [--out bench/results/p2p_vm.json]

Measures, per backend and round:
- send/recv ping-pong between ranks 0 and 1 of a 2-rank job, 4 KiB: one-way time (µs, the
  median over chunks of PINGPONG_CHUNK round trips),
  through torch.distributed and, for pyring, also through its own Communicator (the process
  group's ``comm``, same links);
- all_to_all_single in a 4-rank job, 1 MiB per rank pair: time per call (ms); for pyring
  also with single-copy blocks off (PYRING_SINGLE_COPY_BYTES=0).
Each job checks every received element. A third job measures what one send or recv call
costs through torch.distributed's layers with a Python backend that moves nothing: the
floor any Python backend (pyring's included) pays per call. Targets: send/recv at least 20x
faster than gloo; all_to_all_single at least as fast as gloo (medians over rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from _results import add_replace_flag, result_path  # noqa: E402
from machine import describe  # noqa: E402

PINGPONG_BYTES = 4096
# Round trips per timed chunk; a job reports its median chunk, so that a rare stall of the
# shared VM or of Python (a full garbage collection) does not stand for the typical call.
PINGPONG_CHUNK = 100
A2A_PAIR_BYTES = 1 << 20


def _pingpong(rank: int, iters: int, api: str) -> float:
    """One-way time of a ping-pong through torch.distributed, or (api 'comm') through the
    pyring Communicator under the pyring process group."""
    t = torch.full((PINGPONG_BYTES // 4,), float(rank))
    peer = 1 - rank
    if api == "comm":
        comm = dist.group.WORLD.comm
        send, recv = comm.send, comm.recv
    else:
        send, recv = dist.send, dist.recv
    for _ in range(iters // 10 + 10):  # warm-up
        if rank == 0:
            send(t, peer)
            recv(t, peer)
        else:
            recv(t, peer)
            send(t, peer)
    # Rank 1 adds one to what it receives and sends it back: after the loop every element on
    # rank 0 equals the number of round trips, which checks every message's every element.
    t.zero_()
    dist.barrier()
    chunks = []
    for _ in range(0, iters, PINGPONG_CHUNK):
        t0 = time.perf_counter()
        for _ in range(PINGPONG_CHUNK):
            if rank == 0:
                send(t, peer)
                recv(t, peer)
            else:
                recv(t, peer)
                t.add_(1.0)
                send(t, peer)
        chunks.append((time.perf_counter() - t0) / PINGPONG_CHUNK / 2 * 1e6)
    if rank == 0:
        want = float(len(chunks) * PINGPONG_CHUNK)
        assert torch.equal(t, torch.full_like(t, want)), "ping-pong data wrong"
    return statistics.median(chunks)


def _register_null() -> None:
    """A Python backend whose send and recv complete at once without moving a byte: what
    torch.distributed's layers and the C++-to-Python trampoline cost per call."""
    from pyring.c10d.backend import PyringWork

    class NullGroup(dist.ProcessGroup):
        def getBackendName(self) -> str:
            return "null"

        def send(self, tensors, dst, tag):  # noqa: ANN001, ANN201
            return PyringWork(None, list(tensors))

        recv = send

    if "null" not in dist.Backend.backend_list:
        dist.Backend.register_backend("null", lambda s, r, n, t: NullGroup(r, n), devices=["cpu"])


def _null_calls(rank: int, iters: int) -> float:
    t = torch.zeros(PINGPONG_BYTES // 4)
    peer = 1 - rank
    for _ in range(iters // 10):
        dist.send(t, peer)
    chunks = []
    for _ in range(0, iters, PINGPONG_CHUNK):
        t0 = time.perf_counter()
        for _ in range(PINGPONG_CHUNK):
            dist.send(t, peer)
            dist.recv(t, peer)
        chunks.append((time.perf_counter() - t0) / PINGPONG_CHUNK / 2 * 1e6)
    return statistics.median(chunks)


def _a2a(rank: int, world: int, iters: int) -> float:
    n = A2A_PAIR_BYTES // 4
    inp = torch.arange(world * n, dtype=torch.float32) + rank * world * n
    out = torch.empty_like(inp)
    for _ in range(3):
        dist.all_to_all_single(out, inp)
    want = torch.cat([torch.arange(n, dtype=torch.float32) + j * world * n + rank * n
                      for j in range(world)])
    assert torch.equal(out, want), "all_to_all_single data wrong"
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_to_all_single(out, inp)
    took = (time.perf_counter() - t0) / iters * 1e3
    dist.barrier()
    return took


def _worker(rank: int, world: int, store, backend: str, what: str, iters: int) -> Any:
    import pyring  # noqa: F401  registers the backend

    if backend == "null":
        _register_null()
        dist.init_process_group(backend, store=store, rank=rank, world_size=world)
        return _null_calls(rank, iters)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world)
    if what == "pingpong":
        apis = ("dist", "comm") if backend == "pyring" else ("dist",)
        r = [_pingpong(rank, iters, api) for api in apis]
    else:
        r = [_a2a(rank, world, iters)]
    # The slowest rank's time is the job's.
    t = torch.tensor(r, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    dist.destroy_process_group()
    return t.tolist()


def run_job(backend: str, what: str, world: int, iters: int) -> Any:
    """Rank 0's figures of one job (pyring.launch's ranks; a failed rank raises RankFailure)."""
    from pyring.launch import run_ranks

    return run_ranks(world, _worker, backend, what, iters, timeout=300)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pingpong-iters", type=int, default=2000)
    ap.add_argument("--a2a-iters", type=int, default=30)
    ap.add_argument("--out", default=None,
                    help="JSON path (default: see --replace)")
    add_replace_flag(ap)
    args = ap.parse_args()
    args.out = str(result_path("p2p_vm", args.out, args.replace))
    rows: dict[str, dict[str, list[float]]] = {
        b: {"send_recv_4KiB_oneway_us": [], "all_to_all_single_4ranks_1MiB_pair_ms": []}
        for b in ("pyring", "gloo")}
    rows["pyring"]["send_recv_4KiB_oneway_us_pyring_api"] = []
    rows["pyring"]["all_to_all_single_4ranks_1MiB_pair_ms_no_single_copy"] = []
    for rnd in range(args.rounds):
        for b in ("pyring", "gloo") if rnd % 2 == 0 else ("gloo", "pyring"):
            pp = run_job(b, "pingpong", 2, args.pingpong_iters)
            rows[b]["send_recv_4KiB_oneway_us"].append(pp[0])
            if b == "pyring":
                rows[b]["send_recv_4KiB_oneway_us_pyring_api"].append(pp[1])
            rows[b]["all_to_all_single_4ranks_1MiB_pair_ms"].append(
                run_job(b, "a2a", 4, args.a2a_iters)[0])
            if b == "pyring":  # the blocks through the shared segment instead
                os.environ["PYRING_SINGLE_COPY_BYTES"] = "0"
                try:
                    rows[b]["all_to_all_single_4ranks_1MiB_pair_ms_no_single_copy"].append(
                        run_job(b, "a2a", 4, args.a2a_iters)[0])
                finally:
                    del os.environ["PYRING_SINGLE_COPY_BYTES"]
            print(f"round {rnd} {b}: " + ", ".join(f"{k}={v[-1]:.2f}"
                                                     for k, v in rows[b].items()), flush=True)
    floor = [run_job("null", "calls", 2, args.pingpong_iters) for _ in range(args.rounds)]
    med = {b: {k: statistics.median(v) for k, v in r.items()} for b, r in rows.items()}
    med["torch_python_backend_floor_us_per_call"] = statistics.median(floor)
    gloo_pp = med["gloo"]["send_recv_4KiB_oneway_us"]
    ratios = {
        "send_recv_speedup_over_gloo": gloo_pp / med["pyring"]["send_recv_4KiB_oneway_us"],
        "send_recv_speedup_over_gloo_pyring_api":
            gloo_pp / med["pyring"]["send_recv_4KiB_oneway_us_pyring_api"],
        "all_to_all_single_speedup_over_gloo":
            med["gloo"]["all_to_all_single_4ranks_1MiB_pair_ms"]
            / med["pyring"]["all_to_all_single_4ranks_1MiB_pair_ms"],
        "all_to_all_single_speedup_over_gloo_no_single_copy":
            med["gloo"]["all_to_all_single_4ranks_1MiB_pair_ms"]
            / med["pyring"]["all_to_all_single_4ranks_1MiB_pair_ms_no_single_copy"],
    }
    targets = {"send_recv_speedup_over_gloo >= 20": ratios["send_recv_speedup_over_gloo"] >= 20,
               "send_recv_speedup_over_gloo_pyring_api >= 20":
                   ratios["send_recv_speedup_over_gloo_pyring_api"] >= 20,
               "all_to_all_single_speedup_over_gloo >= 1":
                   ratios["all_to_all_single_speedup_over_gloo"] >= 1}
    rows["torch_python_backend_floor_us_per_call"] = floor
    result = {"machine": describe(), "command": " ".join(sys.argv), "rounds": rows,
              "medians": med, "ratios": ratios, "targets_met": targets}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({"medians": med, "ratios": ratios, "targets_met": targets}, indent=1))


if __name__ == "__main__":
    main()
