#!/usr/bin/env python
"""Communicators created and destroyed in one process, as an elastic job restarts: do memory,
file descriptors, threads or /dev/shm entries grow?

    python bench/leaks.py                      # 2 ranks, 1000 communicators each
    python bench/leaks.py --count 100 --transport tcp

Each of 2 ranks (pyring.launch) creates a communicator on the job's store, runs one allreduce
of --bytes and destroys it, --count times. After --warmup rounds (allocator pools, torch's
first calls) it records its resident memory (/proc/self/statm), open file descriptors
(/proc/self/fd), threads (/proc/self/task) and the job's pyring entries in /dev/shm; then again
at the end. Target: each returns to within 1% of its value after the warm-up (memory: 1% or
256 KiB, whichever is larger), and no /dev/shm entry is left. Writes
bench/results/leaks_<tag>.json with the machine's description; exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from _results import add_replace_flag, result_path  # noqa: E402
from machine import describe

from pyring.launch import run_ranks


def rss_bytes() -> int:
    """This process's resident bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def settled_threads(limit_s: float = 2.0) -> int:
    """This process's threads once the count has held for 50 ms (at most `limit_s`): a Python
    thread that was joined leaves /proc/self/task a moment after the join returns."""
    def count() -> int:
        return len(os.listdir("/proc/self/task"))
    deadline = time.monotonic() + limit_s
    n, held = count(), 0
    while held < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
        m = count()
        held, n = (held + 1 if m == n else 0), m
    return n


def snapshot() -> dict[str, int]:
    """This process's resident bytes, open descriptors and settled threads, and pyring's
    /dev/shm entries (every job's: the test runs alone)."""
    threads = settled_threads()
    rss = rss_bytes()
    shm = [n for n in os.listdir("/dev/shm") if n.startswith("pyring-")] \
        if os.path.isdir("/dev/shm") else []
    return {"rss_bytes": rss, "fds": len(os.listdir("/proc/self/fd")),
            "threads": threads, "shm_entries": len(shm)}


def _rank(rank: int, world: int, store: Any, count: int, warmup: int, nbytes: int,
          transport: str | None) -> dict[str, Any]:
    import torch

    import pyring

    if transport:
        os.environ["PYRING_TRANSPORT"] = transport
    torch.set_num_threads(1)
    t = torch.ones(nbytes // 4)
    marks = {}
    wrong = 0
    for i in range(count):
        if i == warmup:
            marks["after_warmup"] = snapshot()
        comm = pyring.init(rank, world, store, set_default=False)
        t.fill_(1.0)
        comm.all_reduce(t)
        wrong += int((t != world).sum())
        comm.close()
        del comm
    marks["end"] = snapshot()
    return {**marks, "results_right": wrong == 0}


def judge(start: dict[str, int], end: dict[str, int]) -> dict[str, bool]:
    return {"rss": end["rss_bytes"] <= max(start["rss_bytes"] * 1.01,
                                           start["rss_bytes"] + (256 << 10)),
            "fds": end["fds"] <= start["fds"] * 1.01,
            "threads": end["threads"] <= start["threads"] * 1.01,
            "shm": end["shm_entries"] == 0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--bytes", type=int, default=64 << 10)
    ap.add_argument("--transport", choices=("shm", "tcp"))
    ap.add_argument("--tag", default="vm")
    ap.add_argument("--out", default=None)
    add_replace_flag(ap)
    args = ap.parse_args()
    if not 0 < args.warmup < args.count:
        ap.error("--warmup must be between 0 and --count")
    ranks = run_ranks(2, _rank, args.count, args.warmup, args.bytes, args.transport,
                      timeout=max(120.0, args.count * 2.0))
    verdicts = [judge(r["after_warmup"], r["end"]) for r in ranks]
    left = snapshot()["shm_entries"]
    passed = all(all(v.values()) for v in verdicts) and all(r["results_right"] for r in ranks) \
        and left == 0
    for r, (rec, v) in enumerate(zip(ranks, verdicts)):
        a, b = rec["after_warmup"], rec["end"]
        print(f"rank {r}: rss {a['rss_bytes'] / 2**20:.2f} -> {b['rss_bytes'] / 2**20:.2f} MiB, "
              f"fds {a['fds']} -> {b['fds']}, threads {a['threads']} -> {b['threads']}, "
              f"/dev/shm {a['shm_entries']} -> {b['shm_entries']}  "
              + ("ok" if all(v.values()) else f"MISSED {[k for k, ok in v.items() if not ok]}"))
    print(f"# {args.count} communicators per rank ({args.transport or 'shm'}); /dev/shm entries "
          f"after the job: {left}; {'all targets met' if passed else 'a target was missed'}")
    out = result_path(f"leaks_{args.tag}", args.out, args.replace)
    out.write_text(json.dumps({"benchmark": "leaks", "machine": describe(),
                               "command": ["python", "bench/leaks.py", *sys.argv[1:]],
                               "count": args.count, "warmup": args.warmup, "bytes": args.bytes,
                               "transport": args.transport or "auto", "ranks": ranks,
                               "verdicts": verdicts, "shm_left_after_job": left,
                               "passed": passed}, indent=1) + "\n")
    print(f"# json: {out}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
