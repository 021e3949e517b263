"""The device staging pipeline on the sim device: is an all_reduce of device buffers faster
than its parts run one after another?

A device all_reduce (core/device_queue.h) copies each 4 MiB chunk to pinned host memory on
pyring's stream, exchanges it, and copies it back, chunk k+1 coming in and chunk k-1 going back
while chunk k travels. In one run, interleaved by round, 2 ranks time:
  host     the all_reduce of a host tensor (the exchange alone);
  copies   the copies alone: the buffer to the host and back on the sim stream;
  device   the all_reduce of a sim device buffer (copies and exchange, pipelined);
and report device / (host + copies): below 1 means the copies overlap the exchange. The sim
device's copies are memcpy on a stream thread, so this measures the schedule, not a GPU.

    python bench/staging.py --bytes 64M --rounds 7 --tag vm

Writes bench/results/staging_<tag>.json with the machine's description.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from _results import add_replace_flag, result_path  # noqa: E402
from machine import describe

from pyring import _C
from pyring.config import parse_bytes
from pyring.launch import run_ranks
from pyring.tools.timing import slowest_per_iteration


def _rank(rank, world, store, nbytes, rounds, iters):
    import pyring
    from pyring.testing import sim

    n = nbytes // 4
    comm = pyring.init(rank, world, store, set_default=False)
    host = torch.ones(n)
    pinned = torch.empty(n)
    dev = sim.SimArray(n, torch.float32, 0).fill_(1.0)
    s = sim.current_stream(0)
    s.synchronize()

    def t_host():
        comm.all_reduce(host)

    def t_copies():
        _C.sim_copy(0, pinned.data_ptr(), dev.ptr, nbytes, s.id)
        _C.sim_copy(0, dev.ptr, pinned.data_ptr(), nbytes, s.id)
        s.synchronize()

    def t_device():
        comm.all_reduce(dev)
        s.synchronize()

    out = {"host": [], "copies": [], "device": []}
    for _ in range(rounds):
        for name, fn in (("host", t_host), ("copies", t_copies), ("device", t_device)):
            comm.barrier()
            fn()  # warm-up
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            out[name].append((time.perf_counter() - t0) / iters)
    wrong = int((dev.to_host() != float(world ** (rounds * (iters + 1)))).sum())
    comm.close()
    return out, wrong


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bytes", default="64M")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--tag", default="vm")
    add_replace_flag(p)
    args = p.parse_args()
    nbytes = parse_bytes(args.bytes, "--bytes")
    res = run_ranks(2, _rank, nbytes, args.rounds, args.iters, timeout=1800)
    per = {k: slowest_per_iteration([r[0][k][:args.rounds] for r in res])
           for k in ("host", "copies", "device")}
    med = {k: statistics.median(v) for k, v in per.items()}
    ratio = [d / (h + c) for d, h, c in zip(per["device"], per["host"], per["copies"])]
    doc = {
        "bench": "staging", "command": " ".join(["python", "bench/staging.py", *sys.argv[1:]]),
        "machine": describe(), "bytes": nbytes, "ranks": 2, "rounds": args.rounds,
        "iters": args.iters, "seconds": per, "median_s": med,
        "device_over_sum": ratio, "median_device_over_sum": statistics.median(ratio),
        "wrong": [r[1] for r in res],
    }
    path = result_path(f"staging_{args.tag}", None, args.replace)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"{nbytes >> 20} MiB, 2 ranks, median of {args.rounds} rounds: host "
          f"{med['host'] * 1e3:.1f} ms, copies {med['copies'] * 1e3:.1f} ms, device "
          f"{med['device'] * 1e3:.1f} ms; device / (host + copies) median "
          f"{statistics.median(ratio):.2f}; wrong elements {doc['wrong']}\nwrote {path}")
    return 0 if not any(doc["wrong"]) else 1


if __name__ == "__main__":
    sys.exit(main())
