"""One job of bench/training.py: two spawned ranks that measure every sync method in every
mode, interleaved in blocks, so that the machine's drift (seconds to minutes on a shared VM)
hits every method and mode alike and ratios are taken side by side.

Modes (each block runs every mode once, in an order rotated per block):
  <method> x2     the method at 2 ranks
  <method> x1     the method at 1 rank: rank 0 alone, on a 1-rank communicator or process
                  group of its own, while rank 1 sleeps in a store wait
  compute x2/x1   the bare model (AdamW, no communication) on both ranks / on rank 0 alone
  lockstep x2     the bare model on both ranks with one 1-element pyring allreduce after
                  backward: the ranks meet once per step, as any synchronous method's must,
                  but exchange no gradients
  alone-<lib> x2  one allreduce of a flat tensor of the gradients' size on both ranks, with
                  pyring (avg) or gloo (sum) and nothing else running
Each mode has its own model and optimizer (all from the same seed). The first iteration of a
mode in each block is untimed (it runs on caches the other modes left), and so are the
--warmup blocks.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from typing import Any

import torch
import torch.distributed as dist
import train  # examples/train.py: model, launcher

import pyring
from pyring.rendezvous import store_barrier

# Per timed iteration: its time, then its phases (forward includes zero_grad; waits is the
# time in pyring's synchronize() or lockstep's allreduce, 0 elsewhere; DDP waits for its
# buckets inside backward).
FIELDS = ("times", "forward", "backward", "waits", "optimizer")


def modes_for(methods: list[str]) -> list[str]:
    out = [f"{m} x{w}" for m in methods for w in (2, 1)]
    libs = sorted({"gloo" if "gloo" in m else "pyring" for m in methods})
    return (out + ["compute x2", "compute x1", "lockstep x2"]
            + [f"alone-{lib} x2" for lib in libs])


def _build(method: str, cfg: dict[str, Any], comm: Any = None, group: Any = None
           ) -> tuple[Any, Any]:
    """(net, optimizer) for `method` ("compute" for none), synced over comm or group."""
    torch.manual_seed(0)
    model = train.CharGPT(cfg["dim"], cfg["layers"], cfg["heads"], cfg["seq"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    net = model
    if method == "pyring":
        opt = pyring.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                          comm=comm, bucket_bytes=25 << 20)
    elif method != "compute":
        net = torch.nn.parallel.DistributedDataParallel(
            model, process_group=group, gradient_as_bucket_view=not method.endswith("-copy"))
    return net, opt


def worker(rank: int, world: int, port: int, methods: list[str], cfg: dict[str, Any]) -> None:
    """One rank; leaves {"modes": {mode: {field: [...] for field in FIELDS}}, "params": n} in
    the store under result/<rank>."""
    train.watch_parent()
    if cfg.get("pin"):  # this rank and every thread it starts (pyring's, gloo's) on one core
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    torch.set_num_threads(1)
    assert world == 2, "a training job has two ranks"
    timeout = cfg["timeout"]
    everyone = list(range(world))
    td = datetime.timedelta(seconds=timeout)
    store = dist.TCPStore("127.0.0.1", port, world + 1, is_master=False, timeout=td)
    # Every rank creates every group, in the same order (torch.distributed requires it).
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank,
                            world_size=world, timeout=td)
    groups = {("gloo", 2): None, ("gloo", 1): dist.new_group([0], backend="gloo")}
    if any(m.startswith("ddp-pyring") for m in methods):
        groups[("pyring", 2)] = dist.new_group(backend="pyring")
        groups[("pyring", 1)] = dist.new_group([0], backend="pyring")
    comm = pyring.init(rank, world, dist.PrefixStore("pair", store), timeout=timeout)
    solo = (pyring.init(0, 1, dist.PrefixStore("solo", store), timeout=timeout,
                        set_default=False) if rank == 0 else None)

    modes = modes_for(methods)
    setups: dict[str, tuple[Any, Any]] = {}
    for mode in modes:
        method, ranks = mode.split(" x")[0], int(mode[-1])
        if method.startswith("alone-") or (ranks == 1 and rank != 0):
            continue
        if method in ("compute", "lockstep"):
            setups[mode] = _build("compute", cfg)
        elif method == "pyring":
            setups[mode] = _build(method, cfg, comm=comm if ranks == 2 else solo)
        else:
            lib = "pyring" if method.startswith("ddp-pyring") else "gloo"
            setups[mode] = _build(method, cfg, group=groups[(lib, ranks)])
    n = sum(p.numel() for p in setups["compute x2"][0].parameters())
    flat = torch.ones(n)
    token = torch.zeros(1)
    gen = torch.Generator().manual_seed(rank)
    shape = (cfg["batch"], cfg["seq"])

    def iteration(mode: str) -> tuple[float, ...]:
        """One iteration of `mode`: seconds in all, then in zero_grad + forward, backward,
        synchronize() and the optimizer's step."""
        if mode.startswith("alone-"):
            t0 = time.perf_counter()
            if mode.startswith("alone-pyring"):
                comm.all_reduce(flat, op="avg")
            else:
                dist.all_reduce(flat)
            return time.perf_counter() - t0, 0.0, 0.0, 0.0, 0.0
        net, opt = setups[mode]
        x = torch.randint(0, 256, shape, generator=gen)
        y = torch.randint(0, 256, shape, generator=gen)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = net(x, y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = t3 = time.perf_counter()
        if mode.startswith("pyring "):
            opt.synchronize()
            t3 = time.perf_counter()
        elif mode.startswith("lockstep "):
            comm.all_reduce(token)
            t3 = time.perf_counter()
        opt.step()
        t4 = time.perf_counter()
        return t4 - t0, t1 - t0, t2 - t1, t3 - t2, t4 - t3

    out: dict[str, dict[str, list[float]]] = {m: {k: [] for k in FIELDS} for m in modes}
    store_barrier(store, "ready", rank, everyone, timeout)
    for b in range(cfg["warmup"] + cfg["blocks"]):
        timed = b >= cfg["warmup"]
        for k in range(len(modes)):
            mode = modes[(b + k) % len(modes)]
            alone = mode.endswith("x1")
            if not alone:
                store_barrier(store, f"go/{b}/{mode}", rank, everyone, timeout)
            elif rank != 0:  # rank 0 runs it alone; this rank sleeps until it is done
                store.wait([f"done/{b}/{mode}"])
                continue
            for i in range(cfg["block"] + 1):
                values = iteration(mode)
                if timed and i > 0:
                    for k, v in zip(FIELDS, values):
                        out[mode][k].append(v)
            if alone:
                store.set(f"done/{b}/{mode}", "1")
    store.set(f"result/{rank}", json.dumps({"modes": out, "params": n}))
    store_barrier(store, "finished", rank, everyone, timeout)
    pyring.destroy(comm)
    if solo is not None:
        pyring.destroy(solo)
    dist.destroy_process_group()
