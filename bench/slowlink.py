"""Compressed exchange on a slow link: time to reach the baseline's validation loss, 2 emulated
hosts (one rank each) joined by a shaped veth pair, against DDP on gloo with AdamW.

    python bench/slowlink.py [--rate 20mbit] [--steps 400] [--out PATH]   # as root

Tasks (``--task``, bench/_tasks.py) and methods as bench/convergence.py (seed 0), plus
``ddp_gloo_adamw`` (DistributedDataParallel over gloo, AdamW) and ``local`` (AdamW with no
exchange at all: the compute alone). Each method trains ``--steps`` steps from the same
weights and batches (the compressed methods up to ``--more`` times as many, so that they may
reach the target); the validation loss is taken every 20 steps with the clock stopped.
Reported per method: the wall time of its steps, the validation loss curve against that
time, and the time at which it first reaches ``target`` = ddp_gloo_adamw's final validation
loss. The baseline's communicating fraction is 1 - local step time / its step time.
Target (issue 12): OneBitAdam reaches the target at least 2x sooner than ddp_gloo_adamw.
Needs root (network namespaces; pyring.tools.emulate).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from _results import add_replace_flag, result_path

METHODS = ["local", "ddp_gloo_adamw", "adamw_fp32", "adamw_bf16", "onebit_adam", "periodic"]
BASELINES = ("local", "ddp_gloo_adamw", "adamw_fp32")  # the others may run --more times longer


def _worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from _tasks import TASKS
    from convergence import EVAL_EVERY, _optimizer
    from torch import nn

    import pyring
    from pyring.tools.emulate import report

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    comm = pyring.init()
    task = TASKS[args.task](0)
    out = {}
    for method in METHODS:
        model = task.model()
        if method in ("local", "ddp_gloo_adamw"):
            net = model if method == "local" else nn.parallel.DistributedDataParallel(model)
            opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
        else:
            net, opt = model, _optimizer(method, model, comm, args)
        g = torch.Generator().manual_seed(0)
        curve, clock = [], 0.0
        steps = args.steps if method in BASELINES else args.steps * args.more
        dist.barrier()
        for step in range(1, steps + 1):
            batch = task.batch(rank, world, g)
            t0 = time.perf_counter()
            opt.zero_grad()
            task.loss(net, batch).backward()
            opt.step()
            clock += time.perf_counter() - t0
            if step % EVAL_EVERY == 0 or step == steps:
                curve.append((step, clock, task.evaluate(model)[0]))
        # The slower rank's clock is the job's.
        t = torch.tensor([clock], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        out[method] = {"curve": curve, "wall_s": float(t), "val_loss": curve[-1][2],
                       "steps": steps}
    comm.close()
    dist.destroy_process_group()
    report(out)


def main() -> None:
    from convergence import add_optimizer_args

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", default="20mbit")
    ap.add_argument("--task", choices=("digits", "charlm"), default="digits")
    ap.add_argument("--steps", type=int, default=400)
    add_optimizer_args(ap)  # the same options as bench/convergence.py, from one place
    ap.add_argument("--more", type=int, default=2,
                    help="the compressed methods may run this many times --steps to reach "
                         "the target")
    ap.add_argument("--out", default=None,
                    help="JSON path (default: see --replace)")
    add_replace_flag(ap)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.out = str(result_path("slowlink_vm", args.out, args.replace))
    if args.worker:
        _worker(args)
        return
    from machine import describe

    from pyring.tools.emulate import EmulatedHosts, available

    ok, why = available(shaping=True)
    if not ok:
        sys.exit(f"slowlink: emulated hosts unavailable: {why}")
    argv = [sys.executable, os.path.abspath(__file__), "--worker", "--task", args.task,
            "--steps", str(args.steps), "--more", str(args.more),
            "--lr", str(args.lr), "--freeze", str(args.freeze), "--period", str(args.period)]
    with EmulatedHosts(hosts=2, rate=args.rate) as hosts:
        results = hosts.run(1, argv, timeout=3600)
        link = hosts.link
    rows = results[0]
    target = rows["ddp_gloo_adamw"]["val_loss"]
    summary = {}
    for m, r in rows.items():
        reach = next((clock for _, clock, loss in r["curve"] if loss <= target), None)
        summary[m] = {"wall_s": r["wall_s"], "step_ms": r["wall_s"] / r["steps"] * 1e3,
                      "val_loss": r["val_loss"], "time_to_target_s": reach}
        print(f"{m:16s} {summary[m]['step_ms']:7.2f} ms/step  loss {r['val_loss']:.4f}  "
              f"target reached at {reach if reach is None else round(reach, 2)} s", flush=True)
    base = summary["ddp_gloo_adamw"]
    fraction = 1 - summary["local"]["step_ms"] / base["step_ms"]
    speedup = {m: base["time_to_target_s"] / s["time_to_target_s"]
               for m, s in summary.items() if s["time_to_target_s"] and m != "local"}
    print(f"baseline communicating fraction {fraction:.2f}; speedups to target {speedup}")
    result = {"machine": describe(), "command": " ".join(sys.argv), "link": link,
              "steps": args.steps, "target_val_loss": target,
              "baseline_communicating_fraction": fraction, "summary": summary,
              "speedup_to_target_vs_ddp_gloo": speedup,
              "targets_met": {"onebit_adam >= 2x sooner than ddp_gloo_adamw":
                              speedup.get("onebit_adam", 0) >= 2},
              "runs": rows}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
