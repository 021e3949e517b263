"""Barriers and all_reduces back to back, with no barrier between calls, beside Open MPI's in
one job: what a call costs where no barrier before it lines the ranks up (bench/allreduce.py
times each call after its library's barrier, so a barrier that lets the ranks go one by one adds
its spread to the call).

    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 4 \\
        python bench/probes/back_to_back.py --bytes 64K --calls 400 --rounds 3

Rows: pyring's barrier along the ring (a communicator with no symmetric allocation), its
barrier on the symmetric control pages, Open MPI's barrier; the in-place float32 sum all_reduce
of pyring on symmetric tensors, of pyring on private tensors (the slots) and of Open MPI. Each
row takes its turn per round (each round starting one row later); its time is the slowest
rank's wall time over --calls calls, per call, and the median over rounds is printed. The last
all_reduce of every row is checked. Writes bench/results/back_to_back_<tag>.json (or --out;
without --replace, under bench/results/runs/) with the machine's description.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

import pyring
from pyring.config import parse_bytes

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _results import add_replace_flag, result_path  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bytes", default="64K", help="all_reduce size (default 64K)")
    p.add_argument("--calls", type=int, default=400, help="calls per row and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tag", default="vm", help="the JSON's name: back_to_back_<tag>.json")
    p.add_argument("--out", help="the JSON's path instead")
    add_replace_flag(p)
    args = p.parse_args()
    mpi = MPI.COMM_WORLD
    rank, world = mpi.Get_rank(), mpi.Get_size()
    port = None
    if rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = mpi.bcast(port)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=timedelta(seconds=60))
    torch.set_num_threads(1)
    n = parse_bytes(args.bytes, "--bytes") // 4
    ring = pyring.init(rank, world, store, set_default=False)  # never allocates: ring barrier
    sym = pyring.init(rank, world, store, set_default=False)
    st = sym.empty(n)
    private = torch.empty(n)
    a = np.empty(n, dtype=np.float32)
    fills = {"pyring-symmetric": st, "pyring": private, "mpi": torch.from_numpy(a)}
    rows = {
        "barrier: pyring (ring)": ring.barrier,
        "barrier: pyring (flags)": sym.barrier,
        "barrier: mpi": mpi.Barrier,
        "all_reduce: pyring-symmetric": lambda: sym.all_reduce(st),
        "all_reduce: pyring": lambda: sym.all_reduce(private),
        "all_reduce: mpi": lambda: mpi.Allreduce(MPI.IN_PLACE, a),
    }
    names = list(rows)
    got: dict[str, list[float]] = {k: [] for k in names}
    wrong = 0
    for r in range(args.rounds):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            lib = name.split(": ")[1]
            for t in fills.values():
                t.fill_(0.0)  # sums of zeros stay exact however many calls run
            for _ in range(20):
                rows[name]()
            mpi.Barrier()
            t0 = time.perf_counter()
            for _ in range(args.calls):
                rows[name]()
            took = mpi.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            got[name].append(took / args.calls * 1e6)
            if name.startswith("all_reduce"):
                t = fills[lib]
                t.fill_(rank + 1)
                rows[name]()
                wrong += int((t != world * (world + 1) / 2).sum())
    wrong = mpi.allreduce(wrong)
    if rank == 0:
        print(f"# {world} ranks, {args.bytes} float32, {args.calls} calls back to back, "
              f"{args.rounds} rounds: median (min-max) us per call, slowest rank")
        for name in names:
            v = got[name]
            print(f"{name:32} {statistics.median(v):9.1f} ({min(v):.1f}-{max(v):.1f})")
        print(f"# wrong elements: {wrong}")
        from machine import describe

        out = result_path(f"back_to_back_{args.tag}", args.out, args.replace)
        out.write_text(json.dumps({
            "benchmark": "back_to_back", "machine": describe(), "world": world,
            "command": " ".join(["mpirun -np", str(world), "python", *sys.argv]),
            "bytes": n * 4, "calls": args.calls, "rounds": args.rounds,
            "us_per_call": got, "median_us": {k: statistics.median(v) for k, v in got.items()},
            "wrong": wrong}, indent=1))
        print(f"# json: {out}")
    ring.close()
    sym.close()
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
