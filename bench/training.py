#!/usr/bin/env python
"""Training-step benchmark: pyring's optimizer hook vs DDP on the pyring backend vs DDP on
gloo, side by side, at 1 and 2 local ranks (one torch thread per rank, fixed batch per rank).

    PYTHONPATH=. python bench/training.py                   # ~6 minutes on 2 cores
    PYTHONPATH=. python bench/training.py --rounds 1 --blocks 1 --block 1 --dim 128 --layers 2

Workload: examples/train.py's CharGPT scaled up (default 5 layers x 512: 16.1 M parameters,
64.2 MB of float32 gradients), AdamW, random tokens. Methods:
  pyring      pyring.DistributedOptimizer (25 MiB buckets, gradients as bucket views),
              synchronize() then step()
  ddp-pyring  DistributedDataParallel(gradient_as_bucket_view=True) on the "pyring" backend
              (DDP's 25 MiB buckets)
  ddp-gloo    the same DDP on gloo
  ddp-pyring-copy, ddp-gloo-copy: DDP with its defaults (gradients copied into the buckets
              and back)
Every round is one job of two freshly spawned ranks (bench/_training_job.py) that interleaves,
block by block, every method at 2 ranks and at 1 rank (rank 0 alone, rank 1 asleep), the bare
model without communication at 2 and 1 rank(s), the bare model at 2 ranks meeting once per
step (lockstep: a 1-element allreduce, no gradients), and one allreduce of the gradients' size
alone with each library. Interleaving every second or so cancels the shared machine's drift,
which moves whole runs by 10-40%, so methods are compared side by side in one job. --pin
binds rank r, with all its threads, to core r (as mpirun's default --bind-to core for 2
ranks), for every method alike.
A mode's step = the slowest rank's mean time over its timed iterations, i.e. 1 / throughput.
The jobs run --rounds times; per-round figures, then their median over rounds, are reported.
Every rank runs with glibc's heap trimming off (MALLOC_ENV; --default-malloc leaves it on), so
that freed memory is reused without fresh page faults in every method alike.
Definitions: printed under the table (DEFINITIONS).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR.parent / "examples"))
sys.path.insert(0, str(BENCH_DIR))

import _training_job  # noqa: E402
import train  # noqa: E402  examples/train.py: model, launcher
from scaling import failure  # noqa: E402

# Set for every rank of every run unless --default-malloc: glibc then never hands freed heap
# memory back to the system, so a step's temporaries (AdamW's, autograd's) do not page-fault
# afresh each step, a cost that otherwise lands on whichever rank's heap happens to be trimmed.
MALLOC_ENV = {"MALLOC_TRIM_THRESHOLD_": str(16 << 30), "MALLOC_MMAP_THRESHOLD_": str(4 << 30)}
METHODS = ("pyring", "ddp-pyring", "ddp-gloo", "ddp-pyring-copy", "ddp-gloo-copy")
GLOO_PEER = {m: "ddp-gloo-copy" if m.endswith("-copy") else "ddp-gloo" for m in METHODS}
PHASES = ("forward", "backward", "optimizer")


def _cpu() -> tuple[float, float, float]:
    """(now, CPU seconds the whole machine was busy, CPU seconds of this process and its
    reaped children) for measuring the load other processes put on the machine."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    ours = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    return time.perf_counter(), (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK"), ours


def run(methods: list[str], cfg: dict[str, Any]) -> dict[str, Any]:
    """Spawns one job; returns its modes' figures, or {"status": "failed", "error": ...}."""
    t0, busy0, ours0 = _cpu()
    try:
        store = train.launch(_training_job.worker, 2, (methods, cfg), cfg["run_limit"])
        ranks = [json.loads(store.get(f"result/{r}")) for r in range(2)]
    except Exception as e:  # reported; the other rounds go on
        res = failure(e)
        print(f"  FAILED ({res['error']})", flush=True)
        return res
    modes = {}
    for mode in _training_job.modes_for(methods):
        runs = [r["modes"][mode] for r in ranks if r["modes"][mode]["times"]]
        means = [statistics.fmean(r["times"]) for r in runs]
        slow = runs[means.index(max(means))]  # its phases: medians over its iterations
        modes[mode] = {"ranks": len(runs), "step_s": max(means), "per_rank_mean_s": means,
                       "times_per_rank_s": [r["times"] for r in runs],
                       "phases_median_s": {k: statistics.median(slow[k]) for k in
                                           ("forward", "backward", "waits", "optimizer")}}
        if any(any(r["waits"]) for r in runs):
            modes[mode]["sync_waits_per_rank_s"] = [r["waits"] for r in runs]
            modes[mode]["sync_wait_median_s"] = statistics.median(
                max(w) for w in zip(*(r["waits"] for r in runs)))
    t1, busy1, ours1 = _cpu()
    out = {"status": "ok", "modes": modes, "params": ranks[0]["params"], "wall_s": t1 - t0,
           # cores' worth of CPU that other processes used while this job ran (approximate)
           "foreign_cores": max(0.0, (busy1 - busy0) - (ours1 - ours0)) / (t1 - t0)}
    for mode, v in modes.items():
        print(f"  {mode:22s} {v['step_s'] * 1e3:8.1f} ms", flush=True)
    print(f"  ({out['wall_s']:.0f} s; other processes used {out['foreign_cores']:.2f} cores "
          "meanwhile)", flush=True)
    return out


def _med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def per_round(job: dict[str, Any], method: str) -> dict[str, float | None]:
    """One method's figures from one job."""
    m = {k: v["step_s"] for k, v in job["modes"].items()}
    s1, s2, c2 = m[f"{method} x1"], m[f"{method} x2"], m["compute x2"]
    alone = m["alone-gloo x2" if "gloo" in method else "alone-pyring x2"]
    exposed = s2 - c2
    gloo = m.get(f"{GLOO_PEER[method]} x2")
    lock = m["lockstep x2"]
    return {"step_1_s": s1, "step_2_s": s2, "compute_1_s": m["compute x1"], "compute_2_s": c2,
            "compute_scaling": m["compute x1"] / c2, "lockstep_2_s": lock,
            "lockstep_scaling": m["compute x1"] / lock, "alone_s": alone,
            "scaling_efficiency": s1 / s2, "exposed_s": exposed,
            "hidden_fraction": min(1.0, max(0.0, 1 - exposed / alone)),
            "sync_wait_s": job["modes"][f"{method} x2"].get("sync_wait_median_s"),
            "ddp_gloo_step_over_this": gloo / s2 if gloo else None,
            **{f"{k}_2_s": job["modes"][f"{method} x2"]["phases_median_s"][k] for k in PHASES},
            **{f"{name}_{k}_2_s": job["modes"][f"{name} x2"]["phases_median_s"][k]
               for name in ("compute", "lockstep") for k in PHASES},
            "lockstep_sync_2_s": job["modes"]["lockstep x2"]["phases_median_s"]["waits"]}


def summarize(jobs: list[dict[str, Any]], methods: list[str]) -> list[dict[str, Any]]:
    """A row per method: the median over rounds of every per-round figure, and the rounds."""
    ok = [j for j in jobs if j.get("status") == "ok"]
    rows = []
    for method in methods:
        per = [per_round(j, method) for j in ok]
        row: dict[str, Any] = {"method": method, "rounds_ok": len(per),
                               "rounds_failed": len(jobs) - len(per)}
        for key in (per[0] if per else {}):
            vals = [p[key] for p in per if p[key] is not None]
            row[key] = _med(vals)
            row[key + "_rounds"] = vals
        rows.append(row)
    return rows


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def print_table(rows: list[dict[str, Any]], cfg: dict[str, Any]) -> None:
    print(f"\n{cfg['params'] / 1e6:.2f} M parameters = {cfg['params'] * 4 / 1e6:.1f} MB of "
          f"float32 gradients; batch {cfg['batch']} x seq {cfg['seq']} per rank; 1 thread/rank"
          f"{'; ranks pinned to cores' if cfg['pin'] else ''}")
    cols = [("step 1r", "step_1_s", _ms), ("step 2r", "step_2_s", _ms),
            ("scaling", "scaling_efficiency", _pct), ("vs gloo", "ddp_gloo_step_over_this", _x),
            ("comp 2r", "compute_2_s", _ms), ("comp sc", "compute_scaling", _pct),
            ("lock sc", "lockstep_scaling", _pct),
            ("alone", "alone_s", _ms),
            ("exposed", "exposed_s", _ms), ("hidden", "hidden_fraction", _pct)]
    hdr = f"{'method':15s}" + "".join(f"{c:>10s}" for c, _, _ in cols)
    print(hdr + "\n" + "-" * len(hdr))
    for r in rows:
        if not r["rounds_ok"]:
            print(f"{r['method']:15s} FAILED in every round")
            continue
        print(f"{r['method']:15s}" + "".join(f"{f(r.get(k)):>10s}" for _, k, f in cols)
              + (f"  ({r['rounds_failed']} rounds FAILED)" if r["rounds_failed"] else ""))
        print(f"{'':15s} scaling per round: "
              + ", ".join(_pct(e) for e in r["scaling_efficiency_rounds"]))
        if r.get("sync_wait_s") is not None:
            print(f"{'':15s} synchronize() waited {_ms(r['sync_wait_s'])} ms per step (median, "
                  "slowest rank) for allreduces still in flight after backward")
    ok = [r for r in rows if r["rounds_ok"]]
    if ok:
        first = ok[0]
        print(f"{'bare model':15s} comp sc per round: "
              + ", ".join(_pct(e) for e in first["compute_scaling_rounds"])
              + "; lock sc per round: "
              + ", ".join(_pct(e) for e in first["lockstep_scaling_rounds"]))
        print(f"\n2 ranks, per phase (ms; the slowest rank's median iteration, median over "
              f"rounds)\n{'':15s}{'forward':>10s}{'backward':>10s}{'sync':>10s}{'optimizer':>10s}")
        phase_rows = [("bare model", first, "compute_", None),
                      ("lockstep", first, "lockstep_", first["lockstep_sync_2_s"])]
        phase_rows += [(r["method"], r, "", r["sync_wait_s"]) for r in ok]
        for label, r, pre, sync in phase_rows:
            print(f"{label:15s}{_ms(r[pre + 'forward_2_s']):>10s}"
                  f"{_ms(r[pre + 'backward_2_s']):>10s}{_ms(sync):>10s}"
                  f"{_ms(r[pre + 'optimizer_2_s']):>10s}")
    print("\n".join(f"{k} = {v}" for k, v in DEFINITIONS.items()))


DEFINITIONS = {
    "step": "the slowest rank's mean time per iteration (zero_grad, forward, backward, [sync], "
            "AdamW step), i.e. 1 / throughput; median over rounds",
    "scaling": "step(1 rank) / step(2 ranks) = throughput(2) / (2 x throughput(1)), same job "
               "(interleaved), per round; median over rounds",
    "vs gloo": "step(ddp-gloo[-copy], 2 ranks) / step(method, 2 ranks), same job; above 1 is "
               "faster than DDP on gloo",
    "comp 2r": "the bare model (no communication) on 2 ranks",
    "comp sc": "the bare model's scaling, compute(1 rank) / compute(2 ranks): the ceiling "
               "that sharing the machine's memory and caches leaves to every method",
    "lock sc": "the bare model's scaling when its ranks meet once per step (one 1-element "
               "pyring allreduce after backward, no gradients exchanged): compute(1 rank) / "
               "lockstep(2 ranks), the ceiling that synchronous steps leave to every method, "
               "however fast its exchange",
    "alone": "one allreduce of a flat float32 tensor of the gradients' size, 2 ranks, with the "
             "method's library (pyring's avg for pyring's methods, gloo's sum for DDP on gloo)",
    "exposed": "step(2 ranks) - comp 2r",
    "hidden": "1 - exposed / alone, clipped to [0, 1]",
    "phases": "forward includes zero_grad; DDP waits for its buckets inside backward, pyring's "
              "optimizer hook in synchronize() (sync)",
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--layers", type=int, default=5)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=2, help="sequences per rank per step")
    p.add_argument("--blocks", type=int, default=6, help="timed blocks per job")
    p.add_argument("--block", type=int, default=3,
                   help="timed iterations per mode and block (after one untimed)")
    p.add_argument("--warmup", type=int, default=1, help="untimed blocks per job")
    p.add_argument("--rounds", type=int, default=3,
                   help="every job runs this many times; figures are medians over rounds")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--pin", action="store_true",
                   help="bind rank r (all its threads) to the r-th usable core")
    p.add_argument("--timeout", type=float, default=120.0, help="collective deadline (s)")
    p.add_argument("--run-limit", type=float, default=600.0, help="per job, then killed (s)")
    p.add_argument("--default-malloc", action="store_true",
                   help="leave glibc's heap trimming on in the ranks (see MALLOC_ENV)")
    p.add_argument("--tag", default=socket.gethostname())
    p.add_argument("--out", default=None)
    args = p.parse_args()
    methods = [m for m in args.methods.split(",") if m]
    bad = sorted(set(methods) - set(METHODS))
    if bad:
        p.error(f"unknown methods {bad}; valid: {', '.join(METHODS)}")
    for k in ("blocks", "block", "rounds"):
        if getattr(args, k) < 1:
            p.error(f"--{k} must be >= 1")
    cfg = {k: getattr(args, k) for k in ("dim", "layers", "heads", "seq", "batch", "blocks",
                                         "block", "warmup", "timeout", "run_limit", "pin")}
    from machine import describe

    cfg["malloc_env"] = {} if args.default_malloc else MALLOC_ENV
    os.environ.update(cfg["malloc_env"])  # the spawned ranks inherit it

    load0 = os.getloadavg()
    if load0[0] > 1.5:
        print(f"warning: load average {load0[0]:.2f} at start: timings are not trustworthy")
    t0 = time.perf_counter()
    jobs = []
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}", flush=True)
        jobs.append(run(methods, cfg))
    ok = [j for j in jobs if j.get("status") == "ok"]
    cfg["params"] = ok[0]["params"] if ok else 0
    rows = summarize(jobs, methods)
    print_table(rows, cfg)
    tag = "".join(c if c.isalnum() or c in "-_." else "_" for c in args.tag)
    out = Path(args.out) if args.out else BENCH_DIR / "results" / f"training_{tag}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": "training", "command": sys.argv, "config": cfg, "machine": describe(),
           "loadavg_start": load0, "loadavg_end": os.getloadavg(),
           "wall_s": time.perf_counter() - t0, "rounds": jobs, "summary": rows,
           "definitions": DEFINITIONS}
    out.write_text(json.dumps(doc, indent=1))
    print(f"\nwrote {out} ({doc['wall_s']:.0f} s)")
    if len(ok) < len(jobs):
        sys.exit(1)


if __name__ == "__main__":
    main()
