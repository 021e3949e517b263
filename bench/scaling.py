#!/usr/bin/env python
"""Training speedup against the number of ranks, for every gradient-sync method available.

    PYTHONPATH=. python bench/scaling.py                  # 1 and 2 CPU ranks here, < 5 min
    PYTHONPATH=. python bench/scaling.py --ranks 1,2,4,8  # one server, one rank per GPU
    PYTHONPATH=. torchrun --nnodes 4 --nproc-per-node 8 ... bench/scaling.py --tag c  # 32 ranks
    python bench/scaling.py --merge bench/results/scaling_c1.json bench/results/scaling_c_w32.json

Workload: examples/train.py's CharGPT and corpus, AdamW, a fixed batch per rank (weak
scaling), --threads per rank, one rank per GPU where there are GPUs (pyring takes CPU tensors
only: its methods then fail and are reported). Runs, each in fresh processes (DEFINITIONS
defines the numbers): compute xN: N ranks side by side, no communication; alone-LIB xN: one
allreduce of the gradients' size with LIB (pyring, gloo, nccl), nothing else running; METHOD
xN: pyring (pyring.DistributedOptimizer, buckets overlap backward), ddp-pyring, ddp-gloo,
ddp-nccl (DDP on that backend; nccl needs >= 2 GPUs). A run that fails or hangs (--run-limit)
is reported and skipped. The plan runs --repeats times, interleaved, and each run reports the
repeat with the median step (all repeats' steps are kept in the JSON). Writes
bench/results/scaling_<tag>.json (torchrun: ..._w<N>.json) and a PNG of speedup against ranks
with the ideal line.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import re
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
import train  # noqa: E402  examples/train.py: CharGPT, corpus, launcher
from _scaling_report import plot, print_table  # noqa: E402
from machine import describe  # noqa: E402  bench/machine.py

import pyring  # noqa: E402

METHODS = ("pyring", "ddp-pyring", "ddp-gloo", "ddp-nccl")
LIB = {"pyring": "pyring", "ddp-pyring": "pyring", "ddp-gloo": "gloo", "ddp-nccl": "nccl"}
_KEEP: list[Any] = []  # objects measure() must never free (see run_rank)
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0  # one rank per GPU
DEFINITIONS = {  # the contract of every reported number
    "step": "the slowest rank's mean iteration time over its timed iterations (s), i.e. "
            "1 / its throughput; of the repeats, the median one (median_iter_max_s: median "
            "over iterations of the slowest rank's time)",
    "samples_per_s": "ranks * batch / step",
    "speedup": "samples_per_s / samples_per_s of 'compute x1' (one rank, no communication)",
    "efficiency": "speedup / ranks",
    "contention": "compute(N) / compute(1): slowdown of the computation from sharing the box",
    "comm_s": "one allreduce of the gradients' size with the method's library, N ranks, alone",
    "exposed_s": "step(method, N) - step(compute, N)",
    "overlap": "1 - exposed / comm, clipped to [0, 1] (overlap_raw: unclipped)",
}


def measure(kind: str, rank: int, world: int, local_rank: int, store: Any,
            cfg: dict[str, Any]) -> dict[str, Any]:
    """One rank of one run (collective over the `world` ranks meeting through `store`).
    Returns per-iteration lists in seconds: step (and fwd, bwd, wait for training kinds)."""
    torch.set_num_threads(cfg["threads"])
    cuda = cfg["gpus"] > 0
    dev = torch.device(f"cuda:{local_rank % cfg['gpus']}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(dev)
    sync = (lambda: torch.cuda.synchronize(dev)) if cuda else (lambda: None)
    timeout, comm, td = cfg["timeout"], None, datetime.timedelta(seconds=cfg["timeout"])
    if kind in ("pyring", "alone-pyring"):
        comm = pyring.init(rank, world, store, timeout=timeout)
    elif kind != "compute":  # ddp-X and alone-X: torch.distributed on backend X
        dist.init_process_group(kind.split("-", 1)[1], store=store, rank=rank, world_size=world,
                                timeout=td)
    torch.manual_seed(0)  # same weights everywhere: no broadcast needed for timing
    model = train.CharGPT(cfg["dim"], cfg["layers"], cfg["heads"], cfg["seq"]).to(dev)
    n = sum(p.numel() for p in model.parameters())
    out: dict[str, Any] = {"params": n, "device": str(dev), "step": [], "fwd": [],
                           "bwd": [], "wait": []}
    store.set(f"ready/{rank}", "1")
    store.wait([f"ready/{r}" for r in range(world)], td)  # start side by side
    clock = time.perf_counter
    if kind.startswith("alone-"):
        flat = opt = net = torch.empty(n, device=dev)
        for _ in range(cfg["warmup"] + cfg["comm_iters"]):
            flat.fill_(1.0)
            sync()
            t0 = clock()
            (comm.all_reduce if comm is not None else dist.all_reduce)(flat)
            sync()
            out["step"].append(clock() - t0)
    else:
        opt, net = torch.optim.AdamW(model.parameters(), lr=1e-3), model
        if kind == "pyring":
            opt = pyring.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                              bucket_bytes=int(cfg["bucket_mb"] * 2**20))
        elif kind != "compute":
            net = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[dev.index] if cuda else None, gradient_as_bucket_view=True)
        data = train.load_corpus(int(cfg["data_mb"] * 2**20))
        shard = len(data) // world
        gen = torch.Generator().manual_seed(rank)
        for _ in range(cfg["warmup"] + cfg["steps"]):
            starts = torch.randint(rank * shard, (rank + 1) * shard - cfg["seq"] - 1,
                                   (cfg["batch"],), generator=gen)
            x, y = train.get_batch(data, starts, cfg["seq"], dev)
            sync()
            ts = [clock()]
            opt.zero_grad(set_to_none=True)
            loss = net(x, y)
            sync()
            ts.append(clock())
            loss.backward()  # DDP waits here for its last buckets
            sync()
            ts.append(clock())
            if kind == "pyring":
                opt.synchronize()  # waits for the buckets still in flight
            ts.append(clock())
            opt.step()
            sync()
            ts.append(clock())
            for key, a, b in (("step", 0, 4), ("fwd", 0, 1), ("bwd", 1, 2), ("wait", 2, 3)):
                out[key].append(ts[b] - ts[a])
    w = cfg["warmup"]
    _KEEP.extend([comm, model, opt, net])  # never freed: see run_rank()
    return {k: (v[w:] if isinstance(v, list) else v) for k, v in out.items()}

def run_rank(kind: str, rank: int, world: int, local_rank: int, store: Any,
             cfg: dict[str, Any]) -> None:
    """One rank of one run, in a process of its own; never returns. Leaves result/<rank>
    (measure()'s lists, or a failure) in `store`, waits until every rank has left one (no
    collective is then in flight) and ends the process with os._exit, tearing nothing down:
    torch can deadlock freeing a DDP whose gloo group is destroyed (it joins gloo's thread
    while holding the GIL), and pyring unlinks its shared memory as soon as peers attach."""
    try:
        res = measure(kind, rank, world, local_rank, store, cfg)
    except Exception as e:  # reported by the parent
        res = failure(e)
        _KEEP.append(e)  # its traceback holds measure()'s frame: nothing is freed
    store.set(f"result/{rank}", json.dumps(res))
    try:
        store.wait([f"result/{r}" for r in range(world)],
                   datetime.timedelta(seconds=cfg["run_limit"]))
    finally:
        os._exit(0)


def _child(rank: int, world: int, port: int, kind: str, cfg: dict[str, Any],
           host: str = "127.0.0.1", local: int | None = None) -> None:
    """A rank's process for one run: train.launch's children (its TCPStore on this host) or,
    under torchrun, each rank's child per kind (torchrun's store, one key prefix per kind)."""
    train.watch_parent()
    td = datetime.timedelta(seconds=cfg["run_limit"] + 60)
    store = dist.TCPStore(host, port, is_master=False, timeout=td)
    if local is not None:
        store = dist.PrefixStore(f"pyring-scaling/{kind}/{cfg['rep']}", store)
    run_rank(kind, rank, world, rank if local is None else local, store, cfg)


def summarize_run(ranks: list[dict[str, Any]], world: int, wall: float) -> dict[str, Any]:
    """Aggregates the ranks' lists: per iteration the slowest rank, then the median."""
    out: dict[str, Any] = {"status": "ok", "world": world, "params": ranks[0]["params"],
                           "device": ranks[0]["device"], "wall_s": round(wall, 2)}
    for key in ("wait", "bwd", "fwd", "step"):  # "step" last: per_iter is its list below
        per_iter = [max(it) for it in zip(*(r[key] for r in ranks))]
        if per_iter:
            out[f"{key}_s"] = statistics.median(per_iter)
    out.update(iters=len(per_iter), min_s=min(per_iter), max_s=max(per_iter),
               per_rank_median_s=[statistics.median(r["step"]) for r in ranks],
               median_iter_max_s=out["step_s"],  # the step's per-iteration view, kept
               step_s=max(statistics.fmean(r["step"]) for r in ranks))
    return out


def failure(e: BaseException) -> dict[str, Any]:
    text = f"{type(e).__name__}: {e}"
    lines = [ln for ln in text.splitlines() if re.match(r"^[\w.]+(Error|Exception|Timeout)\b", ln)]
    return {"status": "failed", "error": lines[-1] if lines else text.strip()[:300],
            "detail": text[-4000:]}


def gather(store: Any, world: int, wall: float) -> dict[str, Any]:
    ranks = [json.loads(store.get(f"result/{r}")) for r in range(world)]
    bad = [r for r in ranks if r.get("status") == "failed"]
    return bad[0] if bad else summarize_run(ranks, world, wall)


def run_spawned(kind: str, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """Spawns one run on `world` local ranks; a failure or a hang is returned, not raised."""
    t0 = time.perf_counter()
    try:
        return gather(train.launch(_child, world, (kind, cfg), cfg["run_limit"]), world,
                      time.perf_counter() - t0)
    except Exception as e:  # the method is reported and skipped; the others go on
        return failure(e)


def run_torchrun(kinds: list[str], cfg: dict[str, Any]) -> dict[str, Any]:
    """Every kind in turn at WORLD_SIZE ranks under torchrun, each rank running each kind in
    a child process of its own (see run_rank); rank 0 returns the runs."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    base, runs = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(
        seconds=cfg["run_limit"] + 60)), {}
    reps: dict[str, list[dict[str, Any]]] = {}
    for i, kind in enumerate(kinds * cfg["repeats"]):
        rep = i // len(kinds)
        store = dist.PrefixStore(f"pyring-scaling/{kind}/{rep}", base)
        t0 = time.perf_counter()
        child = multiprocessing.get_context("spawn").Process(target=_child, daemon=True, args=(
            rank, world, port, kind, {**cfg, "rep": rep}, host,
            int(os.environ.get("LOCAL_RANK", rank))))
        child.start()
        child.join(cfg["run_limit"])
        child.kill()  # a no-op once it has ended
        child.join()
        if not store.check([f"result/{rank}"]):
            store.set(f"result/{rank}", json.dumps({"status": "failed", "error": (
                f"rank {rank}: no result (exit code {child.exitcode}, limit "
                f"{cfg['run_limit']:.0f} s)")}))
        if rank == 0:
            res = gather(store, world, time.perf_counter() - t0)
            reps.setdefault(f"{kind} x{world}", []).append(res)
            progress(f"{kind} x{world}", res)
    return {k: median_run(v) for k, v in reps.items()} if rank == 0 else runs


def median_run(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's repeats -> the repeat with the median step (upper median; failures count
    only when every repeat failed), with every repeat's step kept under "repeat_step_s"."""
    ok = sorted((r for r in reps if r.get("status") == "ok"), key=lambda r: r["step_s"])
    if not ok:
        return reps[-1]
    return dict(ok[len(ok) // 2], repeat_step_s=[r.get("step_s") for r in reps],
                repeats=len(reps))


def progress(key: str, res: dict[str, Any], done: int = 0, total: int = 0) -> None:
    text = (f"step {res['step_s'] * 1e3:9.1f} ms  ({res['iters']} iterations, {res['wall_s']:.0f}"
            " s)" if res["status"] == "ok" else f"FAILED: {res['error']}")
    print(f"{f'[{done}/{total}] ' if total else ''}{key:18s} {text}", flush=True)


def summarize(runs: dict[str, Any], batch: int) -> list[dict[str, Any]]:
    """Table rows: per N the compute baseline, then each method that ran at N."""
    def step(kind: str, n: int) -> float | None:
        r = runs.get(f"{kind} x{n}", {})
        return r.get("step_s") if r.get("status") == "ok" else None

    worlds = sorted({int(k.rsplit("x", 1)[1]) for k in runs})
    methods = [m for m in METHODS if any(k.startswith(m + " ") for k in runs)]
    base = step("compute", 1)
    rows = []
    for n in worlds:
        comp = step("compute", n)
        for m in ["compute", *methods]:
            key = f"{m} x{n}"
            if key not in runs:
                continue
            s = step(m, n)
            row: dict[str, Any] = {"method": m, "ranks": n, "step_s": s, "error": runs[key].get(
                "error"), "samples_per_s": n * batch / s if s else None,
                "speedup": n * base / s if s and base else None}
            row["efficiency"] = row["speedup"] / n if row["speedup"] else None
            if m == "compute":
                row["contention"] = s / base if s and base else None
            else:
                comm = step(f"alone-{LIB[m]}", n) if n > 1 else 0.0
                exposed = s - comp if s and comp else None
                row.update(comm_s=comm, exposed_s=exposed,
                           sync_wait_s=runs[key].get("wait_s") if m == "pyring" else None)
                if comm and exposed is not None:
                    row["overlap_raw"] = 1 - exposed / comm
                    row["overlap"] = min(1.0, max(0.0, row["overlap_raw"]))
            rows.append(row)
    return rows


def kinds_at(world: int, methods: list[str]) -> list[str]:
    """The runs at one world size, in order: compute, then (N > 1) alone-LIB and methods."""
    libs = [f"alone-{lib}" for lib in dict.fromkeys(LIB[m] for m in methods)]
    return ["compute", *libs, *methods] if world > 1 else ["compute"]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    top = GPUS or len(os.sched_getaffinity(0))  # powers of two up to the GPUs (and all) or cores
    worlds = sorted({1 << k for k in range(top.bit_length())} | ({top} if GPUS else set()))
    p.add_argument("--ranks", default=",".join(map(str, worlds)),
                   help="world sizes to run (spawned locally; ignored under torchrun)")
    p.add_argument("--methods", default=",".join(METHODS if GPUS >= 2 else METHODS[:3]))
    for name, default, what in (
            ("dim", 128, "model width"), ("layers", 4, "blocks"), ("heads", 4, "heads"),
            ("seq", 128, "sequence length"), ("batch", 16, "sequences per rank per step"),
            ("steps", 20, "timed steps per run"), ("warmup", 3, "untimed first iterations"),
            ("repeats", 3, "the whole plan runs this often, interleaved; each run reports "
                           "its median repeat"),
            ("comm-iters", 20, "timed allreduces per alone run"),
            ("threads", 1, "torch threads per rank"), ("bucket-mb", 25.0, "pyring's bucket MiB"),
            ("data-mb", 4.0, "corpus MiB read from the stdlib"),
            ("timeout", 120.0, "collective deadline (s)"),
            ("run-limit", 240.0, "each run is killed after (s)")):
        p.add_argument(f"--{name}", type=type(default), default=default, help=what)
    p.add_argument("--tag", default=socket.gethostname())
    p.add_argument("--out", default=None, help="JSON path (PNG beside it)")
    p.add_argument("--merge", nargs="+", metavar="JSON", help="combine earlier results")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    methods = [m for m in args.methods.split(",") if m]
    bad = sorted(set(methods) - set(METHODS))
    if bad:
        sys.exit(f"unknown methods {bad}; valid: {', '.join(METHODS)}")
    cfg = {k: v for k, v in vars(args).items() if k not in ("ranks", "methods", "tag", "out",
                                                            "merge")} | {"gpus": GPUS}
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    tag = "".join(c if c.isalnum() or c in "-_." else "_" for c in args.tag)
    load0, t0 = os.getloadavg(), time.perf_counter()
    runs: dict[str, Any] = {}
    stem = f"scaling_{tag}"
    if args.merge:
        docs = [json.loads(Path(path).read_text()) for path in args.merge]
        runs, cfg = {k: v for d in docs for k, v in d["runs"].items()}, docs[0]["config"]
    elif torchrun:
        world = int(os.environ["WORLD_SIZE"])
        runs = run_torchrun(kinds_at(world, methods), cfg)
        if int(os.environ["RANK"]) != 0:
            return 0
        stem = f"scaling_{tag}_w{world}"
    else:
        worlds = sorted({int(w) for w in args.ranks.split(",") if w})
        if load0[0] > 1.5:
            print(f"warning: load average {load0[0]:.2f} at start: timings are not trustworthy")
        plan = [(k, n) for n in worlds for k in kinds_at(n, methods)] * args.repeats
        print(f"{len(plan)} runs: ranks {worlds}, methods {methods}, {args.repeats} "
              f"repeat(s), {cfg['gpus'] or 'no'} GPUs", flush=True)
        reps: dict[str, list[dict[str, Any]]] = {}
        for i, (kind, n) in enumerate(plan, 1):
            res = run_spawned(kind, n, cfg)
            reps.setdefault(f"{kind} x{n}", []).append(res)
            progress(f"{kind} x{n}", res, i, len(plan))
        runs = {k: median_run(v) for k, v in reps.items()}
    cfg["params"] = next((v["params"] for v in runs.values() if v.get("status") == "ok"), 0)
    rows = summarize(runs, cfg["batch"])
    print_table(rows, cfg, DEFINITIONS)
    out = Path(args.out) if args.out else BENCH_DIR / "results" / f"{stem}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": "scaling", "command": sys.argv, "config": cfg, "machine": describe(),
           "loadavg_start": load0, "loadavg_end": os.getloadavg(),
           "wall_s": round(time.perf_counter() - t0, 1), "runs": runs, "summary": rows,
           "definitions": DEFINITIONS}
    out.write_text(json.dumps(doc, indent=1))
    err = plot(rows, out.with_suffix(".png"), f"CharGPT {cfg['params'] / 1e6:.1f} M params, "
               f"batch {cfg['batch']}/rank, {'GPU' if cfg['gpus'] else 'CPU'}", METHODS)
    print(f"\nwrote {out}" + (f" ({err})" if err else f" and {out.with_suffix('.png').name}")
          + f" in {doc['wall_s']:.0f} s")
    return 1 if any(v.get("status") != "ok" for v in runs.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
