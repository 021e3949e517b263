"""The tcp ceiling of a 2-rank allreduce on this machine, beside pyring and gloo over tcp.

    python bench/loopback.py                      # 64 MiB, 15 rounds
    python bench/loopback.py --bytes 16M --rounds 30
    python bench/loopback.py --variants           # also bench/tcp_streams.c's variants

A 2-rank allreduce of S bytes must move S bytes each way between the ranks (ring or direct
alike). Each round, the same two processes time, one after another: a bare exchange of S bytes
each way on one TCP connection over loopback (a sender thread and a receiving thread per
process, no reduction: the most any allreduce over tcp could do here), pyring's allreduce
(PYRING_TRANSPORT=tcp) and gloo's, in place, float32 sum. Rows are the median over rounds of
the slower rank. With --variants it then builds and runs bench/tcp_streams.c (needs a C
compiler): the same bare exchange over 1, 2 and 4 connections with a thread each, and with
vmsplice + splice sends, rounds taken in turn. Writes bench/results/loopback_<tag>.json with
the machine's description. Each row also gives the cores each rank kept busy in user space and
in the kernel during its timed calls (getrusage, summed over the rounds, every thread of the
process).
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import resource
import socket
import statistics
import sys
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))

CHUNK = 1 << 20


def _bare(sock: socket.socket, out: memoryview, inp: memoryview) -> float:
    n = len(out)
    sock.sendall(b"s")
    sock.recv(1)
    t0 = time.perf_counter()

    def send() -> None:
        for o in range(0, n, CHUNK):
            sock.sendall(out[o:o + CHUNK])

    th = threading.Thread(target=send)
    th.start()
    got = 0
    while got < n:
        got += sock.recv_into(inp[got:], n - got)
    th.join()
    return time.perf_counter() - t0


def _timed(fn: Any, busy: list[float] | None) -> float:
    """fn()'s wall time; adds its (wall, user, system) seconds to `busy` when given."""
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    if busy is not None:
        busy[0] += dt
        busy[1] += r1.ru_utime - r0.ru_utime
        busy[2] += r1.ru_stime - r0.ru_stime
    return dt


def _rank(rank: int, port: int, nbytes: int, rounds: int, q: Any) -> None:
    os.environ["PYRING_TRANSPORT"] = "tcp"
    import torch
    import torch.distributed as dist

    import pyring

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=False,
                          timeout=datetime.timedelta(seconds=60))
    if rank == 0:
        ls = socket.create_server(("127.0.0.1", 0))
        store.set("bare", str(ls.getsockname()[1]))
        sock, _ = ls.accept()
        ls.close()
    else:
        store.wait(["bare"])
        sock = socket.create_connection(("127.0.0.1", int(store.get("bare"))))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    comm = pyring.init(rank, 2, store, set_default=False)
    dist.init_process_group("gloo", store=dist.PrefixStore("gloo", store), rank=rank,
                            world_size=2)
    buf = bytearray(nbytes)
    out, inp = memoryview(buf), memoryview(bytearray(nbytes))
    t = torch.ones(nbytes // 4)
    times: dict[str, list[float]] = {"bare": [], "pyring": [], "gloo": []}
    busy = {name: [0.0, 0.0, 0.0] for name in times}  # wall, user, system seconds
    for r in range(rounds + 1):  # round 0 warms up
        bare = _timed(lambda: _bare(sock, out, inp), busy["bare"] if r else None)
        comm.barrier()
        ours = _timed(lambda: comm.all_reduce(t), busy["pyring"] if r else None)
        dist.barrier()
        gloo = _timed(lambda: dist.all_reduce(t), busy["gloo"] if r else None)
        if r:
            times["bare"].append(bare)
            times["pyring"].append(ours)
            times["gloo"].append(gloo)
    cores = {name: {"user": u / w, "system": k / w} for name, (w, u, k) in busy.items()}
    q.put((rank, {"times": times, "cores": cores}))
    dist.destroy_process_group()
    comm.close()
    sock.close()


def _variants(nbytes: int, rounds: int) -> list[dict]:
    """Builds and runs tcp_streams.c with the same size (whole MiB) and rounds."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "tcp_streams")
        subprocess.run(["cc", "-O2", "-pthread", os.path.join(HERE, "tcp_streams.c"), "-o", exe],
                       check=True)
        out = subprocess.run([exe, str(max(1, nbytes >> 20)), str(min(rounds, 64))], check=True,
                             capture_output=True, text=True, timeout=600).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def main() -> int:
    import torch.distributed as dist
    from machine import describe

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bytes", default="64M")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--tag", default="vm")
    ap.add_argument("--variants", action="store_true",
                    help="also run bench/tcp_streams.c (streams, vmsplice)")
    args = ap.parse_args()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    nbytes = int(args.bytes[:-1]) * scale[args.bytes[-1]] if args.bytes[-1] in scale \
        else int(args.bytes)
    store = dist.TCPStore("127.0.0.1", 0, 3, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, store.port, nbytes, args.rounds, q))
             for r in range(2)]
    for p in procs:
        p.start()
    got = dict(q.get(timeout=600) for _ in range(2))
    for p in procs:
        p.join(timeout=30)
    rows = {}
    for name in ("bare", "pyring", "gloo"):
        slow = [max(a, b) for a, b in zip(got[0]["times"][name], got[1]["times"][name])]
        med = statistics.median(slow)
        rows[name] = {"median_s": med, "algbw_GBps": nbytes / med / 1e9,
                      "min_s": min(slow), "max_s": max(slow),
                      "cores_by_rank": [got[r]["cores"][name] for r in range(2)]}
    print(f"# {nbytes} bytes each way, {args.rounds} rounds, median of the slower rank; "
          "cores each rank kept busy (user + kernel) during its calls")
    for name, row in rows.items():
        cores = ", ".join(f"{c['user']:.2f} + {c['system']:.2f}" for c in row["cores_by_rank"])
        print(f"{name:>7}  {row['median_s'] * 1e3:8.2f} ms  {row['algbw_GBps']:5.2f} GB/s "
              f"(range {row['min_s'] * 1e3:.1f}-{row['max_s'] * 1e3:.1f} ms)  cores {cores}")
    print(f"# pyring vs gloo {rows['gloo']['median_s'] / rows['pyring']['median_s']:.2f}x; "
          f"bare exchange vs gloo {rows['gloo']['median_s'] / rows['bare']['median_s']:.2f}x; "
          f"pyring at {rows['bare']['median_s'] / rows['pyring']['median_s']:.0%} of the bare "
          f"exchange's rate")
    variants = _variants(nbytes, args.rounds) if args.variants else []
    if variants:
        print("# tcp_streams.c, a separate run: compare its variants with each other only")
    for v in variants:
        print(f"{v['variant']:>9} x{v['streams']}  {v['mean_ms']:8.2f} ms mean, "
              f"{v['best_ms']:.2f} best ({variants[0]['mean_ms'] / v['mean_ms']:.2f}x the rate "
              f"of one stream's send/recv)")
    path = os.path.join(HERE, "results", f"loopback_{args.tag}.json")
    with open(path, "w") as fh:
        json.dump({"machine": describe(), "command": " ".join(sys.argv), "bytes": nbytes,
                   "rounds": args.rounds, "rows": rows, "per_rank": got,
                   "variants": variants}, fh, indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
