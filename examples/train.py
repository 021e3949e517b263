#!/usr/bin/env python
"""Train a small character-level transformer on the Python standard library's own source,
on N local ranks whose gradients are averaged by pyring. Needs no download.

    python examples/train.py                      # 1 rank per GPU, else 2 CPU ranks
    python examples/train.py --ranks-per-gpu 2    # 2 ranks sharing each GPU
    python examples/train.py --device cpu         # 2 CPU ranks even with GPUs
    python examples/train.py --sync ddp-gloo      # the same run on DDP + gloo
    torchrun --nproc-per-node 2 examples/train.py

--sync pyring: pyring.DistributedOptimizer(AdamW) averages gradient buckets while backward
runs, and opt.synchronize() waits for the rest; ddp-pyring: DistributedDataParallel on the
"pyring" torch.distributed backend; ddp-gloo: DistributedDataParallel on gloo (both DDPs with
gradient_as_bucket_view=True).
--mode ps (with --sync pyring): asynchronous training on a parameter server
(pyring.optim.ParameterServer, docs/asynchronous.md): the last --servers ranks serve the
parameters, the others train and push their gradients on --wire; the servers' AdamW keeps the
first learning rate (the schedule is the workers', which no longer step an optimizer).
--device auto (the default) trains on CUDA when torch.cuda.is_available(): local rank r uses
GPU r // --ranks-per-gpu, model and batches on it, and the gradients travel as CUDA tensors
through the same sync method as on the CPU. Each rank prints its device at start.
Started without torchrun, the script spawns its own ranks, which meet through a TCPStore on
127.0.0.1 held by this process; a failing rank, a hang past --time-limit or the death of the
parent ends every rank.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from train_launch import (
    BusyTimer,
    Progress,
    connect,
    describe_device,
    gpu_count,
    pyring_comm_of_default_group,
    rank_device,
    watch_parent,
)

import pyring
from pyring.launch import run_ranks
from pyring.optim.compression import WIRES
from pyring.tools.workload import CharGPT, get_batch, load_corpus

SYNCS = ("pyring", "ddp-pyring", "ddp-gloo")
MODES = ("sync", "ps")


# ----------------------------------------------------------------------------- training
def train(rank: int, world: int, store: Any, args: argparse.Namespace) -> None:
    """One rank: under torchrun `store` is None (the environment says where to meet), else the
    store that pyring.launch's ranks meet through."""
    watch_parent()
    torch.set_num_threads(args.threads)
    local_rank = int(os.environ.get("LOCAL_RANK", rank)) if store is None else rank
    device = rank_device(args.device, local_rank, args.ranks_per_gpu)
    print(f"rank {rank}: {describe_device(device, args.ranks_per_gpu, args.threads)}",
          flush=True)
    comm = connect(args.sync, rank, world, store, args.timeout, device)
    if args.sync == "ddp-pyring":
        comm = pyring_comm_of_default_group()

    corpus = load_corpus(int(args.data_mb * 2**20))
    n_val = len(corpus) // 20  # the last 5% (the last files, by path) is held out
    train_data, val_data = corpus[:-n_val], corpus[-n_val:]
    # The ranks that train: all, or the workers of a parameter server (the last ranks serve).
    trainers = world - args.servers if args.mode == "ps" else world
    shard = len(train_data) // trainers  # rank r draws its windows from shard r only
    lo = rank * shard
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)

    torch.manual_seed(args.seed + rank)  # different on purpose: rank 0's weights are broadcast
    model = CharGPT(args.dim, args.layers, args.heads, args.seq).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warm = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) * (
        0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, s / args.steps)))))
    ps = None
    if args.mode == "ps":
        from pyring.optim import ParameterServer

        pyring.broadcast_parameters(model, src=0)
        ps = ParameterServer(opt, model.named_parameters(), servers=args.servers, wire=args.wire,
                             overlap_pull=args.overlap_pull)
        net = model
    elif args.sync == "pyring":
        pyring.broadcast_parameters(model, src=0)
        pyring.broadcast_optimizer_state(opt, src=0)
        opt = pyring.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                          bucket_bytes=int(args.bucket_mb * 2**20))
        net = model
    else:  # DDP broadcasts rank 0's parameters and buffers at construction
        net = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None,
            gradient_as_bucket_view=True)
    timer = BusyTimer(comm) if comm is not None else None

    serving = ps is not None and ps.is_server

    def average(values: list[float]) -> list[float]:
        """The mean over the training ranks (a server adds nothing)."""
        t = torch.tensor([0.0 if serving else v for v in values], dtype=torch.float64)
        if comm is not None:
            comm.all_reduce(t)
        else:
            dist.all_reduce(t)
        return (t / trainers).tolist()

    @torch.no_grad()
    def val_loss() -> float:
        model.eval()
        starts = torch.linspace(0, len(val_data) - args.seq - 2, args.val_batches * args.batch)
        mine = starts.long().view(args.val_batches, args.batch)[rank::world]
        losses = [] if serving else [model(*get_batch(val_data, s, args.seq, device)).item()
                                     for s in mine]
        model.train()
        total, count = average([sum(losses), len(losses)])
        return total / count

    bar = Progress(args.steps) if rank == 0 else None
    losses, step_times, waits = [], [], []
    if timer is not None:
        timer.on = True
    t_start = time.perf_counter()
    if serving:
        ps.serve()
    for step in range(0 if serving else args.steps):
        t0 = time.perf_counter()
        starts = torch.randint(lo, lo + shard - args.seq - 1, (args.batch,), generator=gen)
        x, y = get_batch(train_data, starts, args.seq, device)
        opt.zero_grad(set_to_none=True)
        loss = net(x, y)
        loss.backward()
        if args.sync == "pyring" and ps is None:
            tw = time.perf_counter()
            opt.synchronize()  # waits for the buckets still in flight
            waits.append(time.perf_counter() - tw)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if ps is not None:
            ps.step()
        else:
            opt.step()
        sched.step()
        losses.append(loss.item())
        step_times.append(time.perf_counter() - t0)
        if bar is not None:
            bar.update(step + 1, losses[-1])
    if ps is not None and not serving:
        ps.close()  # the last pull: the servers' parameters, for the validation loss
    elapsed = time.perf_counter() - t_start
    if timer is not None:
        timer.on = False
    if bar is not None:
        bar.close()

    tail = max(1, min(20, args.steps // 5))
    first, last = average([statistics.fmean(losses[:tail]) if losses else 0.0,
                           statistics.fmean(losses[-tail:]) if losses else 0.0])
    vl = val_loss()
    busy = timer.busy if timer is not None else float("nan")
    stats = average([sum(waits), busy])
    timed = step_times[1:] or step_times or [float("nan")]  # the first warms up allocators
    rate = trainers * args.batch * len(timed) / sum(timed)
    if rank == 0:
        print(f"model: {n_params / 1e6:.2f} M parameters ({n_params * 4 / 2**20:.1f} MiB of "
              f"float32 gradients), {world} ranks x batch {args.batch} x seq {args.seq}, "
              f"sync={args.sync}, device={device.type}, threads/rank={args.threads}"
              + (f", mode=ps ({args.servers} server(s), wire {args.wire}"
                 f"{', pulls overlapped' if args.overlap_pull else ''})"
                 if ps is not None else ""))
        if ps is not None:
            print(f"ps           {ps.stats()}")
        print(f"train loss   {first:.4f} (mean of the first {tail} steps) -> {last:.4f} "
              f"(last {tail}), averaged over ranks")
        print(f"val loss     {vl:.4f} (held-out files, {args.val_batches * args.batch} "
              f"windows)  = {vl / math.log(2):.3f} bits/byte")
        print(f"throughput   {rate * args.seq:,.0f} tokens/s, {rate:,.1f} samples/s "
              f"(steps 2..{args.steps}; median step {statistics.median(timed) * 1e3:.1f} ms); "
              f"{args.steps} steps in {elapsed:.1f} s")
        if args.sync == "pyring" and ps is None:
            host = "; host time: the stream waits for the rest" if device.type == "cuda" else ""
            print(f"comm wait    {stats[0]:.2f} s in opt.synchronize() waiting for in-flight "
                  f"allreduces ({100 * stats[0] / elapsed:.1f}% of the run; mean over ranks; "
                  f"includes waiting for a slower rank{host})")
        elif ps is not None:
            print(f"comm wait    {ps.stats()['waited_s']:.2f} s waiting for pulls on rank 0")
        else:
            print("comm wait    not separable: DDP waits for its allreduces inside backward()")
        if timer is not None:
            print(f"comm busy    {stats[1]:.2f} s of pyring allreduce in flight on the progress "
                  f"thread ({timer.count} allreduces, {timer.nbytes / 2**20:.0f} MiB on rank 0;"
                  f" upper bound: includes waiting for peers; mean over ranks)")
        else:
            print("comm busy    not measured (gloo's works expose no timing)")
        if args.json:
            Path(args.json).write_text(json.dumps({
                "sync": args.sync, "mode": args.mode, "overlap_pull": args.overlap_pull,
                "world": world, "steps": args.steps, "params": n_params,
                "device": str(device), "ranks_per_gpu": args.ranks_per_gpu,
                "threads_per_rank": args.threads, "train_loss_first": first,
                "train_loss_last": last, "val_loss": vl, "tokens_per_s": rate * args.seq,
                "median_step_s": statistics.median(timed), "elapsed_s": elapsed,
                "comm_wait_s": stats[0] if args.sync == "pyring" else None,
            }, indent=1))
    if args.sync == "pyring":
        pyring.destroy()
    else:
        dist.destroy_process_group()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: cuda when torch.cuda.is_available()")
    p.add_argument("--ranks-per-gpu", type=int, default=1,
                   help="ranks sharing one GPU: local rank r uses GPU r // N")
    p.add_argument("--ranks", type=int, default=None,
                   help="local ranks to spawn (ignored under torchrun; default: GPUs x "
                   "--ranks-per-gpu on CUDA, else 2)")
    p.add_argument("--sync", choices=SYNCS, default="pyring")
    p.add_argument("--mode", choices=MODES, default="sync",
                   help="ps: a parameter server (the last --servers ranks), with --sync pyring")
    p.add_argument("--servers", type=int, default=1, help="--mode ps: ranks serving")
    p.add_argument("--wire", default="fp32", choices=WIRES,
                   help="--mode ps: the pushes' wire")
    p.add_argument("--overlap-pull", action="store_true",
                   help="--mode ps: each pull is taken at the next step (overlap_pull=True) "
                   "instead of waited for: for links whose round trip outlasts a step")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=16, help="sequences per rank per step")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads per rank (0: cores // ranks, at least 1)")
    p.add_argument("--data-mb", type=float, default=4.0, help="corpus size read from the stdlib")
    p.add_argument("--val-batches", type=int, default=8)
    p.add_argument("--bucket-mb", type=float, default=1.0,
                   help="pyring's gradient bucket size (MiB); DDP keeps its own (25)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpu", action="store_true", help="the same as --device cpu")
    p.add_argument("--json", metavar="PATH", help="rank 0 also writes the summary here as JSON")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="deadline (s) of the rendezvous and of every collective")
    p.add_argument("--time-limit", type=float, default=1800.0,
                   help="the spawned ranks are killed after this many seconds")
    args = p.parse_args(argv)
    if args.dim % args.heads:
        p.error("--dim must be a multiple of --heads")
    if args.ranks_per_gpu < 1:
        p.error("--ranks-per-gpu must be >= 1")
    if args.mode == "ps" and args.sync != "pyring":
        p.error("--mode ps runs on --sync pyring")
    if args.overlap_pull and args.mode != "ps":
        p.error("--overlap-pull is a --mode ps flag")
    gpus = gpu_count()
    if args.cpu or args.device == "auto":
        args.device = "cuda" if gpus and not args.cpu else "cpu"
    elif args.device == "cuda" and not gpus:
        p.error("--device cuda: torch.cuda.is_available() is False")
    fits = gpus * args.ranks_per_gpu
    if args.ranks is None:
        args.ranks = fits if args.device == "cuda" else 2
    elif args.device == "cuda" and args.ranks > fits and "RANK" not in os.environ:
        p.error(f"--ranks {args.ranks}: {gpus} GPU(s) x --ranks-per-gpu {args.ranks_per_gpu} "
                f"hold {fits} ranks")
    return args


def main() -> None:
    args = parse()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun
        world = int(os.environ["WORLD_SIZE"])
        args.threads = args.threads or max(1, (os.cpu_count() or 1) // world)
        train(int(os.environ["RANK"]), world, None, args)
        return
    args.threads = args.threads or max(1, (os.cpu_count() or 1) // args.ranks)
    try:
        run_ranks(args.ranks, train, args, timeout=args.time_limit)
    except Exception as e:
        sys.exit(f"train.py: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
