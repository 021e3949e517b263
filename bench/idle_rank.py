#!/usr/bin/env python
"""The idle rank, in repeated trials: 2 ranks on the pyring backend; rank 0's all_gather_object
times out while rank 1 sleeps in Python, and rank 0 then leaves with os._exit. Rank 1 must
live on: once awake, its next collective raises pyring's typed error naming the lost peer,
and it exits 0. A trial fails when a rank ends by a signal (a crash), when rank 0's wait ends
another way than by its timeout, or when rank 1's collective completes or raises anything
else.

    python bench/idle_rank.py --trials 500 --load mixed             # as the issue asks
    python bench/idle_rank.py --trials 50 --sanitize address,undefined

Each trial starts both ranks as torchrun would (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT;
no agent, so rank 0's exit does not end rank 1), with the collective deadline ``--timeout``
and rank 1 asleep past rank 0's deadline (by 1 s) and a random 0 to ``--sleep`` seconds more
(seeded by the trial). ``--parallel``
trials run at once, under ``--load`` (bench/busy.py; one process per core). Core dumps are
on (``ulimit -c``) in the trial's folder, which is kept when it fails. ``--sanitize KIND``
runs the ranks on pyring.testing.sanitize's build and counts its reports in pyring's code as
failures. Writes bench/results/idle_rank_<tag>.json (``--replace``; else a file of its own
under bench/results/runs/); exits 1 when a trial failed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _results import add_replace_flag, result_path
from busy import LOADS, Load
from machine import describe

JOB = """
import datetime, os, sys, time
import torch.distributed as dist
import pyring  # noqa: F401  (the backend)

rank, timeout, sleep = int(os.environ["RANK"]), float(sys.argv[1]), float(sys.argv[2])
dist.init_process_group("pyring", timeout=datetime.timedelta(seconds=timeout))
if rank == 0:
    objs = [None, None]
    try:
        dist.all_gather_object(objs, {"rank": 0})
        print("OUTCOME completed", flush=True)
    except Exception as e:  # the timeout, naming rank 1
        print("OUTCOME", type(e).__name__, str(e)[:300].replace("\\n", " "), flush=True)
    os._exit(0)
time.sleep(sleep)
try:
    dist.barrier()
    print("OUTCOME completed", flush=True)
except Exception as e:  # rank 0 is gone
    print("OUTCOME", type(e).__name__, str(e)[:300].replace("\\n", " "), flush=True)
try:
    dist.destroy_process_group()
except Exception as e:
    print("DESTROY", type(e).__name__, flush=True)
sys.exit(0)
"""
EXPECTED = {0: ("CommTimeout",), 1: ("PeerLost", "CommError", "CommTimeout")}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _core_limit() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def trial(i: int, args: argparse.Namespace, env: dict[str, str], root: Path) -> dict:
    # Past rank 0's deadline (and its exit), then 0 to --sleep seconds more.
    sleep = args.timeout + 1.0 + random.Random(i).uniform(0, args.sleep)
    folder = root / f"trial-{i}"
    folder.mkdir()
    job = folder / "job.py"
    job.write_text(JOB)
    port = _port()
    procs = []
    for rank in (0, 1):
        e = dict(env, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                 LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                 PYRING_TIMEOUT=str(args.timeout))
        out = open(folder / f"rank{rank}.log", "w")
        procs.append((subprocess.Popen([sys.executable, "-P", str(job), str(args.timeout),
                                        str(sleep)], env=e, cwd=folder, stdout=out,
                                       stderr=subprocess.STDOUT, preexec_fn=_core_limit), out))
    codes = []
    for p, out in procs:
        try:
            codes.append(p.wait(timeout=args.timeout + args.sleep + 120))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append("hung")
        out.close()
    ranks = []
    problems = []
    for rank, code in enumerate(codes):
        text = (folder / f"rank{rank}.log").read_text(errors="replace")
        outcome = next((ln.split(" ", 2)[1:] for ln in text.splitlines()
                        if ln.startswith("OUTCOME ")), None)
        ranks.append({"exit": code, "outcome": outcome, "tail": text[-600:]})
        if code == "hung" or (isinstance(code, int) and code < 0):
            problems.append(f"rank {rank} ended by {'a hang' if code == 'hung' else -code}")
        elif code != 0:
            problems.append(f"rank {rank} exit {code}")
        if outcome is None or outcome[0] not in EXPECTED[rank]:
            problems.append(f"rank {rank} outcome {outcome}")
    cores = sorted(p.name for p in folder.glob("core*"))
    if cores:
        problems.append(f"core files {cores}")
    if problems:
        shutil.copytree(folder, Path(args.keep) / folder.name, dirs_exist_ok=True)
    shutil.rmtree(folder, ignore_errors=True)
    return {"trial": i, "sleep_s": round(sleep, 3), "problems": problems,
            "ranks": ranks if problems else [{"exit": r["exit"], "outcome": r["outcome"]}
                                             for r in ranks]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=500)
    ap.add_argument("--parallel", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=2.0, help="the collective deadline (s)")
    ap.add_argument("--sleep", type=float, default=6.0, help="rank 1 sleeps up to this (s)")
    ap.add_argument("--load", choices=LOADS, default="mixed")
    ap.add_argument("--sanitize", default=None, help="a pyring.testing.sanitize KIND")
    ap.add_argument("--keep", default=None,
                    help="where failed trials' folders are kept (default: a new temp folder)")
    ap.add_argument("--tag", default="vm")
    ap.add_argument("--out", default=None, help="JSON path (default: see --replace)")
    add_replace_flag(ap)
    args = ap.parse_args()
    out = result_path(f"idle_rank_{args.tag}", args.out, args.replace)
    args.keep = args.keep or tempfile.mkdtemp(prefix="pyring-idle-rank-failed-")
    env = dict(os.environ)
    reports = None
    if args.sanitize:
        from pyring.testing import sanitize

        root = Path(__file__).resolve().parent.parent
        pkg = sanitize.build(args.sanitize, root, sanitize.default_build(args.sanitize, root))
        reports = Path(tempfile.mkdtemp(prefix="pyring-idle-rank-reports-"))
        env = sanitize.environment(args.sanitize, pkg, reports)
    results = []
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="pyring-idle-rank-") as tmp, Load(args.load), \
            ThreadPoolExecutor(args.parallel) as pool:
        for r in pool.map(lambda i: trial(i, args, env, Path(tmp)), range(args.trials)):
            results.append(r)
            if r["problems"]:
                print(f"trial {r['trial']}: {'; '.join(r['problems'])}", flush=True)
            if len(results) % 50 == 0:
                print(f"{len(results)} trials, {sum(bool(x['problems']) for x in results)} "
                      f"failed, {time.time() - t0:.0f} s", flush=True)
    failed = [r for r in results if r["problems"]]
    crashes = [r for r in failed if any("ended by" in p or "core" in p for p in r["problems"])]
    summary = {"trials": len(results), "failed": len(failed), "crashes": len(crashes),
               "wall_s": time.time() - t0}
    if reports is not None:
        from pyring.testing import sanitize

        ours, others = sanitize.split_reports(reports)
        summary.update(pyring_reports=len(ours), other_reports=len(others))
        failed += [{"report": r} for r in ours]
    print(json.dumps(summary), f"failed trials kept in {args.keep}" if failed else "")
    doc = {"machine": describe(), "command": " ".join(sys.argv), "timeout_s": args.timeout,
           "sleep_max_s": args.sleep, "load": args.load, "parallel": args.parallel,
           "sanitize": args.sanitize, "summary": summary, "failed": failed[:50],
           "first_trial": results[0] if results else None,
           "outcomes": sorted({f"{r['ranks'][0]['outcome'] and r['ranks'][0]['outcome'][0]} / "
                               f"{r['ranks'][1]['outcome'] and r['ranks'][1]['outcome'][0]}"
                               for r in results if "ranks" in r})}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
