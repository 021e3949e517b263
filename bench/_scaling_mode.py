"""bench/training.py --mode scaling: training speedup against the number of ranks. Each run is
one kind at N ranks in fresh processes:
  compute xN      N ranks side by side, no communication
  alone-LIB xN    one allreduce of the gradients' size with LIB (bench/_train_step.py's Alone)
  METHOD xN       the method's training step (bench/_train_step.py)
Spawned locally (one store per run), or under torchrun: every torchrun rank runs each kind in
a child process of its own, meeting through torchrun's store under one key prefix per kind and
repeat. A run that fails or outlives cfg["run_limit"] is reported and skipped.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import time
from typing import Any

import torch.distributed as dist
from _ranks import KEEP, failure, launch, setup_rank
from _train_step import FIELDS, LIB, Alone, Batches, Trainer, gradient_elements

import pyring
from pyring.runtime.rendezvous import store_barrier
from pyring.tools.timing import slowest_per_iteration

# A run's JSON name for each field's median over iterations (of the slowest rank's times).
RUN_FIELDS = {
    "step": "median_iter_max_s",
    "forward": "fwd_s",
    "backward": "bwd_s",
    "waits": "wait_s",
    "optimizer": "optimizer_s",
}


def run_rank(
    rank: int, world: int, store: Any, kind: str, cfg: dict[str, Any], local_rank: int | None = None
) -> dict[str, Any]:
    """One rank of one run: per-iteration lists in seconds ("step" only for alone-LIB)."""
    dev = setup_rank(rank if local_rank is None else local_rank, cfg)
    comm = None
    if kind in ("pyring", "pyring-private", "alone-pyring"):
        comm = pyring.init(rank, world, store, timeout=cfg["timeout"])
    elif kind != "compute":  # ddp-X and alone-X: torch.distributed on backend X
        dist.init_process_group(
            LIB[kind] if kind in LIB else kind.removeprefix("alone-"),
            store=store,
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=cfg["timeout"]),
        )
    n = gradient_elements(cfg)
    if kind.startswith("alone-"):
        job, iters, kept = Alone(kind.removeprefix("alone-"), n, dev, comm), "comm_iters", ["step"]
    else:
        job, iters, kept = Trainer(kind, cfg, dev, comm=comm), "steps", FIELDS
    batches = Batches(cfg, rank, world, dev)
    KEEP.extend([comm, job])
    out: dict[str, Any] = {k: [] for k in kept}
    everyone = list(range(world))
    store_barrier(store, "ready", rank, everyone, cfg["timeout"])  # start side by side
    for i in range(cfg["warmup"] + cfg[iters]):
        values = dict(zip(FIELDS, job.step(batches)))
        if i >= cfg["warmup"]:
            for k in out:
                out[k].append(values[k])
    store_barrier(store, "finished", rank, everyone, cfg["timeout"])
    return {"params": n, "device": str(dev), **out}


def summarize_run(ranks: list[dict[str, Any]], world: int, wall: float) -> dict[str, Any]:
    """A run's figures from its ranks' lists: step_s = the slowest rank's mean iteration;
    per field, the median over iterations of the slowest rank's time in that iteration."""
    out: dict[str, Any] = {
        "status": "ok",
        "world": world,
        "params": ranks[0]["params"],
        "device": ranks[0]["device"],
        "wall_s": round(wall, 2),
    }
    per_iter = {k: slowest_per_iteration([r[k] for r in ranks]) for k in FIELDS if k in ranks[0]}
    for k, times in per_iter.items():
        out[RUN_FIELDS[k]] = statistics.median(times)
    means = [statistics.fmean(r["step"]) for r in ranks]
    out.update(
        iters=len(per_iter["step"]),
        min_s=min(per_iter["step"]),
        max_s=max(per_iter["step"]),
        per_rank_median_s=[statistics.median(r["step"]) for r in ranks],
        per_rank_mean_s=means,
        step_s=max(means),
    )
    return out


def median_run(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's repeats -> the repeat with the median step (upper median; failures count
    only when every repeat failed), with every repeat's step kept under "repeat_step_s"."""
    ok = sorted((r for r in reps if r.get("status") == "ok"), key=lambda r: r["step_s"])
    if not ok:
        return reps[-1]
    return dict(ok[len(ok) // 2], repeat_step_s=[r.get("step_s") for r in reps], repeats=len(reps))


def progress(key: str, res: dict[str, Any], done: int = 0, total: int = 0) -> None:
    text = (
        f"step {res['step_s'] * 1e3:9.1f} ms  ({res['iters']} iterations, {res['wall_s']:.0f} s)"
        if res["status"] == "ok"
        else f"FAILED: {res['error']}"
    )
    print(f"{f'[{done}/{total}] ' if total else ''}{key:18s} {text}", flush=True)


def kinds_at(world: int, methods: list[str]) -> list[str]:
    """The runs at one world size, in order: compute, then (N > 1) alone-LIB and methods."""
    libs = [f"alone-{lib}" for lib in dict.fromkeys(LIB[m] for m in methods)]
    return ["compute", *libs, *methods] if world > 1 else ["compute"]


def run_local(worlds: list[int], methods: list[str], cfg: dict[str, Any]) -> dict[str, Any]:
    """Every run of the plan, --repeats times interleaved; each run's median repeat."""
    plan = [(k, n) for n in worlds for k in kinds_at(n, methods)] * cfg["repeats"]
    print(
        f"{len(plan)} runs: ranks {worlds}, methods {methods}, {cfg['repeats']} "
        f"repeat(s), {cfg['gpus'] or 'no'} GPUs",
        flush=True,
    )
    reps: dict[str, list[dict[str, Any]]] = {}
    for i, (kind, n) in enumerate(plan, 1):
        t0 = time.perf_counter()
        try:
            ranks = launch(run_rank, n, kind, cfg, timeout=cfg["run_limit"])
            res = summarize_run(ranks, n, time.perf_counter() - t0)
        except Exception as e:  # the run is reported and skipped; the others go on
            res = failure(e)
        reps.setdefault(f"{kind} x{n}", []).append(res)
        progress(f"{kind} x{n}", res, i, len(plan))
    return {k: median_run(v) for k, v in reps.items()}


def run_torchrun(kinds: list[str], cfg: dict[str, Any]) -> dict[str, Any]:
    """Every kind in turn at WORLD_SIZE ranks, --repeats times; on rank 0 the runs (each its
    median repeat), elsewhere {}. Each torchrun rank leaves its result, or its failure, in
    torchrun's store for rank 0."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    base = dist.TCPStore(
        host, port, is_master=False, timeout=datetime.timedelta(seconds=cfg["run_limit"] + 60)
    )
    reps: dict[str, list[dict[str, Any]]] = {}
    for i, kind in enumerate(kinds * cfg["repeats"]):
        prefix = f"pyring-scaling/{kind}/{i // len(kinds)}"
        t0 = time.perf_counter()
        try:
            mine = launch(
                run_rank,
                world,
                kind,
                cfg,
                local_rank,
                timeout=cfg["run_limit"],
                ranks=[rank],
                store=(host, port, prefix),
            )[0]
        except Exception as e:
            mine = failure(e)
        store = dist.PrefixStore(prefix, base)
        store.set(f"result/{rank}", json.dumps(mine))
        if rank == 0:
            ranks = [json.loads(store.get(f"result/{r}")) for r in range(world)]
            bad = [r for r in ranks if r.get("status") == "failed"]
            res = bad[0] if bad else summarize_run(ranks, world, time.perf_counter() - t0)
            reps.setdefault(f"{kind} x{world}", []).append(res)
            progress(f"{kind} x{world}", res)
    return {k: median_run(v) for k, v in reps.items()}


def summarize(runs: dict[str, Any], batch: int, methods: tuple[str, ...]) -> list[dict[str, Any]]:
    """Table rows: per N the compute baseline, then each method that ran at N."""

    def step(kind: str, n: int) -> float | None:
        r = runs.get(f"{kind} x{n}", {})
        return r.get("step_s") if r.get("status") == "ok" else None

    worlds = sorted({int(k.rsplit("x", 1)[1]) for k in runs})
    ran = [m for m in methods if any(k.startswith(m + " ") for k in runs)]
    base = step("compute", 1)
    rows = []
    for n in worlds:
        comp = step("compute", n)
        for m in ["compute", *ran]:
            key = f"{m} x{n}"
            if key not in runs:
                continue
            s = step(m, n)
            row: dict[str, Any] = {
                "method": m,
                "ranks": n,
                "step_s": s,
                "error": runs[key].get("error"),
                "samples_per_s": n * batch / s if s else None,
                "speedup": n * base / s if s and base else None,
            }
            row["efficiency"] = row["speedup"] / n if row["speedup"] else None
            if m == "compute":
                row["contention"] = s / base if s and base else None
            else:
                comm = step(f"alone-{LIB[m]}", n) if n > 1 else 0.0
                exposed = s - comp if s and comp else None
                row.update(
                    comm_s=comm,
                    exposed_s=exposed,
                    sync_wait_s=runs[key].get("wait_s") if m == "pyring" else None,
                )
                if comm and exposed is not None:
                    row["overlap_raw"] = 1 - exposed / comm
                    row["overlap"] = min(1.0, max(0.0, row["overlap_raw"]))
            rows.append(row)
    return rows
