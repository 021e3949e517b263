"""bench/training.py --mode step: jobs of two ranks that time every method in every mode,
interleaved in blocks, so that the machine's drift (seconds to minutes on a shared VM) hits
every method and mode alike and ratios are taken side by side.

Modes of a job (each block runs every mode once, in an order rotated per block):
  <method> x2     the method at 2 ranks
  <method> x1     the method at 1 rank: rank 0 alone, on a 1-rank communicator or process
                  group of its own, while rank 1 sleeps in a store wait
  compute x2/x1   the bare model on both ranks / on rank 0 alone
  lockstep x2     the bare model on both ranks meeting once per step (bench/_train_step.py)
  alone-<lib> x2  one allreduce of the gradients' size on both ranks, with pyring or gloo
                  (bench/_train_step.py's Alone), nothing else running
Each mode has its own model and optimizer (all from the same seed). The first iteration of a
mode in each block is untimed (it runs on caches the other modes left), and so are the
--warmup blocks. Runs on the CPU.
"""

from __future__ import annotations

import datetime
import os
import resource
import statistics
import time
from typing import Any

import torch.distributed as dist
from _ranks import KEEP, failure, launch, setup_rank
from _train_step import FIELDS, LIB, Alone, Batches, Trainer

import pyring
from pyring.runtime.rendezvous import store_barrier

WORLD = 2


def modes_for(methods: list[str]) -> list[str]:
    out = [f"{m} x{w}" for m in methods for w in (2, 1)]
    libs = sorted({LIB[m] for m in methods})
    return [*out, "compute x2", "compute x1", "lockstep x2", *(f"alone-{lib} x2" for lib in libs)]


def job_rank(
    rank: int, world: int, store: Any, methods: list[str], cfg: dict[str, Any]
) -> dict[str, Any]:
    """One rank of a job: {"modes": {mode: {field: [...] for field in FIELDS}}, "params": n}."""
    assert world == WORLD, "a job has two ranks"
    dev = setup_rank(rank, cfg)
    timeout, everyone = cfg["timeout"], list(range(world))
    td = datetime.timedelta(seconds=timeout)
    # Every rank creates every group, in the same order (torch.distributed requires it).
    dist.init_process_group(
        "gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=world, timeout=td
    )
    groups = {("gloo", 2): None, ("gloo", 1): dist.new_group([0], backend="gloo")}
    if any(m.startswith("ddp-pyring") for m in methods):
        groups[("pyring", 2)] = dist.new_group(backend="pyring")
        groups[("pyring", 1)] = dist.new_group([0], backend="pyring")
    comm = pyring.init(rank, world, dist.PrefixStore("pair", store), timeout=timeout)
    solo = (
        pyring.init(0, 1, dist.PrefixStore("solo", store), timeout=timeout, set_default=False)
        if rank == 0
        else None
    )

    modes = modes_for(methods)
    by_mode: dict[str, Any] = {}
    for mode in modes:
        method, ranks = mode.split(" x")[0], int(mode[-1])
        if method.startswith("alone-") or (ranks == 1 and rank != 0):
            continue
        if method in ("compute", "lockstep", "pyring"):
            by_mode[mode] = Trainer(method, cfg, dev, comm=comm if ranks == 2 else solo)
        else:
            by_mode[mode] = Trainer(method, cfg, dev, group=groups[(LIB[method], ranks)])
    n = by_mode["compute x2"].params
    for lib in {LIB[m] for m in methods}:
        by_mode[f"alone-{lib} x2"] = Alone(lib, n, dev, comm=comm)
    batches = Batches(cfg, rank, world, dev)
    KEEP.extend([comm, solo, groups, by_mode])

    out: dict[str, dict[str, list[float]]] = {m: {k: [] for k in FIELDS} for m in modes}
    store_barrier(store, "ready", rank, everyone, timeout)
    for b in range(cfg["warmup"] + cfg["blocks"]):
        timed = b >= cfg["warmup"]
        for k in range(len(modes)):
            mode = modes[(b + k) % len(modes)]
            one_rank = mode.endswith("x1")
            if not one_rank:
                store_barrier(store, f"go/{b}/{mode}", rank, everyone, timeout)
            elif rank != 0:  # rank 0 runs it alone; this rank sleeps until it is done
                store.wait([f"done/{b}/{mode}"], datetime.timedelta(seconds=cfg["run_limit"]))
                continue
            for i in range(cfg["block"] + 1):
                values = by_mode[mode].step(batches)
                if timed and i > 0:
                    for field, v in zip(FIELDS, values):
                        out[mode][field].append(v)
            if one_rank:
                store.set(f"done/{b}/{mode}", "1")
    store_barrier(store, "finished", rank, everyone, timeout)
    return {"modes": out, "params": n}


def _cpu() -> tuple[float, float, float]:
    """(now, CPU seconds the whole machine was busy, CPU seconds of this process and its
    reaped children) for measuring the load other processes put on the machine."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    ours = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    return time.perf_counter(), (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK"), ours


def run_job(methods: list[str], cfg: dict[str, Any]) -> dict[str, Any]:
    """Spawns one job; returns its modes' figures, or {"status": "failed", "error": ...}.
    A mode's step_s is the slowest rank's mean over its timed iterations."""
    t0, busy0, ours0 = _cpu()
    try:
        ranks = launch(job_rank, WORLD, methods, cfg, timeout=cfg["run_limit"])
    except Exception as e:  # reported; the other rounds go on
        res = failure(e)
        print(f"  FAILED ({res['error']})", flush=True)
        return res
    modes = {}
    for mode in modes_for(methods):
        runs = [r["modes"][mode] for r in ranks if r["modes"][mode]["step"]]
        means = [statistics.fmean(r["step"]) for r in runs]
        slow = runs[means.index(max(means))]  # its phases: medians over its iterations
        modes[mode] = {
            "ranks": len(runs),
            "step_s": max(means),
            "per_rank_mean_s": means,
            "times_per_rank_s": [r["step"] for r in runs],
            "phases_median_s": {k: statistics.median(slow[k]) for k in FIELDS[1:]},
        }
        if any(any(r["waits"]) for r in runs):
            modes[mode]["sync_waits_per_rank_s"] = [r["waits"] for r in runs]
            modes[mode]["sync_wait_median_s"] = statistics.median(
                max(w) for w in zip(*(r["waits"] for r in runs))
            )
    t1, busy1, ours1 = _cpu()
    out = {
        "status": "ok",
        "modes": modes,
        "params": ranks[0]["params"],
        "wall_s": t1 - t0,
        # cores' worth of CPU that other processes used while this job ran (approximate)
        "foreign_cores": max(0.0, (busy1 - busy0) - (ours1 - ours0)) / (t1 - t0),
    }
    for mode, v in modes.items():
        print(f"  {mode:22s} {v['step_s'] * 1e3:8.1f} ms", flush=True)
    print(
        f"  ({out['wall_s']:.0f} s; other processes used {out['foreign_cores']:.2f} cores "
        "meanwhile)",
        flush=True,
    )
    return out


def run(methods: list[str], cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """The --rounds jobs, one after the other."""
    jobs = []
    for r in range(cfg["rounds"]):
        print(f"round {r + 1}/{cfg['rounds']}", flush=True)
        jobs.append(run_job(methods, cfg))
    return jobs
