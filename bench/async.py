"""Asynchronous training against synchronous: the time to the synchronous baseline's final
validation loss, and the loss at the same number of samples, with a straggler or a slow link.

    python bench/async.py [--setup straggler|slowlink] [--task digits|charlm] [--seeds 3]
                          [--steps 400] [--slow 2.0] [--device 3] [--rate 20mbit]
                          [--ps-lr LR]
                          [--out PATH] [--replace]

Setups:
- ``straggler``: 4 local workers. Each step's compute (zero_grad, forward, backward) is
  followed by ``--device`` times its duration asleep: the share of a step an accelerator would
  take while the host idles, so that 4 ranks do not oversubscribe this machine's cores (with 4
  CPU-bound ranks on 2 cores, the straggler's idle time is taken by the others, and no method
  can gain from not waiting for it). Rank 0's steps take ``--slow`` times as long as the
  others'. The parameter server runs its server on a fifth rank beside the 4 workers, as
  BytePS runs servers on spare CPUs.
- ``slowlink``: 2 emulated hosts of 2 ranks each joined by a ``--rate`` link (as root;
  pyring.tools.emulate, as bench/slowlink.py), no straggler, no device share; the server is
  the last of the 4 ranks.
Methods, AdamW at a constant ``--lr`` from the same weights (bench/_tasks.py, per seed):
- ``ddp_gloo``: DistributedDataParallel on gloo;
- ``sync``: pyring.DistributedOptimizer (float32), the synchronous baseline;
- ``ssp1``, ``ssp2``: the same with staleness=1 and 2 (stale-synchronous parallel);
- ``ps_fp32``, ``ps_onebit``: pyring.optim.ParameterServer, 1 server (the last rank), each
  push one worker's batch on that wire, a pull every ``--pull-every`` steps that the step waits
  for (the default);
- ``ps_fp32_overlap``, ``ps_onebit_overlap``: the same with each pull taken at the next step
  (overlap_pull=True).
Every method sees the same number of samples: the synchronous ones ``--steps`` steps of one
batch per rank (each rank from its shard of the training set), the parameter server as many
pushes of one batch (its workers stop once the server's version has reached that count; each
draws from the whole training set, since a faster worker takes more batches). The parameters
are copied with a clock reading at the same sample counts (every ``EVAL_EVERY`` synchronous
steps: rank 0's, or the server's) and evaluated after the run. Reported per method: the
validation loss against wall time and against samples, the time at which it first reaches the
final loss of ``sync`` (seed by seed), and the final loss. Draws ``<out>.png`` (seed 0).
Targets (issue 55), straggler: a parameter server or staleness 1-2 reaches the baseline's
final loss >= 1.5x sooner on at least one task; the final loss at the same samples within the
3-seed spread of ``sync`` on digits, within 1.1x of its mean on charlm.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from _results import add_replace_flag, result_path

EVAL_EVERY = 20
METHODS = ("ddp_gloo", "sync", "ssp1", "ssp2", "ps_fp32", "ps_onebit", "ps_fp32_overlap",
           "ps_onebit_overlap")
OVERLAP = "_overlap"  # a parameter server method whose workers take each pull a step later
WORLD = 4


def _flat(params) -> list:
    import torch

    return torch.cat([p.detach().reshape(-1) for p in params]).clone()


def _compute_s(task, model, g) -> float:
    """The median time of a local step's compute (zero_grad, forward, backward) on a copy of
    `model` without any hooks: the unit of the emulated device share, measured apart because a
    step's own backward also waits for the exchange's hooks (DDP, DistributedOptimizer), and
    sleeping in proportion to that wait would feed back into every rank's next wait."""
    import copy

    net, times = copy.deepcopy(model), []
    for _ in range(7):
        c0 = time.perf_counter()
        net.zero_grad()
        task.loss(net, task.batch(0, 1, g)).backward()
        times.append(time.perf_counter() - c0)
    return statistics.median(times)


def _backward(task, net, batch, opt, rank: int, args) -> None:
    """One step's gradients, then args.device times the compute unit asleep (the device's
    share); rank 0, the straggler, sleeps so that its step takes args.slow times as long."""
    c0 = time.perf_counter()
    opt.zero_grad()
    task.loss(net, batch).backward()
    compute = args.compute_s if args.device > 0 else time.perf_counter() - c0
    factor = (1 + args.device) * (args.slow if rank == 0 else 1.0) - 1
    if factor > 0:
        time.sleep(factor * compute)


def _sync_run(method: str, task, model, rank: int, world: int, comm, args) -> list:
    """One synchronous method on this rank: rank 0's (seconds, samples, parameters) snapshots."""
    import torch
    from torch import nn

    import pyring

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    if method == "ddp_gloo":
        net = nn.parallel.DistributedDataParallel(model)
    else:
        net = model
        stale = {"sync": 0, "ssp1": 1, "ssp2": 2}[method]
        opt = pyring.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                          comm=comm, staleness=stale)
    g = torch.Generator().manual_seed(args.seed)
    snaps = []
    comm.barrier()
    t0 = time.perf_counter()
    for step in range(1, args.steps + 1):
        batch = task.batch(rank, world, g)
        _backward(task, net, batch, opt, rank, args)
        opt.step()
        if rank == 0 and (step % EVAL_EVERY == 0 or step == args.steps):
            snaps.append((time.perf_counter() - t0, step * world, _flat(model.parameters())))
    comm.barrier()
    return snaps


def _ps_run(method: str, task, model, rank: int, world: int, comm, args) -> tuple[list, dict]:
    """The parameter server on this rank: the server's snapshots, and every rank's stats."""
    import torch

    from pyring.optim import ParameterServer

    opt = torch.optim.AdamW(model.parameters(), lr=args.ps_lr, weight_decay=1e-4)
    wire = method.removeprefix("ps_").removesuffix(OVERLAP)
    ps = ParameterServer(opt, model.named_parameters(), servers=1, push_every=1,
                         pull_every=args.pull_every, wire=wire, comm=comm,
                         overlap_pull=method.endswith(OVERLAP))
    pushes = args.steps * WORLD  # the synchronous methods' samples, in batches
    every = EVAL_EVERY * WORLD
    snaps: list = []
    comm.barrier()
    t0 = time.perf_counter()
    if ps.is_server:
        def seen(version: int, shard) -> None:
            if version % every == 0 or version == pushes:
                if version <= pushes:
                    snaps.append((time.perf_counter() - t0, version, shard.clone()))

        ps.serve(on_update=seen)
        return snaps, ps.stats()
    # Each worker draws from the whole training set with its own generator: workers of
    # unequal speed take unequal numbers of batches, and drawn from shards (as the synchronous
    # ranks draw theirs, in equal numbers) the fastest worker's shard would outweigh the rest.
    g = torch.Generator().manual_seed(args.seed * 1009 + 1 + rank)
    busy = 0.0
    while ps.versions[0] < pushes:
        batch = task.batch(0, 1, g)
        c0 = time.perf_counter()
        _backward(task, model, batch, opt, rank, args)
        ps.step()
        busy += time.perf_counter() - c0
    ps.close()
    stats = ps.stats()
    stats["step_s"] = busy
    return snaps, stats


def run_rank(rank: int, world: int, store, args) -> dict | None:
    """Every method and seed on this rank; rank 0 and the server report their snapshots
    evaluated (the clock stopped), every rank its parameter-server stats."""
    import datetime

    import torch
    import torch.distributed as dist
    from _tasks import TASKS

    import pyring

    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=600)
    if store is None:  # emulated hosts: the launcher's environment
        dist.init_process_group("gloo", timeout=timeout)
        comm = pyring.init(timeout=600)
    else:
        dist.init_process_group("gloo", store=dist.PrefixStore("gloo", store), rank=rank,
                                world_size=world, timeout=timeout)
        comm = pyring.init(rank, world, store, timeout=600)
    out: dict = {"rank": rank, "runs": {}}
    for seed in range(args.seeds):
        args.seed = seed
        task = TASKS[args.task](seed)
        args.compute_s = _compute_s(task, task.model(), torch.Generator().manual_seed(seed))
        for method in args.methods:
            model = task.model()
            stats = None
            if method.startswith("ps_"):
                snaps, stats = _ps_run(method, task, model, rank, world, comm, args)
            else:
                snaps = _sync_run(method, task, model, rank, world, comm, args)
            curve = []
            for t, samples, flat in snaps:  # evaluated on this rank's copy of the model
                off = 0
                with torch.no_grad():
                    for p in model.parameters():
                        p.copy_(flat[off:off + p.numel()].view_as(p))
                        off += p.numel()
                curve.append((t, samples, task.evaluate(model)[0]))
            out["runs"].setdefault(method, []).append({"curve": curve, "stats": stats})
    comm.close()
    dist.destroy_process_group()
    return out


def _merge(ranks: list[dict]) -> dict:
    """Per method, per seed: the curve of rank 0 (synchronous) or of the server, and the
    parameter server's stats of every rank."""
    merged: dict = {}
    server = ranks[-1]
    for method, runs in ranks[0]["runs"].items():
        src = server if method.startswith("ps_") else ranks[0]
        merged[method] = [
            {"curve": src["runs"][method][i]["curve"],
             "stats": ([r["runs"][method][i]["stats"] for r in ranks]
                       if method.startswith("ps_") else None)}
            for i in range(len(runs))]
    return merged


def summarize(rows: dict, task: str) -> tuple[dict, dict]:
    """Per method: time to sync's final loss per seed, its speedup over sync's time, the final
    loss (at the same samples); and the targets."""
    finals = [r["curve"][-1][2] for r in rows["sync"]]

    def reach(runs: list) -> list:  # per seed: when the loss first fell to sync's final
        return [next((t for t, _, loss in r["curve"] if loss <= finals[i]), None)
                for i, r in enumerate(runs)]

    base_t = reach(rows["sync"])
    summary = {}
    for m, runs in rows.items():
        times = reach(runs)
        speed = [base_t[i] / t for i, t in enumerate(times) if t]
        losses = [r["curve"][-1][2] for r in runs]
        waits = [sum(s["waited_s"] for s in r["stats"] if "waited_s" in s)
                 / max(1e-9, sum(s["step_s"] for s in r["stats"] if "step_s" in s))
                 for r in runs] if m.startswith("ps_") else None
        every = all(t is not None for t in times)
        summary[m] = {
            "time_to_sync_final_s": times, "wall_s": [r["curve"][-1][0] for r in runs],
            "speedup_to_sync_final": speed,
            "speedup_min": min(speed) if every else None,
            # the seeds' mean time to sync's final loss, sync's over this method's
            "speedup_of_mean_times": (statistics.mean(base_t) / statistics.mean(times)
                                      if every else None),
            "final_loss": losses, "final_loss_mean": statistics.mean(losses),
            "worker_wait_fraction": waits}
    hi, mean = max(finals), statistics.mean(finals)
    summary["sync"]["spread"] = [min(finals), hi]
    targets = {}
    fast = [m for m in summary if m.startswith(("ps_", "ssp"))]
    targets["an asynchronous method reaches sync's final loss >= 1.5x sooner (mean over "
            "seeds)"] = any((summary[m]["speedup_of_mean_times"] or 0) >= 1.5 for m in fast)
    targets["an asynchronous method reaches sync's final loss >= 1.5x sooner (every seed)"] = \
        any((summary[m]["speedup_min"] or 0) >= 1.5 for m in fast)
    for m in fast:
        f = summary[m]["final_loss_mean"]
        ok = f <= hi if task == "digits" else f <= 1.1 * mean
        what = "within sync's 3-seed spread" if task == "digits" else "within 1.1x of sync"
        targets[f"{m} final loss at the same samples {what}"] = ok
    return summary, targets


def _plot(rows: dict, path: str, title: str) -> None:
    try:
        import matplotlib
    except ImportError:
        print(f"async: no matplotlib here, {path} not drawn", flush=True)
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for m, runs in rows.items():
        c = runs[0]["curve"]
        a.plot([p[0] for p in c], [p[2] for p in c], label=m)
        b.plot([p[1] for p in c], [p[2] for p in c], label=m)
    a.set(xlabel="wall time (s)", ylabel="validation loss (seed 0)", yscale="log", title=title)
    b.set(xlabel="samples (batches)", ylabel="validation loss (seed 0)", yscale="log")
    a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    from convergence import add_optimizer_args

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--setup", choices=("straggler", "slowlink"), default="straggler")
    ap.add_argument("--task", choices=("digits", "charlm"), default="digits")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--slow", type=float, default=None,
                    help="rank 0's steps take this many times as long (straggler: 2.0, "
                         "slowlink: 1.0)")
    ap.add_argument("--device", type=float, default=None,
                    help="each step sleeps this many times its compute, an accelerator's "
                         "share (straggler: 3.0, slowlink: 0)")
    ap.add_argument("--rate", default="20mbit", help="slowlink: the link's rate")
    ap.add_argument("--pull-every", type=int, default=1, help="the workers' pull period")
    ap.add_argument("--ps-lr", type=float, default=None,
                    help="the servers' learning rate (default: --lr). A server takes an "
                         "optimizer step per push, as many per sample as there are workers "
                         "per synchronous step")
    ap.add_argument("--methods", default=",".join(METHODS),
                    help="a subset of the methods, comma-separated (sync always runs)")
    add_optimizer_args(ap)
    ap.add_argument("--out", default=None, help="JSON path (default: see --replace)")
    add_replace_flag(ap)
    ap.add_argument("--resummarize", metavar="JSON",
                    help="recompute the summary and targets of a result file from its runs")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.resummarize:
        with open(args.resummarize) as f:
            doc = json.load(f)
        doc["summary"], doc["targets_met"] = summarize(doc["runs"], doc["task"])
        with open(args.resummarize, "w") as f:
            json.dump(doc, f, indent=1)
        print(json.dumps(doc["targets_met"], indent=1))
        return
    if args.ps_lr is None:
        args.ps_lr = args.lr
    if args.slow is None:
        args.slow = 2.0 if args.setup == "straggler" else 1.0
    if args.device is None:
        args.device = 3.0 if args.setup == "straggler" else 0.0
    methods = args.methods.split(",")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        ap.error(f"--methods: unknown {','.join(unknown)} (valid: {','.join(METHODS)})")
    args.methods = ["sync"] + [m for m in methods if m != "sync"]
    if args.worker:
        from pyring.tools.emulate import report

        report(run_rank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None, args))
        return
    args.out = str(result_path(f"async_{args.setup}_{args.task}_vm", args.out, args.replace))
    from machine import describe

    link = None
    if args.setup == "straggler":
        from pyring.launch import run_ranks

        sync, ps = ([m for m in args.methods if m.startswith("ps_") == p] for p in (0, 1))
        rows = {}
        for methods, world in ((sync, WORLD), (ps, WORLD + 1)):
            if methods:
                args.methods = methods
                rows.update(_merge(run_ranks(world, run_rank, args, timeout=3600)))
        args.methods = sync + ps
    else:
        from pyring.tools.emulate import EmulatedHosts, available

        ok, why = available(shaping=True)
        if not ok:
            sys.exit(f"async: emulated hosts unavailable: {why}")
        argv = [sys.executable, os.path.abspath(__file__), "--worker"] + sys.argv[1:]
        with EmulatedHosts(hosts=2, rate=args.rate) as hosts:
            rows = _merge(hosts.run(WORLD // 2, argv, timeout=3600))
            link = hosts.link
    summary, targets = summarize(rows, args.task)
    for m, s in summary.items():
        reach = ["-" if t is None else f"{t:.2f}" for t in s["time_to_sync_final_s"]]
        losses = " ".join(f"{x:.4f}" for x in s["final_loss"])
        print(f"{m:10s} loss {losses} wall {statistics.mean(s['wall_s']):6.2f} s"
              f"  to sync's final: {' '.join(reach)} s  speedup {s['speedup_to_sync_final']}",
              flush=True)
    result = {"machine": describe(), "command": " ".join(sys.argv), "setup": args.setup,
              "task": args.task, "world": WORLD, "steps": args.steps, "slow": args.slow,
              "device": args.device, "ps_server": ("a fifth rank" if args.setup == "straggler"
                                                   else "the last of the 4 ranks"),
              "lr": args.lr, "ps_lr": args.ps_lr, "pull_every": args.pull_every, "link": link,
              "summary": summary, "targets_met": targets, "runs": rows}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    _plot(rows, os.path.splitext(args.out)[0] + ".png", f"{args.setup}, {args.task}")
    print(json.dumps(targets, indent=1))


if __name__ == "__main__":
    main()
