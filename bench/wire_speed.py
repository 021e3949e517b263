"""The compressed wires against the float32 allreduce, interleaved in one run: 2 ranks, one
buffer of float32, op avg, each call followed by nothing else (the time is the slowest rank's).

    python bench/wire_speed.py [--where shm|1gbit|...] [--bytes 64M] [--rounds 5] [--tag NAME]

``--where shm``: both ranks on this host (shared memory). ``--where RATE`` (``1gbit``,
``10gbit``): two emulated hosts of one rank each, joined by a link shaped to RATE
(pyring/tools/emulate.py; needs root). In every round each wire of the codec registry
(pyring.optim.compression.WIRES) runs once, in a rotating order.
Targets (issue 26): on shm, onebit <= 1.5x the fp32 time; over 1 Gbit, onebit >= 12x and
bf16 >= 1.8x faster than fp32. Writes bench/results/wire_speed_<where>_<tag>.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys
import time
from pathlib import Path

from _results import add_replace_flag, result_path  # noqa: E402
from machine import describe  # noqa: E402

from pyring.optim.compression import FEEDBACK_WIRES, WIRES  # the codec registry
from pyring.tools.timing import slowest_median


def _rank(rank: int, world: int, store, nbytes: int, rounds: int) -> dict:
    import torch

    import pyring

    torch.set_num_threads(1)  # one core per rank, as torchrun and the other benchmarks leave it
    comm = pyring.init(rank, world, store, set_default=False)
    n = nbytes // 4
    base = torch.randn(n, generator=torch.Generator().manual_seed(rank))
    x = base.clone()
    states = {w: pyring.OneBitState() for w in FEEDBACK_WIRES}
    times = {w: [] for w in WIRES}
    for r in range(rounds + 1):  # round 0 warms up
        for k in range(len(WIRES)):
            wire = WIRES[(r + k) % len(WIRES)]
            x.copy_(base)
            comm.barrier()
            t0 = time.perf_counter()
            comm.all_reduce(x, op="avg", wire=wire, state=states.get(wire))
            if r:
                times[wire].append(time.perf_counter() - t0)
    comm.close()
    return times


def _worker_main(cfg: dict) -> None:
    import torch.distributed as dist

    from pyring.tools.emulate import report

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          rank == 0, timeout=datetime.timedelta(seconds=300))
    report(_rank(rank, world, store, cfg["bytes"], cfg["rounds"]))


def _local(nbytes: int, rounds: int) -> list[dict]:
    from pyring.launch import run_ranks

    return run_ranks(2, _rank, nbytes, rounds, timeout=1800)


def _hosts(rate: str, nbytes: int, rounds: int) -> tuple[list[dict], dict]:
    from pyring.tools.emulate import EmulatedHosts

    argv = [sys.executable, str(Path(__file__).resolve()), "--worker",
            json.dumps({"bytes": nbytes, "rounds": rounds})]
    with EmulatedHosts(hosts=2, rate=rate) as hosts:
        return hosts.run(1, argv, timeout=1800), hosts.link


def main() -> None:
    from pyring.config import parse_bytes

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--where", default="shm", help="shm, or a link rate such as 1gbit")
    p.add_argument("--bytes", type=lambda s: parse_bytes(s, "--bytes"), default=64 << 20)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tag", default=socket.gethostname())
    p.add_argument("--worker", help=argparse.SUPPRESS)
    add_replace_flag(p)
    args = p.parse_args()
    if args.worker:
        return _worker_main(json.loads(args.worker))
    link = None
    if args.where == "shm":
        ranks = _local(args.bytes, args.rounds)
    else:
        ranks, link = _hosts(args.where, args.bytes, args.rounds)
    med = {}
    for w in WIRES:
        med[w] = slowest_median([r[w][:args.rounds] for r in ranks])
    ratios = {f"fp32_over_{w}": med["fp32"] / med[w] for w in WIRES if w != "fp32"}
    for w in WIRES:
        print(f"{args.where:>6s} {args.bytes >> 20} MiB {w:>6s}: {med[w] * 1e3:9.2f} ms"
              + ("" if w == "fp32" else f"   fp32/{w} {med['fp32'] / med[w]:6.2f}x"))
    targets = ({"onebit <= 1.5x fp32": med["onebit"] <= 1.5 * med["fp32"]}
               if args.where == "shm" else
               {"onebit >= 12x faster": ratios["fp32_over_onebit"] >= 12,
                "bf16 >= 1.8x faster": ratios["fp32_over_bf16"] >= 1.8})
    print(json.dumps(targets, indent=1))
    out = result_path(f"wire_speed_{args.where}_{args.tag}", None, args.replace)
    out.write_text(json.dumps({
        "machine": describe(), "command": " ".join(["python"] + sys.argv), "where": args.where,
        "link": link, "bytes": args.bytes, "rounds": args.rounds, "median_s": med,
        "ratios": ratios, "targets": targets,
        "per_rank_s": ranks}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
