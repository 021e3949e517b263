"""Soak and kill trials: long random mixes with every result verified, then trials that kill
a random rank and check that every survivor raises in time and nothing is left behind.

    python bench/soak.py                          # 4 ranks, 10 minutes, then 100 kill trials
    python bench/soak.py --minutes 1 --trials 10  # a short run
    python bench/soak.py --fuzz-calls 10000       # also the API fuzz (pyring/testing/api_fuzz.py)
    python bench/soak.py --minutes 0 --trials 0 --chaos-minutes 10   # the chaos mode (_chaos.py)

Writes bench/results/soak_<tag>.json with the machine's description; exits non-zero when a
target is missed (any wrong result, any failed trial, any fuzz failure).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))

import torch  # noqa: E402
from _results import add_replace_flag, result_path  # noqa: E402
from _soak_mix import Mix  # noqa: E402
from leaks import rss_bytes  # noqa: E402
from machine import describe  # noqa: E402

import pyring  # noqa: E402
from pyring.launch import Ranks, run_ranks  # noqa: E402

CHECK_EVERY = 25  # calls between the ranks' agreement on whether to stop
# The most a rank's resident memory may grow after the warm-up, judged in runs of at least
# RSS_TARGET_MINUTES with --repeat-every (otherwise the growth is reported, not judged: a random
# mix raises the allocators' high-water mark whenever a larger call comes).
RSS_GROWTH_MIB = 2.0
RSS_TARGET_MINUTES = 5.0


def _rss_bytes(trim: bool = False) -> int:
    """Resident memory; with trim, after glibc has returned its free heap pages (malloc_trim),
    so that what remains is what the process holds, not how its heap is fragmented."""
    if trim:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_bytes()


def _growth(samples: list[int]) -> int | None:
    """The median of the last quarter of the samples minus that of the first: a trend that
    the heap's trims and regrowths between single samples (tens of MiB here) do not mask."""
    q = len(samples) // 4
    if q == 0:
        return samples[-1] - samples[0] if len(samples) > 1 else None
    return int(statistics.median(samples[-q:]) - statistics.median(samples[:q]))


def _soak_rank(rank: int, world: int, store: Any, seconds: float, seed: int,
               topology: str, repeat_every: int, trim: bool) -> dict:
    torch.set_num_threads(1)
    comm = pyring.init(rank, world, store, set_default=False, timeout=60, topology=topology)
    mix, wrong, errors = Mix(comm, seed), 0, []
    start = time.monotonic()
    # Resident memory: with repeat_every, the calls' kinds and sizes repeat every repeat_every
    # calls (the values differ), so the allocators reach the cycle's high-water mark in its
    # first pass; it is sampled at cycle boundaries from the third on and after a tenth of the
    # run. Without, after a tenth of the run (at most a minute) and every tenth after it.
    warmup_s = min(60.0, seconds / 10)
    rss: list[tuple[float, int]] = []
    while True:
        try:
            wrong += mix.step()
        except Exception as e:  # recorded: any error in the soak is a failure
            errors.append(f"call {mix.call}: {type(e).__name__}: {e}"[:500])
            break
        if repeat_every and mix.call % repeat_every == 0:
            mix.rng = random.Random(seed)
            now = time.monotonic() - start
            if mix.call >= 2 * repeat_every and now >= warmup_s:
                rss.append((round(now, 1), _rss_bytes(trim)))
        if mix.call % CHECK_EVERY == 0:
            now = time.monotonic() - start
            if not repeat_every and now >= warmup_s and (
                    not rss or now - rss[-1][0] >= seconds / 10):
                rss.append((round(now, 1), _rss_bytes(trim)))
            stop = torch.tensor([float(now >= seconds)])
            comm.all_reduce(stop, op="max")
            if stop.item() > 0:
                break
    stats = comm.stats()
    if not repeat_every:
        rss.append((round(time.monotonic() - start, 1), _rss_bytes(trim)))
    comm.close()
    return {"calls": mix.call, "wrong_elements": wrong, "errors": errors, "rss_samples": rss,
            "rss_growth_bytes": _growth([b for _, b in rss]),
            "by_kind": mix.counts,
            "bytes_sent": stats["bytes_sent"], "calls_by_algo": stats["calls"]}


def soak(world: int, seconds: float, seed: int, topology: str, repeat_every: int = 0,
         trim: bool = False) -> dict:
    outs = run_ranks(world, _soak_rank, seconds, seed, topology, repeat_every, trim,
                     timeout=seconds + 300, allow_failures=True)
    # A rank that failed or died reports (type, message) or None in place of its dict.
    got = {r: o for r, o in enumerate(outs) if isinstance(o, dict)}
    for r, o in enumerate(outs):
        if not isinstance(o, dict):
            got[r] = {"calls": 0, "wrong_elements": 0, "errors": [f"rank {r}: {o}"]}
    per_rank = [got.get(r, {"calls": 0, "wrong_elements": 0, "errors": ["no report"]})
                for r in range(world)]
    return {"world": world, "seconds": seconds, "seed": seed, "topology": topology,
            "repeat_every": repeat_every, "malloc_trim_before_samples": trim,
            "calls": per_rank[0]["calls"],
            "wrong_elements": sum(r["wrong_elements"] for r in per_rank),
            "errors": [e for r in per_rank for e in r["errors"]],
            "by_kind": per_rank[0].get("by_kind", {}),
            "calls_by_algo": per_rank[0].get("calls_by_algo", {}),
            "rss_growth_bytes": [r.get("rss_growth_bytes") for r in per_rank],
            "rss_samples": [r.get("rss_samples") for r in per_rank]}


# -- kill trials ----------------------------------------------------------------------------

def _trial_rank(rank: int, world: int, store: Any, timeout_s: float, seed: int,
                results: Any, late_s: list[float]) -> None:
    torch.set_num_threads(1)
    store.set_timeout(datetime.timedelta(seconds=timeout_s))  # the store waits to the deadline
    time.sleep(late_s[rank])
    try:
        comm = pyring.init(rank, world, store, set_default=False, timeout=timeout_s,
                           topology="0,1|2,3" if world == 4 else "auto")
        results[rank].put((rank, "ready", time.time()))
        mix = Mix(comm, seed)
        while True:
            mix.step()
    except BaseException as e:  # the survivor's report: what it raised, and when
        results[rank].put((rank, type(e).__name__, time.time(), str(e)[:300]))


def _shm_names() -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("pyring-")}
    except OSError:
        return set()


# Ranks fork from a clean single-threaded server that has torch and pyring loaded: fast to
# start, and free of what forking this process (store and queue threads) would inherit.
TRIAL_PRELOAD = ["torch", "pyring", "_soak_mix", "soak"]


def kill_trial(world: int, timeout_s: float, rng: random.Random) -> dict:
    shm_before = _shm_names()
    # A queue per rank: a rank killed while it writes to a queue leaves that queue's lock held,
    # which would silence every other writer of a shared one.
    results = [mp.get_context("forkserver").Queue() for _ in range(world)]
    seed = rng.randrange(1 << 30)
    victim = rng.randrange(world)
    # In a third of the trials the victim comes late (0.3 s) and is killed before, during or
    # just after its init, while the others wait for it in theirs; otherwise all run first.
    in_init = rng.random() < 1 / 3
    late_s = [0.3 if in_init and r == victim else 0.0 for r in range(world)]
    delay = rng.uniform(0.05, 0.45) if in_init else rng.uniform(0.1, 2.5)
    with Ranks(world, _trial_rank, timeout_s, seed, results, late_s,
               start_method="forkserver", preload=TRIAL_PRELOAD) as job:
        time.sleep(delay)
        job.kill(victim)
        killed_at = time.time()
        reports: dict[int, tuple] = {}
        ready = 0
        end = time.monotonic() + 2 * timeout_s + 10
        while len(reports) < world - 1 and time.monotonic() < end:
            msgs = []
            for q in results[:victim] + results[victim + 1:]:  # the victim's may hold half a
                try:  # message, whose read would block
                    msgs.append(q.get_nowait())
                except Exception:  # noqa: BLE001 (empty)
                    continue
            if not msgs:
                time.sleep(0.05)
            for msg in msgs:
                if msg[1] == "ready":
                    ready += 1
                else:
                    reports[msg[0]] = msg
        left = [job.pids[r] for r in job.join(10)]
    phase = "run" if ready >= world - 1 else "init"
    # Init waits on the store and then on the links, each with the deadline.
    bound = timeout_s + 1.0 if phase == "run" else 2 * timeout_s + 1.0
    late = {r: round(m[2] - killed_at, 2) for r, m in reports.items() if m[2] - killed_at > bound}
    silent = [r for r in range(world) if r != victim and r not in reports]
    leaked = sorted(_shm_names() - shm_before)
    kinds = sorted({m[1] for m in reports.values()})
    ok = not late and not silent and not left and not leaked
    return {"victim": victim, "kill_after_s": round(delay, 2), "phase": phase, "ok": ok,
            "raised": kinds, "max_raise_s": round(max((m[2] - killed_at for m in
                                                       reports.values()), default=-1), 2),
            "late": late, "silent": silent, "processes_left": left, "shm_left": leaked,
            "sample_error": next(iter(reports.values()))[3] if reports else None}


def kill_trials(world: int, trials: int, timeout_s: float, seed: int) -> dict:
    rng = random.Random(seed)
    rows = []
    for i in range(trials):
        row = kill_trial(world, timeout_s, rng)
        rows.append(row)
        mark = "ok" if row["ok"] else "FAIL"
        print(f"trial {i + 1}/{trials}: kill rank {row['victim']} after {row['kill_after_s']} s "
              f"({row['phase']}): survivors raised {row['raised']} within "
              f"{row['max_raise_s']} s  {mark}", flush=True)
    passed = sum(r["ok"] for r in rows)
    by_phase = {ph: [r["max_raise_s"] for r in rows if r["phase"] == ph] for ph in ("init", "run")}
    return {"world": world, "trials": trials, "passed": passed, "timeout_s": timeout_s,
            "max_raise_s": {ph: max(v, default=None) for ph, v in by_phase.items()},
            "trials_by_phase": {ph: len(v) for ph, v in by_phase.items()},
            "failures": [r for r in rows if not r["ok"]], "rows": rows}


def fuzz(calls: int, seed: int) -> dict:
    from pyring.testing import api_fuzz as af

    rng = random.Random(seed)
    pool = af.Pool(2)
    seen: dict[str, int] = {}
    failures, hangs = [], 0
    try:
        for _ in range(calls):
            spec = {"kind": rng.choice(af.KINDS), "dtype": rng.choice(af.DTYPES),
                    "shape": [rng.randint(0, 5) for _ in range(rng.randint(0, 3))]
                    if rng.random() < 0.8 else [rng.randint(1, 70_000)],
                    "layout": rng.choice(af.LAYOUTS),
                    "device": rng.choice(("cpu", "cpu", "cpu", "meta")),
                    "numpy": rng.random() < 0.5, "op": rng.choice(af.OPS),
                    "async_op": rng.random() < 0.5, "out": rng.choice(af.OUTS),
                    "algo": rng.choice(af.ALGOS), "wire": rng.choice(af.WIRES),
                    "root": rng.randint(-1, 2)}
            outcomes = pool.call(spec)
            if outcomes is None:
                hangs += 1
                failures.append({"spec": spec, "why": "hang"})
                break
            verdict = af.judge(spec, outcomes, 2)
            if verdict:
                failures.append({"spec": spec, "why": verdict})
            seen[outcomes[0][0]] = seen.get(outcomes[0][0], 0) + 1
    finally:
        pool.close()
    return {"calls": sum(seen.values()), "outcomes": seen, "failures": failures[:20],
            "crashes_or_wrong": len(failures) - hangs, "hangs": hangs}


def strangers(trials: int) -> dict:
    """The start of 4 tcp ranks with and without strangers (silent, garbage, forged and
    wrong-secret clients on every listening port of the ranks that wait for a late one), side
    by side per trial (pyring/testing/strangers.py, as tests/test_strangers.py)."""
    from pyring.launch import run_ranks
    from pyring.testing import strangers as ts

    env = {"PYRING_TRANSPORT": "tcp", "OMP_NUM_THREADS": "1"}
    rows = []
    for _ in range(trials):
        quiet = run_ranks(4, ts.job, False, env=env, timeout=120)
        noisy = run_ranks(4, ts.job, True, env=env, timeout=120)
        dropped: dict[str, int] = {}
        for r in noisy:
            for why, n in r[3].items():
                dropped[why] = dropped.get(why, 0) + n
        answered = noisy[-1][4]
        rows.append({"start_s_quiet": round(ts.delay(quiet), 4),
                     "start_s_with_strangers": round(ts.delay(noisy), 4),
                     "dropped": dropped, "wrong_secret_clients": len(answered),
                     "strangers_accepted": sum(1 for a in answered if a),
                     "results_right": all(r[2] == 10.0 for r in quiet + noisy)})
    delays = [r["start_s_with_strangers"] - r["start_s_quiet"] for r in rows]
    return {"trials": trials, "max_added_delay_s": round(max(delays), 4),
            "strangers_accepted": sum(r["strangers_accepted"] for r in rows),
            "all_results_right": all(r["results_right"] for r in rows), "rows": rows}


def native_fuzz(runs: int) -> dict:
    """libFuzzer over the native parsers (tests/fuzz/fuzz_parsers.cc), ASan and UBSan."""
    import re
    import subprocess
    import tempfile

    from pyring.testing import native_fuzz as tf

    with tempfile.TemporaryDirectory() as tmp:
        exe = tf.build(tmp, os.path.dirname(HERE))
        corpus = os.path.join(tmp, "corpus")
        os.mkdir(corpus)
        for name, data in tf.seeds().items():
            with open(os.path.join(corpus, name), "wb") as fh:
                fh.write(data)
        start = time.monotonic()
        proc = subprocess.run([exe, f"-runs={runs}", "-timeout=5", "-rss_limit_mb=2048", corpus],
                              capture_output=True, text=True, cwd=tmp)
    done = re.search(r"Done (\d+) runs", proc.stderr)
    return {"runs": int(done.group(1)) if done else 0, "exit_code": proc.returncode,
            "crashes": 0 if proc.returncode == 0 else 1,
            "seconds": round(time.monotonic() - start, 1),
            "tail": proc.stderr[-1500:] if proc.returncode else ""}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--trial-timeout", type=float, default=3.0,
                    help="pyring's deadline in the kill trials, seconds")
    ap.add_argument("--topology", default="0,1|2,3", help="the soak's topology (tree included)")
    ap.add_argument("--fuzz-calls", type=int, default=0)
    ap.add_argument("--strangers", type=int, default=0, help="rendezvous trials with strangers")
    ap.add_argument("--native-fuzz-runs", type=int, default=0, help="libFuzzer inputs (clang++)")
    ap.add_argument("--chaos-minutes", type=float, default=0.0,
                    help="the chaos mode's length (bench/_chaos.py: kills, SIGSTOPs, dropped "
                         "stores, closes during callbacks, symmetric allocations)")
    ap.add_argument("--chaos-timeout", type=float, default=2.0,
                    help="pyring's deadline in the chaos mode, seconds")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat-every", type=int, default=0,
                    help="repeat the calls' kinds and sizes every N calls (the memory target)")
    ap.add_argument("--trim", action="store_true",
                    help="malloc_trim before each memory sample (glibc returns its free pages)")
    ap.add_argument("--tag", default="vm")
    ap.add_argument("--out", help="where to write the JSON (default bench/results/soak_TAG.json)")
    add_replace_flag(ap)
    args = ap.parse_args()
    out: dict[str, Any] = {"machine": describe(), "command": " ".join(sys.argv)}
    ok = True
    if args.minutes > 0:
        s = soak(args.world, args.minutes * 60, args.seed, args.topology, args.repeat_every,
                 args.trim)
        growth = [g / 2**20 for g in s["rss_growth_bytes"] if g is not None]
        print(f"soak: {s['calls']} calls on {args.world} ranks in {args.minutes:g} min, "
              f"{s['wrong_elements']} wrong elements, {len(s['errors'])} errors, resident "
              f"memory after the warm-up grew by {', '.join(f'{g:+.2f}' for g in growth)} MiB "
              f"(target <= {RSS_GROWTH_MIB} MiB)", flush=True)
        out["soak"] = s
        ok &= s["wrong_elements"] == 0 and not s["errors"] and s["calls"] > 0
        if args.minutes >= RSS_TARGET_MINUTES and args.repeat_every:
            ok &= len(growth) == args.world and max(growth) <= RSS_GROWTH_MIB
    if args.fuzz_calls > 0:
        f = fuzz(args.fuzz_calls, args.seed)
        print(f"fuzz: {f['calls']} calls, outcomes {f['outcomes']}, {f['crashes_or_wrong']} "
              f"wrong or crashed, {f['hangs']} hangs", flush=True)
        out["fuzz"] = f
        ok &= not f["failures"] and f["calls"] == args.fuzz_calls
    if args.native_fuzz_runs > 0:
        nf = native_fuzz(args.native_fuzz_runs)
        print(f"native fuzz: {nf['runs']} inputs, exit code {nf['exit_code']}", flush=True)
        out["native_fuzz"] = nf
        ok &= nf["exit_code"] == 0 and nf["runs"] >= args.native_fuzz_runs
    if args.strangers > 0:
        st = strangers(args.strangers)
        print(f"strangers: {st['trials']} trials, start delayed by at most "
              f"{st['max_added_delay_s']} s, {st['strangers_accepted']} accepted", flush=True)
        out["strangers"] = st
        ok &= st["max_added_delay_s"] < 1.0 and st["strangers_accepted"] == 0 and \
            st["all_results_right"]
    if args.trials > 0:
        k = kill_trials(args.world, args.trials, args.trial_timeout, args.seed)
        print(f"kill trials: {k['passed']}/{k['trials']} passed; slowest survivor "
              f"{k['max_raise_s']} s after the kill (deadline {args.trial_timeout:g} s)",
              flush=True)
        out["kill_trials"] = k
        ok &= k["passed"] == k["trials"]
    if args.chaos_minutes > 0:
        from _chaos import CHAOS_FAULTS_TARGET, chaos

        c = chaos(args.world, args.chaos_minutes * 60, args.seed, args.chaos_timeout)
        print(f"chaos: {c['faults']} faults {c['faults_by_kind']}, {c['faults_ok']} ended "
              f"typed or survived, {c['wrong_results']} wrong results, {c['desyncs']} "
              f"desyncs, fds across generations {c['fd_growth_across_generations']:+d}, "
              f"/dev/shm left {c['shm_left']}", flush=True)
        out["chaos"] = c
        ok &= c["ok"] and (c["faults"] >= CHAOS_FAULTS_TARGET or args.chaos_minutes < 10)
    path = str(result_path(f"soak_{args.tag}", args.out, args.replace))
    with open(path, "w") as fh:
        json.dump(out, fh, indent=1)
    print(f"wrote {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
