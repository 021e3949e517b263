"""Compressed exchange against the float32 baseline: final validation loss, accuracy, bytes
exchanged over the whole run and wall time, on 2 ranks and several seeds.

    python bench/convergence.py [--task digits|charlm] [--seeds 3] [--steps 400] [--out PATH]

Tasks (``--task``, bench/_tasks.py): ``digits`` (scikit-learn's bundled load_digits, an MLP)
and ``charlm`` (the main job's character-level transformer, shrunk).
Methods, each from the same initial weights and batches per seed:
- ``adamw_fp32``: AdamW under DistributedOptimizer, float32 allreduce (the baseline);
- ``adamw_WIRE`` for every other wire of the codec registry (fp16, bf16, onebit, int8): the
  same with compression=WIRE (onebit and int8 with error feedback);
- ``onebit_adam``: pyring.optim.OneBitAdam (decoupled weight decay), frozen after
  ``--freeze`` steps (averaging gradients on ``--warmup-wire`` until then), and again with
  each of ``--freeze-sweep`` to show how far the byte ratio goes while the loss holds;
- ``zero_one_adam``: pyring.optim.ZeroOneAdam, its variance updated on the doubling schedule
  until ``--var-freeze``, then local steps with rounds every 1 to ``--local-clipper`` steps;
- ``periodic``: AdamW on local gradients after ``--freeze`` synchronous warm-up steps, the
  parameters averaged every ``--period`` steps on the bf16 wire (pyring.PeriodicAveraging).
Bytes are what rank 0 received (Communicator.stats(): collectives' links, point-to-point
links, single-copy reads). Targets (issue 12): OneBitAdam >= 10x fewer bytes and bf16 >= 1.9x,
each with the final validation loss within the baseline's spread over seeds. Draws
``<out>.png``: validation loss against steps and against bytes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
from _results import add_replace_flag, result_path  # noqa: E402
from _tasks import TASKS  # noqa: E402
from machine import describe  # noqa: E402
from torch import nn

from pyring.optim.compression import STATELESS_WIRES, WIRES  # the codec registry

EVAL_EVERY = 20


def _optimizer(method: str, model: nn.Module, comm, args) -> torch.optim.Optimizer:
    import pyring

    if method == "zero_one_adam":
        return pyring.optim.ZeroOneAdam(model.parameters(), lr=args.lr, weight_decay=1e-4,
                                        decoupled_weight_decay=True,
                                        var_freeze_step=args.var_freeze, comm=comm,
                                        var_wire=args.warmup_wire,
                                        denominator_floor=args.denominator_floor,
                                        var_update_scaler=args.var_scaler,
                                        local_step_scaler=args.local_scaler,
                                        local_step_clipper=args.local_clipper)
    if method.startswith("onebit_adam"):
        freeze = int(method.rsplit("_", 1)[1]) if method != "onebit_adam" else args.freeze
        return pyring.optim.OneBitAdam(model.parameters(), lr=args.lr, weight_decay=1e-4,
                                       decoupled_weight_decay=True, freeze_step=freeze,
                                       warmup_wire=args.warmup_wire, comm=comm,
                                       denominator_floor=args.denominator_floor)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    if method == "periodic":
        return pyring.PeriodicAveraging(opt, period=args.period, warmup_steps=args.freeze,
                                        wire="bf16", comm=comm)
    wire = method.removeprefix("adamw_")
    compression = "none" if wire == WIRES[0] else wire
    return pyring.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                       comm=comm, compression=compression)


def _lr(args, step: int) -> float:
    """The learning rate of ``step`` (1-based): constant, or a cosine from --lr to 0."""
    if args.schedule == "constant":
        return args.lr
    return 0.5 * args.lr * (1 + math.cos(math.pi * (step - 1) / args.steps))


def _run(method: str, seed: int, rank: int, world: int, comm, args) -> dict:
    from pyring.optim.compression import received_bytes

    task = TASKS[args.task](seed)
    model = task.model()
    opt = _optimizer(method, model, comm, args)
    g = torch.Generator().manual_seed(seed)
    curve, got = [], 0
    comm.reset_stats()
    t0 = time.perf_counter()
    for step in range(1, args.steps + 1):
        for group in opt.param_groups:
            group["lr"] = _lr(args, step)
        batch = task.batch(rank, world, g)
        opt.zero_grad()
        task.loss(model, batch).backward()
        opt.step()
        if step % EVAL_EVERY == 0 or step == args.steps:
            got = received_bytes(comm.stats())
            loss, acc = task.evaluate(model)
            curve.append((step, got, loss, acc))
    return {"curve": curve, "bytes": got, "wall_s": time.perf_counter() - t0,
            "val_loss": curve[-1][2], "accuracy": curve[-1][3]}


def _worker(rank: int, world: int, store, methods: list[str], seeds: list[int], args):
    import pyring

    torch.set_num_threads(1)
    comm = pyring.init(rank=rank, world_size=world, store=store)
    rows = {m: [_run(m, s, rank, world, comm, args) for s in seeds] for m in methods}
    comm.close()
    return rows if rank == 0 else None


def _plot(summary: dict, rows: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for m, runs in rows.items():
        c = runs[0]["curve"]
        a.plot([p[0] for p in c], [p[2] for p in c], label=m)
        b.plot([max(p[1], 1) for p in c], [p[2] for p in c], label=m)
    a.set(xlabel="step", ylabel="validation loss (seed 0)", yscale="log")
    b.set(xlabel="bytes received by rank 0", ylabel="validation loss (seed 0)", xscale="log",
          yscale="log")
    a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def add_optimizer_args(ap: argparse.ArgumentParser) -> None:
    """The options _optimizer reads: every script that builds its optimizers takes them."""
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--schedule", choices=("cosine", "constant"), default="cosine",
                    help="the learning rate over the run, the same for every method")
    ap.add_argument("--freeze", type=int, default=20)
    ap.add_argument("--warmup-wire", choices=STATELESS_WIRES, default="fp32",
                    help="the wire of OneBitAdam's gradients before the freeze")
    ap.add_argument("--denominator-floor", type=float, default=0.01,
                    help="OneBitAdam's floor on its frozen denominators (its default: 0.01)")
    ap.add_argument("--period", type=int, default=8, help="periodic averaging's period")
    ap.add_argument("--var-freeze", type=int, default=100,
                    help="ZeroOneAdam's var_freeze_step (then local steps)")
    ap.add_argument("--var-scaler", type=int, default=4,
                    help="ZeroOneAdam's var_update_scaler (updates before their gap doubles)")
    ap.add_argument("--local-scaler", type=int, default=32,
                    help="ZeroOneAdam's local_step_scaler (rounds before the interval doubles)")
    ap.add_argument("--local-clipper", type=int, default=4,
                    help="ZeroOneAdam's local_step_clipper")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", choices=sorted(TASKS), default="digits")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=400)
    add_optimizer_args(ap)
    ap.add_argument("--freeze-sweep", default="10,40", help="more OneBitAdam freeze steps")
    ap.add_argument("--methods", help="a subset of the methods, comma-separated")
    ap.add_argument("--out", default=None,
                    help="JSON path (default: see --replace)")
    add_replace_flag(ap)
    args = ap.parse_args()
    args.out = str(result_path("convergence_vm", args.out, args.replace))
    methods = [f"adamw_{w}" for w in WIRES] + ["onebit_adam", "periodic"]
    methods += ["zero_one_adam"]
    methods += [f"onebit_adam_{f}" for f in args.freeze_sweep.split(",") if f]
    if args.methods:
        unknown = [m for m in args.methods.split(",") if m not in methods]
        if unknown:
            ap.error(f"--methods: unknown {','.join(unknown)} (valid: {','.join(methods)})")
        methods = ["adamw_fp32"] + [m for m in args.methods.split(",") if m != "adamw_fp32"]
    from pyring.launch import run_ranks

    world = 2
    rows = run_ranks(world, _worker, methods, list(range(args.seeds)), args, timeout=3600)[0]
    base = rows["adamw_fp32"]
    lo, hi = min(r["val_loss"] for r in base), max(r["val_loss"] for r in base)
    base_bytes = statistics.mean(r["bytes"] for r in base)
    summary = {}
    for m, runs in rows.items():
        losses = [r["val_loss"] for r in runs]
        mean = statistics.mean(losses)
        summary[m] = {
            "val_loss_mean": mean, "val_loss_min": min(losses), "val_loss_max": max(losses),
            "accuracy_mean": (statistics.mean(r["accuracy"] for r in runs)
                              if runs[0]["accuracy"] is not None else None),
            "bytes_mean": statistics.mean(r["bytes"] for r in runs),
            "bytes_ratio_vs_baseline": base_bytes / statistics.mean(r["bytes"] for r in runs),
            "wall_s_mean": statistics.mean(r["wall_s"] for r in runs),
            # within the baseline's spread over seeds, or below it
            "loss_within_baseline_spread": mean <= hi,
        }
        acc = summary[m]["accuracy_mean"]
        print(f"{m:18s} loss {mean:.4f} [{min(losses):.4f}, {max(losses):.4f}] "
              f"acc {'-' if acc is None else f'{acc:.3f}'} "
              f"bytes {summary[m]['bytes_mean']:.3e} "
              f"({summary[m]['bytes_ratio_vs_baseline']:.1f}x fewer) "
              f"{summary[m]['wall_s_mean']:.1f} s", flush=True)
    goals = (("onebit_adam", 10), ("adamw_bf16", 1.9), ("zero_one_adam", 26))
    targets = {f"{m} >= {r}x fewer bytes, loss within spread":
               summary[m]["bytes_ratio_vs_baseline"] >= r
               and summary[m]["loss_within_baseline_spread"]
               for m, r in goals if m in summary}
    result = {"machine": describe(), "command": " ".join(sys.argv), "task": args.task,
              "world": world, "steps": args.steps, "lr": args.lr, "freeze": args.freeze,
              "warmup_wire": args.warmup_wire, "schedule": args.schedule,
              "denominator_floor": args.denominator_floor,
              "period": args.period,
              "baseline_spread": [lo, hi], "summary": summary, "targets_met": targets,
              "runs": rows}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    _plot(summary, rows, os.path.splitext(args.out)[0] + ".png")
    print(json.dumps(targets, indent=1))


if __name__ == "__main__":
    main()
