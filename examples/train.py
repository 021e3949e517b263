#!/usr/bin/env python
"""Train a small character-level transformer on the Python standard library's own source,
on N local ranks whose gradients are averaged by pyring. Needs no download.

    PYTHONPATH=. python examples/train.py                      # 2 CPU ranks (1 per GPU if any)
    PYTHONPATH=. python examples/train.py --sync ddp-gloo      # the same run on DDP + gloo
    PYTHONPATH=. torchrun --nproc-per-node 2 examples/train.py

--sync pyring: pyring.DistributedOptimizer(AdamW) averages gradient buckets while backward
runs, and opt.synchronize() waits for the rest; ddp-pyring: DistributedDataParallel on the
"pyring" torch.distributed backend; ddp-gloo: DistributedDataParallel on gloo (both DDPs with
gradient_as_bucket_view=True).
Started without torchrun, the script spawns its own ranks, which meet through a TCPStore on
127.0.0.1 held by this process; a failing rank, a hang past --time-limit or the death of the
parent ends every rank.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import math
import os
import statistics
import sys
import threading
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import pyring

SYNCS = ("pyring", "ddp-pyring", "ddp-gloo")


# ----------------------------------------------------------------------------- data and model
def load_corpus(max_bytes: int) -> torch.Tensor:
    """The stdlib's *.py files (site-packages excluded), sorted by path, up to max_bytes."""
    root = os.path.dirname(os.__file__)
    paths = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in ("site-packages", "dist-packages"))
        paths += [os.path.join(d, f) for f in files if f.endswith(".py")]
    out, n = [], 0
    for p in sorted(paths, key=lambda p: os.path.relpath(p, root)):
        with open(p, "rb") as f:
            b = f.read(max_bytes - n)
        out.append(b)
        n += len(b)
        if n >= max_bytes:
            break
    return torch.frombuffer(bytearray(b"".join(out)), dtype=torch.uint8)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class CharGPT(nn.Module):
    """A GPT over bytes (vocabulary 256) with learned positions; forward returns the loss."""

    def __init__(self, dim: int = 128, layers: int = 4, heads: int = 4, seq: int = 128) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(256, dim), nn.Embedding(seq, dim)
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, 256, bias=False)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        logits = self.head(self.ln(self.blocks(h)))
        return F.cross_entropy(logits.view(-1, 256), y.reshape(-1))


def get_batch(data: torch.Tensor, starts: torch.Tensor, seq: int,
              device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    idx = starts[:, None] + torch.arange(seq + 1)
    w = data[idx].long().to(device)
    return w[:, :-1], w[:, 1:]


# ----------------------------------------------------------------------------- processes
def watch_parent() -> None:
    """Exits this process as soon as the process that started it is gone."""
    parent = os.getppid()

    def loop() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(3)

    threading.Thread(target=loop, daemon=True, name="watch-parent").start()


def launch(fn: Any, world: int, fn_args: tuple, time_limit: float) -> dist.TCPStore:
    """Runs fn(rank, world, store_port, *fn_args) on `world` spawned processes that meet
    through a TCPStore held here (returned, so that ranks can leave results in it). Raises
    when a rank fails (the others are killed) or on time_limit (every rank is killed)."""
    import torch.multiprocessing as mp

    store = dist.TCPStore("127.0.0.1", 0, world + 1, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=time_limit))
    ctx = mp.start_processes(fn, args=(world, store.port, *fn_args), nprocs=world, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + time_limit
    try:
        while not ctx.join(timeout=0.5):  # raises when a rank failed, killing the others
            if time.monotonic() > deadline:
                raise TimeoutError(f"ranks still running after {time_limit:.0f} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join(5)
    return store


def connect(sync: str, rank: int, world: int, port: int | None, timeout: float) -> Any:
    """Joins the job; returns the pyring Communicator for --sync pyring, else None (the
    default process group is then set up)."""
    td = datetime.timedelta(seconds=timeout)
    store = None if port is None else dist.TCPStore(
        "127.0.0.1", port, world + 1, is_master=False, timeout=td)
    if sync == "pyring":
        return (pyring.init(timeout=timeout) if store is None
                else pyring.init(rank, world, store, timeout=timeout))
    kw = {} if store is None else {"store": store, "rank": rank, "world_size": world}
    dist.init_process_group("pyring" if sync == "ddp-pyring" else "gloo", timeout=td, **kw)
    return None


def pyring_comm_of_default_group() -> Any:
    """The Communicator under the default process group when its backend is pyring."""
    group = dist.group.WORLD
    if getattr(group, "comm", None) is not None:  # Python backends are the group itself
        return group.comm
    try:
        return group._get_backend(torch.device("cpu")).comm
    except (AttributeError, RuntimeError):
        return None


class BusyTimer:
    """Times the asynchronous allreduces submitted on a pyring Communicator (by wrapping its
    all_reduce). The progress thread runs them in order, so work k occupies it at most from
    max(submitted_k, done_{k-1}) to done_k; `busy` sums those spans (including time spent
    waiting for the peers to submit the same bucket). Timestamps come from Python callbacks."""

    def __init__(self, comm: Any) -> None:
        self.busy, self.count, self.nbytes, self.last_done = 0.0, 0, 0, 0.0
        self.on = False
        self._lock = threading.Lock()
        original = comm.all_reduce

        def all_reduce(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            work = original(tensor, *args, **kwargs)
            if work is not None and self.on:
                self.count += 1
                self.nbytes += tensor.numel() * tensor.element_size()
                work.get_future().add_done_callback(functools.partial(self._done, t0))
            return work

        comm.all_reduce = all_reduce

    def _done(self, t0: float, _fut: Any) -> None:
        t1 = time.perf_counter()
        with self._lock:
            self.busy += t1 - max(t0, self.last_done)
            self.last_done = t1


# ----------------------------------------------------------------------------- training
def train(rank: int, world: int, port: int | None, args: argparse.Namespace) -> None:
    watch_parent()
    torch.set_num_threads(args.threads)
    use_cuda = torch.cuda.is_available() and not args.cpu
    if use_cuda and args.sync != "ddp-gloo":  # pyring's collectives take CPU tensors for now
        use_cuda = False
        if rank == 0:
            print(f"note: --sync {args.sync} trains on the CPU (pyring takes CPU tensors)")
    device = torch.device(f"cuda:{rank % torch.cuda.device_count()}" if use_cuda else "cpu")
    comm = connect(args.sync, rank, world, port, args.timeout)
    if args.sync == "ddp-pyring":
        comm = pyring_comm_of_default_group()

    corpus = load_corpus(int(args.data_mb * 2**20))
    n_val = len(corpus) // 20  # the last 5% (the last files, by path) is held out
    train_data, val_data = corpus[:-n_val], corpus[-n_val:]
    shard = len(train_data) // world  # rank r draws its windows from shard r only
    lo = rank * shard
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)

    torch.manual_seed(args.seed + rank)  # different on purpose: rank 0's weights are broadcast
    model = CharGPT(args.dim, args.layers, args.heads, args.seq).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warm = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) * (
        0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, s / args.steps)))))
    if args.sync == "pyring":
        pyring.broadcast_parameters(model, src=0)
        pyring.broadcast_optimizer_state(opt, src=0)
        opt = pyring.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                          bucket_bytes=int(args.bucket_mb * 2**20))
        net = model
    else:  # DDP broadcasts rank 0's parameters and buffers at construction
        net = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if use_cuda else None, gradient_as_bucket_view=True)
    timer = BusyTimer(comm) if comm is not None else None

    def average(values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64)
        if comm is not None:
            comm.all_reduce(t, op="avg")
        else:
            dist.all_reduce(t)
            t /= world
        return t.tolist()

    @torch.no_grad()
    def val_loss() -> float:
        model.eval()
        starts = torch.linspace(0, len(val_data) - args.seq - 2, args.val_batches * args.batch)
        mine = starts.long().view(args.val_batches, args.batch)[rank::world]
        losses = [model(*get_batch(val_data, s, args.seq, device)).item() for s in mine]
        model.train()
        total, count = average([sum(losses), len(losses)])
        return total / count

    bar = Progress(args.steps) if rank == 0 else None
    losses, step_times, waits = [], [], []
    if timer is not None:
        timer.on = True
    t_start = time.perf_counter()
    for step in range(args.steps):
        t0 = time.perf_counter()
        starts = torch.randint(lo, lo + shard - args.seq - 1, (args.batch,), generator=gen)
        x, y = get_batch(train_data, starts, args.seq, device)
        opt.zero_grad(set_to_none=True)
        loss = net(x, y)
        loss.backward()
        if args.sync == "pyring":
            tw = time.perf_counter()
            opt.synchronize()  # waits for the buckets still in flight
            waits.append(time.perf_counter() - tw)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        step_times.append(time.perf_counter() - t0)
        if bar is not None:
            bar.update(step + 1, losses[-1])
    elapsed = time.perf_counter() - t_start
    if timer is not None:
        timer.on = False
    if bar is not None:
        bar.close()

    tail = max(1, min(20, args.steps // 5))
    first, last = average([statistics.fmean(losses[:tail]), statistics.fmean(losses[-tail:])])
    vl = val_loss()
    busy = timer.busy if timer is not None else float("nan")
    stats = average([sum(waits), busy])
    timed = step_times[1:] or step_times  # the first step warms up allocators and links
    rate = world * args.batch * len(timed) / sum(timed)
    if rank == 0:
        print(f"model: {n_params / 1e6:.2f} M parameters ({n_params * 4 / 2**20:.1f} MiB of "
              f"float32 gradients), {world} ranks x batch {args.batch} x seq {args.seq}, "
              f"sync={args.sync}, device={device.type}, threads/rank={args.threads}")
        print(f"train loss   {first:.4f} (mean of the first {tail} steps) -> {last:.4f} "
              f"(last {tail}), averaged over ranks")
        print(f"val loss     {vl:.4f} (held-out files, {args.val_batches * args.batch} "
              f"windows)  = {vl / math.log(2):.3f} bits/byte")
        print(f"throughput   {rate * args.seq:,.0f} tokens/s, {rate:,.1f} samples/s "
              f"(steps 2..{args.steps}; median step {statistics.median(timed) * 1e3:.1f} ms); "
              f"{args.steps} steps in {elapsed:.1f} s")
        if args.sync == "pyring":
            print(f"comm wait    {stats[0]:.2f} s in opt.synchronize() waiting for in-flight "
                  f"allreduces ({100 * stats[0] / elapsed:.1f}% of the run; mean over ranks; "
                  f"includes waiting for a slower rank)")
        else:
            print("comm wait    not separable: DDP waits for its allreduces inside backward()")
        if timer is not None:
            print(f"comm busy    {stats[1]:.2f} s of pyring allreduce in flight on the progress "
                  f"thread ({timer.count} allreduces, {timer.nbytes / 2**20:.0f} MiB on rank 0;"
                  f" upper bound: includes waiting for peers; mean over ranks)")
        else:
            print("comm busy    not measured (gloo's works expose no timing)")
    if args.sync == "pyring":
        pyring.destroy()
    else:
        dist.destroy_process_group()


class Progress:
    """tqdm when installed, else one line rewritten with \\r (one line per 10% when not a tty)."""

    def __init__(self, total: int) -> None:
        self.total, self.t0, self.last = total, time.perf_counter(), -1
        try:
            from tqdm import tqdm
            self.bar = tqdm(total=total, unit="step", dynamic_ncols=True)
        except ImportError:
            self.bar = None
        self.tty = sys.stderr.isatty()

    def update(self, n: int, loss: float) -> None:
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
            return
        tenth = 10 * n // self.total
        if not self.tty and tenth == self.last:
            return
        self.last = tenth
        dt = time.perf_counter() - self.t0
        eta = dt / n * (self.total - n)
        line = f"step {n}/{self.total}  loss {loss:.3f}  {dt:.0f}s elapsed, eta {eta:.0f}s"
        sys.stderr.write(("\r" + line) if self.tty else line + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.tty:
            sys.stderr.write("\n")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    p.add_argument("--ranks", type=int, default=gpus or 2,
                   help="local ranks to spawn (ignored under torchrun)")
    p.add_argument("--sync", choices=SYNCS, default="pyring")
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
    p.add_argument("--cpu", action="store_true", help="stay on the CPU even with CUDA")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="deadline (s) of the rendezvous and of every collective")
    p.add_argument("--time-limit", type=float, default=1800.0,
                   help="the spawned ranks are killed after this many seconds")
    args = p.parse_args(argv)
    if args.dim % args.heads:
        p.error("--dim must be a multiple of --heads")
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
        launch(train, args.ranks, (args,), args.time_limit)
    except Exception as e:
        sys.exit(f"train.py: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
