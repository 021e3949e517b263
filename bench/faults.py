#!/usr/bin/env python
"""Faults that real clusters have, in repeated trials: a rank that never arrives (hang), a
store that dies (store) and a silent network partition (partition), each checked for an error
that names its cause on every rank.

    python bench/faults.py                  # all: 20 hang trials per transport, 10 store trials
                                            # per phase, 20 partition trials at 2x2
    python bench/faults.py --fault hang --trials 5 --transports tcp

hang: 4 ranks (pyring.launch) run all_reduce #1 and #2 (4 MiB) together; rank 3 then sleeps
--sleep seconds in user code before #3 while the others wait out --timeout. Every rank must
name rank 3 as never having entered all_reduce #3 with #2 its last completed collective, and no
other rank; the waiting ranks must raise CommTimeout within the deadline + the account's wait
(pyring/runtime/hang.py: account_wait, at most 1.75 s) and warn at half the deadline (stderr).
store: 3 ranks use a TCPStore hosted by a process of its own, which is SIGKILLed while the
others are inside pyring.init (phase init) or inside torch's new_group on the pyring backend
(phase new_group). Every rank must raise CommError naming the store's address within the
deadline.
partition (needs root, ip, unshare, tc): 2 emulated hosts of 2 ranks over 1 Gbit
(pyring.testing.partition); every packet between them is dropped in the middle of a loop of
64 MiB allreduces. Every rank must raise within the deadline + 2 s, naming a rank of the other
host and its address, and exit.
Writes bench/results/faults_<tag>.json with the machine's description and every trial's
messages; exits 1 when a trial misses its target.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from _results import add_replace_flag, result_path  # noqa: E402
from machine import describe

from pyring.launch import RankFailure, run_ranks
from pyring.runtime import hang as _hang
from pyring.testing.faults import (
    DoomedStore,
    check_store_dies,
    check_stuck_rank,
    store_dies,
    stuck_rank,
)
from pyring.testing.partition import check_partition, run_partition
from pyring.tools import emulate as _emulate


def _trial(fn, check) -> dict:
    start = time.monotonic()
    try:
        results, bad = check(fn())
    except RankFailure as e:
        results, bad = None, [f"a rank failed outside the scenario: {e}"[:2000]]
    return {"ok": not bad, "problems": bad, "seconds": round(time.monotonic() - start, 2),
            "results": results}


def hang_trials(args, transport: str) -> list[dict]:
    slack = _hang.account_wait(args.timeout)

    def check(results):
        return ([{"error": r["error"]} for r in results],
                check_stuck_rank(results, args.timeout, slack))

    return [_trial(lambda: run_ranks(4, stuck_rank, transport, args.timeout, args.sleep,
                                     timeout=120), check) for _ in range(args.trials)]


def store_trials(args, phase: str) -> list[dict]:
    out = []
    for _ in range(args.store_trials):
        doomed = DoomedStore()
        try:
            out.append(_trial(
                lambda d=doomed: run_ranks(3, store_dies, phase, args.timeout,
                                           store=("127.0.0.1", d.port, ""), timeout=120),
                lambda res, d=doomed: (res, check_store_dies(res, d.port, args.timeout))))
        finally:
            doomed.close()
    return out


def partition_trials(args) -> list[dict]:
    def check(got):
        results, addresses = got
        return results, check_partition(results, addresses, 2, args.timeout, 2.0)

    return [_trial(lambda: run_partition(2, 2, args.timeout), check)
            for _ in range(args.partition_trials)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fault", choices=("hang", "store", "partition", "all"), default="all")
    ap.add_argument("--trials", type=int, default=20, help="hang trials per transport")
    ap.add_argument("--store-trials", type=int, default=10, help="store trials per phase")
    ap.add_argument("--partition-trials", type=int, default=20)
    ap.add_argument("--transports", default="shm,tcp")
    ap.add_argument("--timeout", type=float, default=3.0, help="pyring's deadline, seconds")
    ap.add_argument("--sleep", type=float, default=5.0, help="the stuck rank's sleep, seconds")
    ap.add_argument("--tag", default="vm")
    ap.add_argument("--out", default=None)
    add_replace_flag(ap)
    args = ap.parse_args()
    if args.sleep <= args.timeout:
        ap.error("--sleep must exceed --timeout, or the late rank arrives in time")
    cases: dict[str, list[dict]] = {}
    if args.fault in ("hang", "all"):
        for t in args.transports.split(","):
            cases[f"hang_{t}"] = hang_trials(args, t)
            print(f"hang over {t}: {sum(c['ok'] for c in cases[f'hang_{t}'])} of "
                  f"{args.trials} trials met the target", flush=True)
    if args.fault in ("store", "all"):
        for phase in ("init", "new_group"):
            cases[f"store_{phase}"] = store_trials(args, phase)
            print(f"store death during {phase}: "
                  f"{sum(c['ok'] for c in cases[f'store_{phase}'])} of {args.store_trials} "
                  "trials met the target", flush=True)
    if args.fault in ("partition", "all"):
        ok, why = _emulate.available(shaping=True)
        if not ok:
            print(f"partition: skipped ({why})")
        else:
            cases["partition"] = partition_trials(args)
            print(f"partition at 2x2: {sum(c['ok'] for c in cases['partition'])} of "
                  f"{args.partition_trials} trials met the target", flush=True)
    for name, trials in cases.items():
        for i, t in enumerate(trials):
            for p in t["problems"]:
                print(f"  {name} trial {i}: {p}")
    passed = all(t["ok"] for trials in cases.values() for t in trials)
    out = result_path(f"faults_{args.tag}", args.out, args.replace)
    out.write_text(json.dumps({
        "benchmark": "faults", "machine": describe(),
        "command": ["python", "bench/faults.py", *sys.argv[1:]], "timeout_s": args.timeout,
        "sleep_s": args.sleep, "summary": {k: f"{sum(t['ok'] for t in v)}/{len(v)}"
                                           for k, v in cases.items()},
        "cases": cases, "passed": passed}, indent=1) + "\n")
    print(f"# json: {out}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
