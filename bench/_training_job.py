"""One job of bench/training.py: two spawned ranks that measure one sync method in every mode,
interleaved in blocks so that the machine's drift (seconds to minutes on a shared VM) hits
every mode alike.

Modes (each block runs every mode once, in an order rotated per block):
  x2        the method at 2 ranks
  x1        the method at 1 rank: rank 0 alone, on a 1-rank communicator or process group of
            its own, while rank 1 sleeps in a store wait
  compute2  the bare model (AdamW, no communication) on both ranks side by side
  compute1  the bare model on rank 0 alone
  alone2    one allreduce of a flat tensor of the gradients' size on both ranks, with the
            method's library and nothing else running
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

MODES = ("x2", "x1", "compute2", "compute1", "alone2")
PAIR_MODES = ("x2", "compute2", "alone2")  # both ranks run them


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


def _meet(store: Any, key: str, rank: int, ranks: int) -> None:
    store.set(f"{key}/{rank}", "1")
    store.wait([f"{key}/{r}" for r in range(ranks)])


def worker(rank: int, world: int, port: int, method: str, cfg: dict[str, Any]) -> None:
    """One rank; leaves {"modes": {mode: {"times": [...], "waits": [...]}}, "params": n} in
    the store under result/<rank>."""
    train.watch_parent()
    if cfg.get("pin"):  # this rank and every thread it starts (pyring's, gloo's) on one core
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    torch.set_num_threads(1)
    assert world == 2, "a training job has two ranks"
    timeout = cfg["timeout"]
    td = datetime.timedelta(seconds=timeout)
    store = dist.TCPStore("127.0.0.1", port, world + 1, is_master=False, timeout=td)
    comm = solo = None
    if method == "pyring":
        comm = pyring.init(rank, world, dist.PrefixStore("pair", store), timeout=timeout)
        if rank == 0:
            solo = pyring.init(0, 1, dist.PrefixStore("solo", store), timeout=timeout,
                               set_default=False)
        setups = {"x2": _build(method, cfg, comm=comm)}
        if rank == 0:
            setups["x1"] = _build(method, cfg, comm=solo)
    else:
        backend = "pyring" if method.startswith("ddp-pyring") else "gloo"
        dist.init_process_group(backend, store=dist.PrefixStore("pg", store), rank=rank,
                                world_size=world, timeout=td)
        group1 = dist.new_group([0])  # every rank takes part in creating it
        setups = {"x2": _build(method, cfg)}
        if rank == 0:
            setups["x1"] = _build(method, cfg, group=group1)
    setups["compute2"] = _build("compute", cfg)
    if rank == 0:
        setups["compute1"] = setups["compute2"]
    n = sum(p.numel() for p in setups["compute2"][0].parameters())
    flat = torch.ones(n)

    gen = torch.Generator().manual_seed(rank)
    shape = (cfg["batch"], cfg["seq"])

    def iteration(mode: str) -> tuple[float, float]:
        """One timed iteration of `mode`: (seconds, seconds waited in synchronize())."""
        if mode == "alone2":
            t0 = time.perf_counter()
            if comm is not None:
                comm.all_reduce(flat, op="avg")
            else:
                dist.all_reduce(flat)
            return time.perf_counter() - t0, 0.0
        net, opt = setups[mode]
        x = torch.randint(0, 256, shape, generator=gen)
        y = torch.randint(0, 256, shape, generator=gen)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        net(x, y).backward()
        wait = 0.0
        if method == "pyring" and mode in ("x1", "x2"):
            tw = time.perf_counter()
            opt.synchronize()
            wait = time.perf_counter() - tw
        opt.step()
        return time.perf_counter() - t0, wait

    out: dict[str, dict[str, list[float]]] = {m: {"times": [], "waits": []} for m in MODES}
    _meet(store, "ready", rank, world)
    per_block = cfg["block"]
    for b in range(cfg["warmup"] + cfg["blocks"]):
        timed = b >= cfg["warmup"]
        for k in range(len(MODES)):
            mode = MODES[(b + k) % len(MODES)]
            if mode in PAIR_MODES:
                _meet(store, f"go/{b}/{mode}", rank, world)
            elif rank != 0:  # rank 0 runs it alone; this rank sleeps until it is done
                store.wait([f"done/{b}/{mode}"])
                continue
            for i in range(per_block + 1):
                t, w = iteration(mode)
                if timed and i > 0:
                    out[mode]["times"].append(t)
                    out[mode]["waits"].append(w)
            if mode not in PAIR_MODES:
                store.set(f"done/{b}/{mode}", "1")
    store.set(f"result/{rank}", json.dumps({"modes": out, "params": n}))
    _meet(store, "finished", rank, world)
    if comm is not None:
        pyring.destroy(comm)
        if solo is not None:
            pyring.destroy(solo)
    elif dist.is_initialized():
        dist.destroy_process_group()
