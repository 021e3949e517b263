#!/usr/bin/env python
"""What moving one step's bf16 gradients over an emulated link costs the cores, with pyring
and with a plain TCP socket, taking turns in the same two ranks (two emulated hosts of one
rank each, bench/overlap.py's setup and model).

Per round, each rank:
- ``pyring``: averages the model's gradients on the bf16 wire, as bench/overlap.py's exchange
  does (buckets of --bucket-mb, every call in flight at once);
- ``socket``: sends the bytes the bf16 ring sends (2 bytes per value each way at 2 ranks) over
  one TCP connection to the other rank while it receives as many, one thread each way, each
  read taking whatever has arrived (the kernel's default buffers and wake-ups).

For each: wall time, and the rank's CPU time split into user and system (getrusage: every
thread of the process, and the network processing the kernel does while one of them runs).
On one machine both hosts' network stacks share the cores with the ranks, so the system time
is what the emulation adds to a step that overlaps its exchange with backward.

    python bench/probes/link_cpu.py [--rate 200mbit] [--rounds 8] [--tag NAME]

Writes bench/results/link_cpu_<rate>_<tag>.json with --replace (else a file of its own under
bench/results/runs/, bench/_results.py), with the machine's description.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from _results import add_replace_flag, result_path  # noqa: E402


def _usage() -> tuple[float, float, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), r.ru_utime, r.ru_stime


def _since(t0: tuple[float, float, float]) -> dict:
    t1 = _usage()
    return {"wall_s": t1[0] - t0[0], "user_s": t1[1] - t0[1], "sys_s": t1[2] - t0[2]}


def _connect(store, rank: int, addr: str) -> socket.socket:
    if rank == 0:
        srv = socket.create_server((addr, 0))
        store.set("link_cpu_port", str(srv.getsockname()[1]))
        s, _ = srv.accept()
        srv.close()
    else:
        s = socket.create_connection((addr, int(store.get("link_cpu_port"))))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _swap(s: socket.socket, out: bytearray, into: bytearray) -> None:
    sender = threading.Thread(target=s.sendall, args=(out,))
    sender.start()
    view, got = memoryview(into), 0
    while got < len(into):
        n = s.recv_into(view[got:], len(into) - got)
        if n == 0:
            raise ConnectionError("the other rank closed the probe's connection")
        got += n
    sender.join()


def _rank(cfg: dict) -> dict:
    import torch
    import torch.distributed as dist

    import pyring
    from pyring.tools.emulate import report
    from pyring.tools.workload import CharGPT

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    addr = os.environ["MASTER_ADDR"]
    store = dist.TCPStore(addr, int(os.environ["MASTER_PORT"]), world, rank == 0,
                          timeout=datetime.timedelta(seconds=600))
    comm = pyring.init(rank=rank, world_size=world, store=store, set_default=False)
    n = sum(p.numel() for p in CharGPT(cfg["dim"], cfg["layers"], 4, cfg["seq"]).parameters())
    per = int(cfg["bucket_mb"] * (1 << 20)) // 4
    bufs = [torch.randn(min(per, n - o)) for o in range(0, n, per)]
    sock = _connect(store, rank, addr)
    out, into = bytearray(2 * n), bytearray(2 * n)
    times: dict = {"pyring": [], "socket": []}
    for r in range(cfg["rounds"] + 1):
        comm.barrier()
        t0 = _usage()
        for w in [comm.all_reduce(b, op="avg", wire="bf16", async_op=True) for b in bufs]:
            w.wait()
        pyring_round = _since(t0)
        comm.barrier()
        t0 = _usage()
        _swap(sock, out, into)
        socket_round = _since(t0)
        if r:  # the first round warms both up
            times["pyring"].append(pyring_round)
            times["socket"].append(socket_round)
    sock.close()
    comm.close()
    report({"values": n, "buckets": len(bufs), "bytes_each_way": 2 * n, "times": times})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", default="200mbit")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--bucket-mb", type=float, default=1.0)
    p.add_argument("--tag", default=socket.gethostname())
    add_replace_flag(p)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return _rank(json.loads(args.worker))
    from machine import describe

    from pyring.tools.emulate import EmulatedHosts

    cfg = {"rounds": args.rounds, "dim": args.dim, "layers": args.layers, "seq": args.seq,
           "bucket_mb": args.bucket_mb}
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(cfg)]
    with EmulatedHosts(hosts=2, rate=args.rate) as hosts:
        ranks = hosts.run(1, argv, timeout=1200)
        link = hosts.link
    summary = {}
    for way in ("pyring", "socket"):
        summary[way] = {k: statistics.median(t[k] for r in ranks for t in r["times"][way])
                        for k in ("wall_s", "user_s", "sys_s")}
        s = summary[way]
        print(f"{way:>7s} @ {args.rate}: wall {s['wall_s'] * 1e3:7.1f} ms  CPU per rank: user "
              f"{s['user_s'] * 1e3:6.1f} ms  system {s['sys_s'] * 1e3:6.1f} ms  "
              f"({ranks[0]['bytes_each_way'] / 1e6:.1f} MB each way)")
    out = result_path(f"link_cpu_{args.rate}_{args.tag}", None, args.replace)
    out.write_text(json.dumps({"machine": describe(), "command": " ".join(["python"] + sys.argv),
                               "link": link, "config": cfg, "summary": summary,
                               "per_rank": ranks}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
