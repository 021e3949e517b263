#!/usr/bin/env python
"""Training-step benchmark: pyring's optimizer hook vs DDP on the pyring backend vs DDP on
gloo, side by side, at 1 and 2 local ranks (one torch thread per rank, fixed batch per rank).

    PYTHONPATH=. python bench/training.py                   # ~6 minutes on 2 cores
    PYTHONPATH=. python bench/training.py --steps 4 --dim 128 --layers 2     # smoke test

Workload: examples/train.py's CharGPT scaled up (default 5 layers x 512: 16.1 M parameters,
64.2 MB of float32 gradients), AdamW, random tokens. Runs, each on freshly spawned ranks:
  compute   1 and 2 ranks, no communication at all (2 ranks run side by side, independently)
  alone     2 ranks, one allreduce (avg) of a flat tensor of the gradients' size, nothing else:
            pyring (comm.all_reduce) and gloo (dist.all_reduce)
  methods   pyring      pyring.DistributedOptimizer (25 MiB buckets, gradients as bucket
                        views), synchronize() then step()
            ddp-pyring  DistributedDataParallel(gradient_as_bucket_view=True) on the "pyring"
                        backend (DDP's 25 MiB buckets)
            ddp-gloo    the same DDP on gloo
            ddp-pyring-copy, ddp-gloo-copy: DDP with its defaults (gradients copied into the
                        buckets and back)
            each at 1 and 2 ranks.
A run's step = the slowest rank's mean iteration time over its timed iterations (after
warm-up), i.e. 1 / its throughput: ranks that wait for each other in turn would make a
per-iteration maximum overstate it (the JSON keeps that median too, and every iteration's
time). The plan runs --rounds times, interleaved, so that a
method's 1- and 2-rank runs go one after the other; a run's step is its median over rounds, and
ratios are taken within a round, then their median over rounds is reported (the machine's speed
drifts between rounds). Every run reports how many cores' worth of CPU other processes used
meanwhile (from /proc/stat, minus this benchmark's own processes).
Every rank runs with glibc's heap trimming off (MALLOC_ENV; --default-malloc leaves it on), so
that freed memory is reused without fresh page faults in every method alike.
Definitions printed under the table:
  scaling efficiency = throughput(2) / (2 * throughput(1)) = step(1) / step(2), same method
  vs gloo = step(DDP on gloo, same DDP options, 2 ranks) / step(method, 2 ranks): above 1 means
            faster than DDP on gloo (ddp-gloo for pyring's hook)
  exposed comm = step(2) - compute(2)   [compute(2): 2 ranks without communication]
  hidden fraction = 1 - exposed / alone, clipped to [0, 1]   [alone: the method's library]
The JSON also holds the variant with compute(1) in place of compute(2).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
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

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import train  # noqa: E402  examples/train.py: model, launcher
from scaling import median_run  # noqa: E402

import pyring  # noqa: E402

# Set for every rank of every run unless --default-malloc: glibc then never hands freed heap
# memory back to the system, so a step's temporaries (AdamW's, autograd's) do not page-fault
# afresh each step, a cost that otherwise lands on whichever rank's heap happens to be trimmed.
MALLOC_ENV = {"MALLOC_TRIM_THRESHOLD_": str(16 << 30), "MALLOC_MMAP_THRESHOLD_": str(4 << 30)}
METHODS = ("pyring", "ddp-pyring", "ddp-gloo", "ddp-pyring-copy", "ddp-gloo-copy")
ALONE_LIB = {"pyring": "pyring", "ddp-pyring": "pyring", "ddp-gloo": "gloo",
             "ddp-pyring-copy": "pyring", "ddp-gloo-copy": "gloo"}
GLOO_PEER = {m: "ddp-gloo-copy" if m.endswith("-copy") else "ddp-gloo" for m in METHODS}


def _worker(rank: int, world: int, port: int, kind: str, cfg: dict[str, Any]) -> None:
    """One rank of one run; leaves {"times": [...], ...} in the store under result/<rank>."""
    train.watch_parent()
    torch.set_num_threads(1)
    timeout = cfg["timeout"]
    td = datetime.timedelta(seconds=timeout)
    store = dist.TCPStore("127.0.0.1", port, world + 1, is_master=False, timeout=td)
    comm = None
    if kind in ("pyring", "alone-pyring"):
        comm = pyring.init(rank, world, store, timeout=timeout)
    elif kind != "compute":
        backend = "pyring" if kind.startswith("ddp-pyring") else "gloo"
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=td)
    store.set(f"ready/{rank}", "1")
    store.wait([f"ready/{r}" for r in range(world)], td)  # start side by side

    torch.manual_seed(0)
    model = train.CharGPT(cfg["dim"], cfg["layers"], cfg["heads"], cfg["seq"])
    n = sum(p.numel() for p in model.parameters())
    times, waits = [], []
    if kind.startswith("alone-"):
        flat = torch.ones(n)
        for _ in range(cfg["warmup"] + cfg["comm_iters"]):
            t0 = time.perf_counter()
            if comm is not None:
                comm.all_reduce(flat, op="avg")
            else:
                dist.all_reduce(flat)
            times.append(time.perf_counter() - t0)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        net = model
        if kind == "pyring":
            opt = pyring.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                              bucket_bytes=25 << 20)
        elif kind != "compute":
            net = torch.nn.parallel.DistributedDataParallel(
                model, gradient_as_bucket_view=not kind.endswith("-copy"))
        gen = torch.Generator().manual_seed(rank)
        shape = (cfg["batch"], cfg["seq"])
        for _ in range(cfg["warmup"] + cfg["steps"]):
            x, y = torch.randint(0, 256, shape, generator=gen), torch.randint(0, 256, shape,
                                                                               generator=gen)
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            net(x, y).backward()
            if kind == "pyring":
                tw = time.perf_counter()
                opt.synchronize()
                waits.append(time.perf_counter() - tw)
            opt.step()
            times.append(time.perf_counter() - t0)
    w = cfg["warmup"]
    store.set(f"result/{rank}", json.dumps({"times": times[w:], "waits": waits[w:],
                                            "params": n}))
    if comm is not None:
        pyring.destroy()
    elif dist.is_initialized():
        dist.destroy_process_group()


def _cpu() -> tuple[float, float, float]:
    """(now, CPU seconds the whole machine was busy, CPU seconds of this process and its
    reaped children) for measuring the load other processes put on the machine."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    ours = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    return time.perf_counter(), (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK"), ours


def run(kind: str, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """Spawns one run; returns its summary, or {"status": "failed", "error": ...}."""
    t0, busy0, ours0 = _cpu()
    try:
        store = train.launch(_worker, world, (kind, cfg), cfg["run_limit"])
        ranks = [json.loads(store.get(f"result/{r}")) for r in range(world)]
    except Exception as e:  # a failing or hanging method is reported; the others go on
        lines = [ln for ln in str(e).splitlines() if re.match(r"^[\w.]+(Error|Exception|"
                                                             r"Timeout)\b", ln)]
        msg = lines[-1] if lines else f"{type(e).__name__}: {str(e).strip()[:300]}"
        print(f"  {kind} x{world}: FAILED ({msg})", flush=True)
        return {"status": "failed", "error": f"{type(e).__name__}: {e}"}
    slowest = [max(it) for it in zip(*(r["times"] for r in ranks))]
    out = {"status": "ok", "world": world,
           "step_s": max(statistics.fmean(r["times"]) for r in ranks),
           "median_iter_max_s": statistics.median(slowest),
           "min_s": min(slowest), "max_s": max(slowest), "iters": len(slowest),
           "per_rank_median_s": [statistics.median(r["times"]) for r in ranks],
           "times_per_rank_s": [r["times"] for r in ranks],
           "params": ranks[0]["params"]}
    t1, busy1, ours1 = _cpu()
    out["wall_s"] = t1 - t0
    # Cores' worth of CPU that other processes used while this run went (approximate).
    out["foreign_cores"] = max(0.0, (busy1 - busy0) - (ours1 - ours0)) / (t1 - t0)
    if ranks[0]["waits"]:
        out["sync_wait_median_s"] = statistics.median(max(it) for it in
                                                      zip(*(r["waits"] for r in ranks)))
    print(f"  {kind} x{world}: step {out['step_s'] * 1e3:.1f} ms over {len(slowest)} "
          f"iterations ({out['wall_s']:.0f} s; other processes used "
          f"{out['foreign_cores']:.2f} cores meanwhile)", flush=True)
    return out


def _paired(rounds: dict[str, list[dict[str, Any]]], num: str, den: str) -> list[float]:
    """num/den of the median steps of two runs, per round where both succeeded."""
    out = []
    for a, b in zip(rounds.get(num, []), rounds.get(den, [])):
        if a.get("status") == "ok" and b.get("status") == "ok":
            out.append(a["step_s"] / b["step_s"])
    return out


def _med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summarize(res: dict[str, Any], rounds: dict[str, list[dict[str, Any]]]
              ) -> list[dict[str, Any]]:
    med = {k: v.get("step_s") for k, v in res.items() if v.get("status") == "ok"}
    c1, c2 = med.get("compute x1"), med.get("compute x2")
    rows = []
    for m in (m for m in METHODS if f"{m} x1" in res or f"{m} x2" in res):
        s1, s2 = med.get(f"{m} x1"), med.get(f"{m} x2")
        alone = med.get(f"alone-{ALONE_LIB[m]} x2")
        effs = _paired(rounds, f"{m} x1", f"{m} x2")
        vs_gloo = _paired(rounds, f"{GLOO_PEER[m]} x2", f"{m} x2")
        row: dict[str, Any] = {"method": m, "step_1_s": s1, "step_2_s": s2, "alone_s": alone,
                               "failed": [k for k in (f"{m} x1", f"{m} x2")
                                          if res.get(k, {}).get("status") != "ok"],
                               "scaling_efficiency": _med(effs),
                               "scaling_efficiency_rounds": effs,
                               "ddp_gloo_step_over_this_rounds": vs_gloo,
                               "ddp_gloo_step_over_this": _med(vs_gloo)}
        for name, base in (("", c2), ("_vs_compute1", c1)):
            exposed = s2 - base if s2 and base else None
            row["exposed_s" + name] = exposed
            row["hidden_fraction" + name] = (min(1.0, max(0.0, 1 - exposed / alone))
                                             if exposed is not None and alone else None)
        rows.append(row)
    return rows


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}"


def print_table(rows: list[dict[str, Any]], res: dict[str, Any], cfg: dict[str, Any]) -> None:
    print(f"\n{cfg['params'] / 1e6:.2f} M parameters = {cfg['params'] * 4 / 1e6:.1f} MB of "
          f"float32 gradients; batch {cfg['batch']} x seq {cfg['seq']} per rank; 1 thread/rank")
    for k in ("compute x1", "compute x2", "alone-pyring x2", "alone-gloo x2"):
        print(f"  {k:16s} {_ms(res[k].get('step_s')):>8s} ms" if res[k]["status"] == "ok"
              else f"  {k:16s}   FAILED")
    busy = [k for k, v in res.items() if v.get("foreign_cores", 0) > 0.1]
    if busy:
        print(f"  warning: other processes used > 0.1 core during {', '.join(busy)}")
    hdr = (f"\n{'method':12s} {'step 1r ms':>10s} {'step 2r ms':>10s} {'scaling':>8s} "
           f"{'vs gloo':>8s} {'alone ms':>9s} {'exposed ms':>10s} {'hidden':>7s}")
    print(hdr)
    print("-" * (len(hdr) - 1))
    for r in rows:
        eff = "-" if r["scaling_efficiency"] is None else f"{100 * r['scaling_efficiency']:.0f}%"
        hid = "-" if r["hidden_fraction"] is None else f"{100 * r['hidden_fraction']:.0f}%"
        note = f"  FAILED: {', '.join(r['failed'])}" if r["failed"] else ""
        vs = "-" if r["ddp_gloo_step_over_this"] is None else f"{r['ddp_gloo_step_over_this']:.2f}x"
        print(f"{r['method']:12s} {_ms(r['step_1_s']):>10s} {_ms(r['step_2_s']):>10s} "
              f"{eff:>8s} {vs:>8s} {_ms(r['alone_s']):>9s} {_ms(r['exposed_s']):>10s} "
              f"{hid:>7s}{note}")
        effs = ", ".join(f"{100 * e:.0f}%" for e in r["scaling_efficiency_rounds"])
        print(f"{'':12s} scaling per round: {effs}")
    sw = res.get("pyring x2", {}).get("sync_wait_median_s")
    if sw is not None:
        print(f"pyring x2: opt.synchronize() waited {sw * 1e3:.1f} ms per step (median, slowest "
              "rank) for allreduces still in flight after backward")
    print("step = the slowest rank's mean time per iteration (zero_grad, forward, "
          "backward, [sync], AdamW step), then median over rounds\nscaling = step(1 rank) / "
          "step(2 ranks) = throughput(2) / (2 x throughput(1)), per round, median over rounds"
          "\nvs gloo = step(ddp-gloo[-copy], 2 ranks) / step(method, 2 ranks), per round, median"
          "\nalone = one allreduce of the gradients' size "
          "with the method's library, 2 ranks, nothing else running\nexposed = step(2 ranks) - "
          "compute(2 ranks, no communication); hidden = 1 - exposed / alone, clipped to [0, 1]")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--layers", type=int, default=5)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=2, help="sequences per rank per step")
    p.add_argument("--steps", type=int, default=10, help="timed steps per run")
    p.add_argument("--rounds", type=int, default=5,
                   help="the whole plan runs this many times; figures are medians over rounds")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--comm-iters", type=int, default=10)
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--timeout", type=float, default=120.0, help="collective deadline (s)")
    p.add_argument("--run-limit", type=float, default=300.0, help="per run, then killed (s)")
    p.add_argument("--default-malloc", action="store_true",
                   help="leave glibc's heap trimming on in the ranks (see MALLOC_ENV)")
    p.add_argument("--tag", default=socket.gethostname())
    p.add_argument("--out", default=None)
    args = p.parse_args()
    methods = [m for m in args.methods.split(",") if m]
    bad = sorted(set(methods) - set(METHODS))
    if bad:
        p.error(f"unknown methods {bad}; valid: {', '.join(METHODS)}")
    cfg = {k: getattr(args, k) for k in ("dim", "layers", "heads", "seq", "batch", "steps",
                                         "warmup", "comm_iters", "timeout", "run_limit")}
    from machine import describe

    cfg["malloc_env"] = {} if args.default_malloc else MALLOC_ENV
    os.environ.update(cfg["malloc_env"])  # the spawned ranks inherit it

    load0 = os.getloadavg()
    if load0[0] > 1.5:
        print(f"warning: load average {load0[0]:.2f} at start: timings are not trustworthy")
    plan = [("compute", 1), ("compute", 2), ("alone-pyring", 2), ("alone-gloo", 2)]
    plan += [(m, w) for m in methods for w in (1, 2)]
    t0 = time.perf_counter()
    rounds: dict[str, list[dict[str, Any]]] = {f"{k} x{w}": [] for k, w in plan}
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}", flush=True)
        for kind, world in plan:
            rounds[f"{kind} x{world}"].append(run(kind, world, cfg))
    # Per run: the round with the median step, all rounds kept.
    res = {key: dict(median_run(rs), rounds=rs) for key, rs in rounds.items()}
    ok = [v for v in res.values() if v.get("status") == "ok"]
    cfg["params"] = ok[0]["params"] if ok else 0
    rows = summarize(res, rounds)
    print_table(rows, res, cfg)
    tag = "".join(c if c.isalnum() or c in "-_." else "_" for c in args.tag)
    out = Path(args.out) if args.out else BENCH_DIR / "results" / f"training_{tag}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"command": sys.argv, "config": cfg, "machine": describe(),
           "loadavg_start": load0, "loadavg_end": os.getloadavg(),
           "wall_s": time.perf_counter() - t0, "runs": res, "summary": rows,
           "definitions": {
               "step_s": "the slowest rank's mean iteration time over its timed iterations "
                         "(its timed wall time / iterations: 1 / throughput); "
                         "median_iter_max_s: median over iterations of the slowest rank's time",
               "step_1_s/step_2_s": "median over rounds of the run's median step",
               "scaling_efficiency": "step(1 rank) / step(2 ranks), same method and round; "
                                     "median over rounds",
               "ddp_gloo_step_over_this": "step(ddp-gloo, 2) / step(method, 2), same round "
                                          "(ddp-gloo-copy for ddp-pyring-copy); "
                                          "median over rounds",
               "alone": "allreduce (avg) of a flat float32 tensor of the gradients' size, "
                        "2 ranks, with the method's library (pyring for both pyring methods)",
               "exposed_s": "step(2) - compute(2 ranks, no communication)",
               "hidden_fraction": "1 - exposed / alone, clipped to [0, 1]",
               "*_vs_compute1": "the same with compute(1 rank) as the baseline"}}
    out.write_text(json.dumps(doc, indent=1))
    print(f"\nwrote {out} ({doc['wall_s']:.0f} s)")
    if any(v.get("status") != "ok" for v in res.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
