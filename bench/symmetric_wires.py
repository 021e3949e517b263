"""Compressed wires on symmetric tensors: does the codec's schedule over the links (what a
bf16 or one-bit all_reduce of a pyring.empty tensor runs) beat the uncompressed fp32
all_reduce that the same tensor would run zero-copy? Both in one job, taking turns.

    python bench/symmetric_wires.py                       # 2 ranks, 1 MiB and 16 MiB
    python bench/symmetric_wires.py --replace             # bench/results/symmetric_wires_vm.json

Rows: fp32 on a private tensor (the slots), fp32 on a symmetric one (zero-copy), and bf16 and
onebit on a symmetric one (their codecs over the links, as placed). Time: median over rounds
of the slowest rank's median call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from _results import add_replace_flag, result_path
from machine import describe

METHODS = ("fp32-private", "fp32-symmetric", "bf16-symmetric", "onebit-symmetric")


def rank_body(rank: int, world: int, store: Any, sizes: list[int], rounds: int,
              iters: int) -> dict[str, dict[str, list[float]]]:
    import torch

    import pyring
    from pyring.optim.compression import OneBitState, all_reduce_wire

    comm = pyring.init(rank, world, store, set_default=False)
    out: dict[str, dict[str, list[float]]] = {}
    for nbytes in sizes:
        n = nbytes // 4
        private = torch.ones(n)
        sym = comm.empty(n).fill_(1.0)
        state = OneBitState()
        calls = {
            "fp32-private": lambda p=private: comm.all_reduce(p, op="avg"),
            "fp32-symmetric": lambda s=sym: comm.all_reduce(s, op="avg"),
            "bf16-symmetric": lambda s=sym: all_reduce_wire(comm, s, "avg", "bf16"),
            "onebit-symmetric": lambda s=sym, st=state: all_reduce_wire(comm, s, "avg", "onebit",
                                                                        st),
        }
        times: dict[str, list[float]] = {m: [] for m in METHODS}
        for _ in range(rounds):
            for m in METHODS:
                calls[m]()  # warm
                comm.barrier()
                ts = []
                for _ in range(iters):
                    t0 = time.perf_counter()
                    calls[m]()
                    ts.append(time.perf_counter() - t0)
                times[m].append(statistics.median(ts))
        out[str(nbytes)] = times
    zc = comm.stats()["zero_copy"]
    comm.close()
    return {"times": out, "zero_copy_calls": zc["calls"] + zc["slot_schedule"]}


def main() -> None:
    from pyring.launch import run_ranks

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--sizes", default="1M,16M")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out")
    add_replace_flag(ap)
    args = ap.parse_args()
    units = {"K": 1 << 10, "M": 1 << 20}
    sizes = [int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)
             for s in args.sizes.split(",")]
    ranks = run_ranks(args.world, rank_body, sizes, args.rounds, args.iters, timeout=1200)
    rows = {}
    print(f"# {args.world} ranks, all_reduce avg; us = median over rounds of the slowest rank")
    print(f"{'size':>10} " + " ".join(f"{m:>18}" for m in METHODS))
    for nbytes in sizes:
        row = {}
        for m in METHODS:
            per_round = [max(r["times"][str(nbytes)][m][k] for r in ranks)
                         for k in range(args.rounds)]
            row[m] = statistics.median(per_round) * 1e6
        rows[nbytes] = row
        print(f"{nbytes:>10} " + " ".join(f"{row[m]:>18.1f}" for m in METHODS))
    path = result_path("symmetric_wires_vm", args.out, args.replace)
    path.write_text(json.dumps({
        "benchmark": "symmetric_wires", "command": ["python", "bench/symmetric_wires.py",
                                                     *__import__("sys").argv[1:]],
        "machine": describe(), "world": args.world, "rounds": args.rounds,
        "iters": args.iters, "us": {str(k): v for k, v in rows.items()},
        "zero_copy_calls": [r["zero_copy_calls"] for r in ranks]}, indent=1))
    print(f"# json: {path}")


if __name__ == "__main__":
    main()
