#!/usr/bin/env python
"""The allreduce hot paths of two builds, taking turns in one run: did a change slow them?

    python bench/ab.py --refs d05c814,HEAD                      # 4K, 1M, 64M; ~4 minutes
    python bench/ab.py --refs HEAD~1,HEAD --sizes 4K --rounds 10

Each git ref is built Release (bench/_build.py) into build/ab/<sha>/, beside a copy of its
package; a finished build is reused. Per round, every build runs one job of 2 fresh ranks
(pyring.init() from the environment, as under torchrun, PYTHONPATH on that build's package;
torch and the rest from this interpreter), in an order that alternates round by round (A B, B A,
...) so that the machine's drift falls on both. A job times, per size, --iters in-place float32
sum all_reduce calls after --warmup, each rank every call; the figure is the median over calls
of the slowest rank's time (pyring/tools/timing.py). Per size the report gives each build's
median over rounds and the median over rounds of the per-round ratio B / A (> 1: B slower), the
ratio's spread, and whether it is within --limit. Writes bench/results/ab_<tag>.json with
--replace, else a file of its own under bench/results/runs/ (bench/_results.py).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from _build import build, check_needs  # noqa: E402
from _results import add_replace_flag, result_path  # noqa: E402
from machine import describe  # noqa: E402

from pyring.config import parse_bytes  # noqa: E402
from pyring.tools.timing import slowest_median  # noqa: E402

# The rank's loop, run with the build's package first on the path: only calls every build has.
RANK = r"""
import json, sys, time, torch, pyring
torch.set_num_threads(1)
cfg = json.loads(sys.argv[1])
comm = pyring.init()
out = []
for nbytes, iters in zip(cfg["sizes"], cfg["iters"]):
    t = torch.ones(nbytes // 4)
    for _ in range(cfg["warmup"]):
        pyring.all_reduce(t)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        pyring.all_reduce(t)
        times.append(time.perf_counter() - t0)
    out.append(times)
print("AB " + json.dumps({"file": pyring.__file__, "times": out}), flush=True)
pyring.destroy()
"""


def _iters(nbytes: int, scale: float) -> int:
    """Calls per size: about 0.3 s of a 2 GB/s allreduce, between 10 and 3000."""
    return max(10, min(3000, int(scale * 0.3 / (2e-6 + nbytes / 2e9))))


def _job(pkg: Path, cfg: dict, timeout: float) -> list[list[list[float]]]:
    """One job of 2 ranks on `pkg`; per rank, per size, the call times."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   PYTHONPATH=str(pkg))
        procs.append(subprocess.Popen([sys.executable, "-c", RANK, json.dumps(cfg)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, cwd="/"))
    results = []
    for rank, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            sys.exit(f"ab.py: rank {rank} on {pkg} gave no result within {timeout:g} s")
        line = next((x for x in out.splitlines() if x.startswith("AB ")), None)
        if p.returncode != 0 or line is None:
            sys.exit(f"ab.py: rank {rank} on {pkg} failed (exit {p.returncode}):\n{err[-2000:]}")
        doc = json.loads(line[3:])
        if not doc["file"].startswith(str(pkg)):
            sys.exit(f"ab.py: rank {rank} loaded pyring from {doc['file']}, not from {pkg}")
        results.append(doc["times"])
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--refs", required=True, metavar="A,B", help="two git refs: before, after")
    p.add_argument("--sizes", default="4K,1M,64M")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--scale", type=float, default=1.0, help="multiplies every size's calls")
    p.add_argument("--limit", type=float, default=1.05, help="the slowdown B / A allowed")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per job")
    p.add_argument("--tag", default=socket.gethostname())
    add_replace_flag(p)
    args = p.parse_args()
    refs = args.refs.split(",")
    if len(refs) != 2:
        p.error(f"--refs: two git refs, comma-separated, got {args.refs!r}")
    sizes = [parse_bytes(s, "--sizes") for s in args.sizes.split(",")]
    if any(s <= 0 or s % 4 for s in sizes):
        p.error(f"--sizes: positive multiples of 4 bytes, got {args.sizes!r}")
    check_needs("bench/ab.py")
    pkgs = [build(r, BENCH.parent / "build" / "ab", build_type="Release") for r in refs]
    cfg = {"sizes": sizes, "iters": [_iters(s, args.scale) for s in sizes],
           "warmup": args.warmup}
    medians: list[list[list[float]]] = [[[] for _ in sizes] for _ in refs]  # [ref][size][round]
    for r in range(args.rounds):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        for i in order:
            ranks = _job(pkgs[i], cfg, args.timeout)
            for k in range(len(sizes)):
                medians[i][k].append(slowest_median([rank[k] for rank in ranks]))
        print(f"# round {r + 1}/{args.rounds}: " + ", ".join(
            f"{args.sizes.split(',')[k]} {medians[1][k][-1] / medians[0][k][-1]:.3f}"
            for k in range(len(sizes))), flush=True)
    report = []
    print(f"# B / A per round (> 1: {refs[1]} slower than {refs[0]}), median over "
          f"{args.rounds} rounds of the slowest rank's median call")
    print(f"{'size':>10s} {refs[0]:>12s} us {refs[1]:>12s} us   B/A  [min, max]  within")
    for k, nbytes in enumerate(sizes):
        ratios = [b / a for a, b in zip(medians[0][k], medians[1][k])]
        row = {"bytes": nbytes, "iters": cfg["iters"][k],
               "a_us": statistics.median(medians[0][k]) * 1e6,
               "b_us": statistics.median(medians[1][k]) * 1e6,
               "ratio": statistics.median(ratios), "ratio_min": min(ratios),
               "ratio_max": max(ratios), "per_round_a_s": medians[0][k],
               "per_round_b_s": medians[1][k]}
        row["within_limit"] = row["ratio"] <= args.limit
        report.append(row)
        print(f"{nbytes:>10d} {row['a_us']:>15.2f} {row['b_us']:>15.2f} {row['ratio']:6.3f} "
              f"[{row['ratio_min']:.3f}, {row['ratio_max']:.3f}]  {row['within_limit']}")
    out = result_path(f"ab_{args.tag}", None, args.replace)
    out.write_text(json.dumps({"benchmark": "ab", "machine": describe(),
                               "command": " ".join(["python"] + sys.argv), "refs": refs,
                               "limit": args.limit, "rounds": args.rounds, "sizes": report},
                              indent=1))
    print(f"# wrote {out}")
    return 0 if all(r["within_limit"] for r in report) else 1


if __name__ == "__main__":
    sys.exit(main())
