#!/usr/bin/env python
"""pyring's allreduce algorithms side by side on local ranks: auto against every forced one.

    python bench/algos.py [--world 2] [--min-bytes 4K] [--max-bytes 64M] [--topology flat]
                          [--seconds 1.5] [--tag vm]

For each size the ranks run the algorithms interleaved, in a fresh order each round, one timed
in-place float32 sum allreduce each, after an untimed barrier, so that every algorithm sees the
same seconds of a shared machine. A row's time per algorithm is the median
over iterations of the slowest rank's time. The check: auto within 5% of the best forced
algorithm at every size (column auto/best). Writes bench/results/algos_<tag>_w<W>.json with the
machine's description.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import random
import statistics
import sys
import time
from pathlib import Path

import machine

ALGOS = ("auto", "ring", "direct", "tree")
RESULTS = Path(__file__).resolve().parent / "results"


def parse_bytes(text: str) -> int:
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(t[-1:], 1)
    return int(t[:-1] if scale > 1 else t) * scale


def _rank(rank: int, world: int, port: int, args: dict, sizes: list[int], out: mp.Queue) -> None:
    import torch
    import torch.distributed as dist

    import pyring

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, False,
                          timeout=datetime.timedelta(seconds=120))
    comm = pyring.init(rank, world, store, topology=args["topology"])
    rows = []
    for nbytes in sizes:
        x = torch.ones(nbytes // 4)
        budget = args["seconds"]
        times: dict[str, list[float]] = {a: [] for a in ALGOS}
        wrong = 0
        comm.all_reduce(x, algo="ring")  # warm-up: pages touched, scratch sized
        start = time.perf_counter()
        iters = 0
        while True:
            # A fresh order each round (the same on every rank), so that no algorithm always
            # runs after the one that evicts the caches (direct's gathered copies).
            order = list(ALGOS)
            random.Random(iters).shuffle(order)
            for algo in order:
                x.fill_(1.0)
                comm.barrier()
                t0 = time.perf_counter()
                comm.all_reduce(x, algo=algo)
                times[algo].append(time.perf_counter() - t0)
                wrong += int((x != world).sum())
            iters += 1
            # Rank 0's clock decides for every rank when the size is done.
            more = iters < 5 or (time.perf_counter() - start < budget and iters < 2000)
            flag = torch.tensor([1.0 if more else 0.0])
            comm.broadcast(flag, src=0)
            if flag.item() == 0.0:
                break
        rows.append({"size": nbytes, "times": times, "wrong": wrong})
    out.put((rank, rows, comm.stats()["calls"]))
    pyring.destroy()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--min-bytes", type=parse_bytes, default=4 << 10)
    p.add_argument("--max-bytes", type=parse_bytes, default=64 << 20)
    p.add_argument("--topology", default="flat")
    p.add_argument("--seconds", type=float, default=1.5, help="per size (default 1.5)")
    p.add_argument("--tag", default="vm")
    args = p.parse_args()
    sizes, s = [], args.min_bytes
    while s <= args.max_bytes:
        sizes.append(s)
        s *= 4
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, args.world + 1, True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    cfg = {"topology": args.topology, "seconds": args.seconds}
    procs = [ctx.Process(target=_rank, args=(r, args.world, store.port, cfg, sizes, q))
             for r in range(args.world)]
    for proc in procs:
        proc.start()
    got = {}
    for _ in procs:
        rank, rows, calls = q.get(timeout=3600)
        got[rank] = (rows, calls)
    for proc in procs:
        proc.join()
    print(f"# W={args.world} topology={args.topology}: median of the slowest rank, us")
    print(f"{'size':>10} " + " ".join(f"{a:>9}" for a in ALGOS) + "  auto/best  #wrong  iters")
    table, worst = [], 0.0
    for i, size in enumerate(sizes):
        per_algo = {}
        for a in ALGOS:
            per_iter = zip(*(got[r][0][i]["times"][a] for r in range(args.world)))
            per_algo[a] = statistics.median(max(t) for t in per_iter) * 1e6
        best = min(per_algo[a] for a in ALGOS[1:])
        ratio = per_algo["auto"] / best
        worst = max(worst, ratio)
        wrong = sum(got[r][0][i]["wrong"] for r in range(args.world))
        iters = len(got[0][0][i]["times"]["auto"])
        print(f"{size:>10} " + " ".join(f"{per_algo[a]:>9.1f}" for a in ALGOS)
              + f"  {ratio:>9.3f}  {wrong:>6}  {iters:>5}")
        table.append({"size": size, "time_us": per_algo, "auto_over_best": ratio,
                      "wrong": wrong, "iters": iters})
    print(f"# worst auto/best: {worst:.3f} (target <= 1.05)")
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"algos_{args.tag}_w{args.world}.json"
    path.write_text(json.dumps({
        "benchmark": "algos", "command": " ".join(sys.argv), "args": vars(args),
        "machine": machine.describe(), "rows": table, "worst_auto_over_best": worst,
        "calls_rank0": got[0][1],
    }, indent=1))
    print(f"# wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
