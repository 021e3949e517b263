#!/usr/bin/env python
"""PYRING_AFFINITY=auto against off, side by side: the small-message latency of 2 unpinned
ranks (as torchrun leaves them) run after run, under a background load, and the main job's
step time.

    python bench/affinity.py [--load cpu] [--runs 8] [--bytes 4K] [--train-rounds 2]

Each run spawns 2 fresh ranks once per setting, the settings taking turns going first; a rank
times --iters in-place float32 sum allreduces of --bytes in 5 blocks (a barrier before each
block) and reports its median; a run's figure is the slower rank's. Then examples/train.py
(DistributedOptimizer, 2 ranks) runs --train-steps steps per setting, --train-rounds times,
taking turns: its median step time per round. The load (bench/busy.py) runs through both
parts. Writes bench/results/affinity_<load>_<tag>.json with the machine's description.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _results import add_replace_flag, result_path

BENCH = Path(__file__).resolve().parent

SETTINGS = ("auto", "off")


def _latency_rank(rank: int, world: int, store: Any, nbytes: int, iters: int) -> list[float]:
    import torch

    import pyring

    comm = pyring.init(rank, world, store, set_default=False)
    x = torch.ones(nbytes // 4)
    for _ in range(iters // 2):
        comm.all_reduce(x)
    times = []
    for _ in range(5):
        comm.barrier()
        for _ in range(iters):
            t0 = time.perf_counter()
            comm.all_reduce(x)
            times.append(time.perf_counter() - t0)
    comm.close()
    return [t * 1e6 for t in times]


def _with_setting(setting: str) -> dict[str, str]:
    return {**os.environ, "PYRING_AFFINITY": setting}


def _latency(setting: str, args: argparse.Namespace) -> float:
    from _ranks import launch

    saved = os.environ.get("PYRING_AFFINITY")
    os.environ["PYRING_AFFINITY"] = setting  # the spawned ranks inherit it
    try:
        from pyring.tools.timing import slowest_median

        return slowest_median(launch(_latency_rank, 2, args.bytes, args.iters, timeout=300))
    finally:
        if saved is None:
            del os.environ["PYRING_AFFINITY"]
        else:
            os.environ["PYRING_AFFINITY"] = saved


def _train(setting: str, args: argparse.Namespace) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "train.json"
        subprocess.run([sys.executable, str(BENCH.parent / "examples" / "train.py"), "--ranks",
                        "2", "--steps", str(args.train_steps), "--json", str(out)],
                       check=True, env=_with_setting(setting), capture_output=True, timeout=900)
        return json.loads(out.read_text())["median_step_s"]


def main() -> int:
    from busy import LOADS, Load
    from machine import describe

    from pyring.config import parse_bytes

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--load", choices=LOADS, default="cpu")
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--bytes", default="4K")
    p.add_argument("--iters", type=int, default=400)
    p.add_argument("--train-rounds", type=int, default=2, help="0: no training part")
    p.add_argument("--train-steps", type=int, default=60)
    p.add_argument("--tag", default="vm")
    p.add_argument("--out", default=None)
    add_replace_flag(p)
    args = p.parse_args()
    args.bytes = parse_bytes(args.bytes, "--bytes")
    lat: dict[str, list[float]] = {s: [] for s in SETTINGS}
    train: dict[str, list[float]] = {s: [] for s in SETTINGS}
    with Load(args.load) as load:
        for i in range(args.runs):
            for s in SETTINGS if i % 2 == 0 else SETTINGS[::-1]:
                lat[s].append(_latency(s, args))
            print(f"run {i}: " + ", ".join(f"{s} {lat[s][-1]:.1f} us" for s in SETTINGS),
                  flush=True)
        for i in range(args.train_rounds):
            for s in SETTINGS if i % 2 == 0 else SETTINGS[::-1]:
                train[s].append(_train(s, args))
            print(f"train round {i}: " + ", ".join(f"{s} {train[s][-1] * 1e3:.1f} ms/step"
                                                   for s in SETTINGS), flush=True)
    doc = {"benchmark": "affinity", "command": sys.argv, "machine": describe(),
           "load": load.describe(), "bytes": args.bytes, "iters": args.iters,
           "latency_us": lat, "median_latency_us": {s: statistics.median(v)
                                                    for s, v in lat.items()},
           "worst_latency_us": {s: max(v) for s, v in lat.items()},
           "train_median_step_s": train,
           "definitions": {
               "latency_us": "per run, the slower rank's median time of one allreduce",
               "train_median_step_s": "per round, examples/train.py's median step (2 ranks)"}}
    out = result_path(f"affinity_{args.load}_{args.tag}", args.out, args.replace)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    for s in SETTINGS:
        v = lat[s]
        print(f"{s:>4}: median {statistics.median(v):.1f} us, worst {max(v):.1f} us over "
              f"{len(v)} runs" + (f"; training {statistics.median(train[s]) * 1e3:.1f} ms/step"
                                  if train[s] else ""))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
