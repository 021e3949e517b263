"""The GPU benchmarks of the self-check (pyring/tools/selfcheck.py), run in spawned ranks: the CUDA
kernels beside a device-to-device copy, and allreduce on one GPU beside gloo, NCCL and the
host copies. Each function returns plain data (JSON-ready); figures are in seconds and GB/s
(1e9 bytes per second)."""

from __future__ import annotations

import datetime
import statistics
import time
from typing import Any, Callable

from .timing import slowest_per_iteration

MIB = 1 << 20
KERNEL_BYTES, ALLREDUCE_BYTES = 256 * MIB, 64 * MIB
# (world, library) in the order they run; "copies": a pinned D2H then H2D of the buffer.
# "pyring" binds each rank to cuda:0 at init (cuda_ipc, the ring on the device);
# "pyring-hostwait" too, but waits for each call on the host (work.synchronize()) instead of
# making the caller's stream wait for it;
# "pyring-staged" binds at the first call (staged through pinned host memory).
# "pyring-bf16" and "pyring-onebit": the compressed wires, their codec on the GPU (not bound:
# encoded bytes cross through pinned host memory).
# "pyring-symmetric": the buffer from pyring.empty on cuda:0, so the call runs zero-copy.
ALLREDUCE_JOBS = ((1, "copies"), (2, "pyring-symmetric"), (1, "pyring"), (1, "nccl"),
                  (2, "pyring"), (2, "pyring-staged"), (2, "pyring-bf16"), (2, "pyring-onebit"),
                  (2, "gloo"), (4, "pyring-symmetric"), (4, "pyring"), (4, "pyring-staged"),
                  (4, "gloo"))
WIRE_JOBS = {"pyring-bf16": "bf16", "pyring-onebit": "onebit"}
BOUND_JOBS = ("pyring", "pyring-hostwait")


def launch(world: int, fn: Callable, *args: Any, timeout: float) -> list[Any]:
    """fn(rank, world, store, *args) on `world` spawned ranks, their results in rank order,
    through the project's one launcher (pyring.launch). Raises when a rank fails or outlives
    `timeout`."""
    from ..launch import run_ranks

    return run_ranks(world, fn, *args, timeout=timeout, hard_exit=True)


# ----------------------------------------------------------------------------- kernels
def kernels_rank(rank: int, world: int, store: Any, nbytes: int, rounds: int,
                 iters: int) -> dict[str, Any]:
    """GB/s of dst.copy_(src), cuda_reduce_accumulate and cuda_onebit_encode (with a kept
    bfloat16 residual) on nbytes of float32, interleaved round by round after one warm-up
    round; per kernel the median round and the ratio to the copy's. Bytes are those the
    operation must read and write once: copy 8 per element; reduce 12 (a, b, out); encode 8
    (input 4, residual in and out 2 each) plus the encoded bytes. A kernel that sweeps a buffer
    twice gets no credit for it."""
    import torch

    from pyring import _C

    torch.cuda.set_device(0)
    n = nbytes // 4
    a, b, out = (torch.randn(n, device="cuda") for _ in range(3))
    residual = torch.zeros(n, dtype=torch.bfloat16, device="cuda")
    pending = [0.0]  # the kept residual's scale
    enc = torch.empty(16 + 2 * ((n + 7) // 8), dtype=torch.uint8, device="cuda")
    ws = torch.empty(_C.cuda_onebit_workspace_bytes(), dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    f32, op_sum = _C.DTYPE_NAMES.index("float32"), _C.OP_NAMES.index("sum")
    encoded = [0]

    def reduce() -> None:  # out = a + b
        _C.cuda_reduce_accumulate(f32, op_sum, a.data_ptr(), b.data_ptr(), out.data_ptr(), n,
                                  stream)

    def encode() -> None:  # reads a and residual, writes residual and enc; syncs the stream
        encoded[0], pending[0] = _C.cuda_onebit_encode(
            a.data_ptr(), residual.data_ptr(), pending[0], n, enc.data_ptr(), ws.data_ptr(),
            stream)[:2]

    kernels = {"copy": lambda: out.copy_(a), "reduce_accumulate": reduce,
               "onebit_encode": encode}
    rates: dict[str, list[float]] = {k: [] for k in kernels}
    for r in range(rounds + 1):
        for name, call in kernels.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                call()
            end.record()
            end.synchronize()
            moved = {"copy": 8 * n, "reduce_accumulate": 12 * n}.get(name, 8 * n + encoded[0])
            if r:
                rates[name].append(moved * iters / (start.elapsed_time(end) / 1e3) / 1e9)
    reduce()
    wrong = int((out != a + b).sum())
    res: dict[str, Any] = {k: {"GBps": statistics.median(v), "rounds_GBps": v}
                           for k, v in rates.items()}
    for k in ("reduce_accumulate", "onebit_encode"):
        res[k]["vs_copy"] = res[k]["GBps"] / res["copy"]["GBps"]
    return res | {"reduce_wrong": wrong, "onebit_bytes": encoded[0]}


def measure_kernels(timeout: float) -> dict[str, Any]:
    (res,) = launch(1, kernels_rank, KERNEL_BYTES, 5, 20, timeout=timeout)
    out = {"bytes": KERNEL_BYTES, "dtype": "float32", **res, "values": {
        "reduce_vs_copy": res["reduce_accumulate"]["vs_copy"],
        "onebit_vs_copy": res["onebit_encode"]["vs_copy"]}}
    if res["reduce_wrong"]:
        out["error"] = f"cuda_reduce_accumulate: {res['reduce_wrong']} wrong elements"
    return out


# ----------------------------------------------------------------------------- device fault
FAULT_LIMIT_S = 2.0
FAULT_DEADLINE_S = 60.0  # the collectives' deadline: the fault must be reported long before it
FAULT_CASES = (("faulted-before", 0.0), ("faults-while-waiting", 0.3))


def measure_device_fault(timeout: float) -> dict[str, Any]:
    """pyring.tools.device_fault.device_fault on 2 ranks sharing GPU 0: a kernel that writes out of
    bounds on rank 0's stream, run before the all_reduce or while it waits. Every rank must raise
    CommError naming cudaErrorIllegalAddress within FAULT_LIMIT_S."""
    from . import device_fault as faults

    out: dict[str, Any] = {"limit_s": FAULT_LIMIT_S, "deadline_s": FAULT_DEADLINE_S, "cases": {}}
    bad: list[str] = []
    for name, late_s in FAULT_CASES:
        results = launch(2, faults.device_fault, "cuda", FAULT_DEADLINE_S, late_s,
                         timeout=timeout / len(FAULT_CASES))
        out["cases"][name] = [r["error"] for r in results]
        bad += [f"{name}: {b}" for b in faults.check_device_fault(results, FAULT_LIMIT_S)]
    waited = [e[2] for errors in out["cases"].values() for e in errors if e is not None]
    out["values"] = {"device_fault_s": max(waited)} if not bad else {}
    if bad:
        out["error"] = "; ".join(bad)
    return out


# ----------------------------------------------------------------------------- allreduce
def allreduce_rank(rank: int, world: int, store: Any, lib: str, nbytes: int, warmup: int,
                   iters: int, timeout: float) -> dict[str, Any]:
    """Per-iteration seconds of an in-place float32 sum on GPU 0, each call followed by
    torch.cuda.synchronize(). Every rank starts from ones, so after k calls every element is
    world**k (exact for world 1, 2, 4): "wrong" counts the others. lib "copies" times a
    pinned D2H then H2D of the buffer, and a device-to-device copy, with CUDA events instead."""
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    t = torch.ones(nbytes // 4, device="cuda")
    if lib == "copies":
        host = torch.empty(t.numel(), pin_memory=True)
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        other = torch.empty_like(t)
        ev.append(torch.cuda.Event(enable_timing=True))
        d2h, h2d, d2d = [], [], []
        for i in range(warmup + iters):
            ev[0].record()
            host.copy_(t, non_blocking=True)
            ev[1].record()
            t.copy_(host, non_blocking=True)
            ev[2].record()
            other.copy_(t)
            ev[3].record()
            ev[3].synchronize()
            if i >= warmup:
                d2h.append(ev[0].elapsed_time(ev[1]) / 1e3)
                h2d.append(ev[1].elapsed_time(ev[2]) / 1e3)
                d2d.append(ev[2].elapsed_time(ev[3]) / 1e3)
        return {"d2h_s": d2h, "h2d_s": h2d, "d2d_s": d2d}
    transport = None
    if lib.startswith("pyring"):
        import pyring

        comm = pyring.init(rank, world, store, timeout=timeout,
                           device="cuda:0" if lib in BOUND_JOBS else None)
        transport = comm._c.device_transport
        if lib == "pyring-symmetric":
            t = pyring.empty(t.numel(), device="cuda:0", comm=comm).fill_(1.0)
            transport = "zero-copy"
        call: Callable[[], Any] = lambda: comm.all_reduce(t)  # noqa: E731
        if lib == "pyring-hostwait":
            call = lambda: comm.all_reduce(t, async_op=True).synchronize()  # noqa: E731
        if lib in WIRE_JOBS:
            from pyring.optim.compression import all_reduce_wire

            state = pyring.OneBitState()
            call = lambda: all_reduce_wire(comm, t, "avg", WIRE_JOBS[lib], state)  # noqa: E731
    else:
        dist.init_process_group(lib, store=store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout))
        call = lambda: dist.all_reduce(t)  # noqa: E731
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    store.set(f"timed/{rank}", "1")  # every rank starts its timed calls together
    store.wait([f"timed/{r}" for r in range(world)], datetime.timedelta(seconds=timeout))
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        call()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    # The wires average (every value stays 1, as their codecs keep it): "wrong" counts others.
    want = 1.0 if lib in WIRE_JOBS else float(world) ** (warmup + iters)
    return {"times_s": times, "wrong": int((t != want).sum()), "device_transport": transport}


def measure_allreduce(limit: Callable[[float], float]) -> dict[str, Any]:
    """Every job of ALLREDUCE_JOBS in fresh ranks (limit(cap): the seconds a job may take). A
    collective's time is the median over iterations of the slowest rank's; busbw is
    algbw x 2(n-1)/n as in nccl-tests."""
    out: dict[str, Any] = {"bytes": ALLREDUCE_BYTES, "dtype": "float32", "device": "cuda:0",
                           "runs": {}}
    for world, lib in ALLREDUCE_JOBS:
        key = f"{lib} x{world}"
        warmup, iters = (2, 8) if lib == "gloo" else (3, 20)
        try:
            ranks = launch(world, allreduce_rank, lib, ALLREDUCE_BYTES, warmup, iters, 30.0,
                           timeout=limit(90))
        except Exception as e:
            out["runs"][key] = {"error": f"{type(e).__name__}: {e}"[-3000:]}
            continue
        if lib == "copies":
            d2h, h2d = ranks[0]["d2h_s"], ranks[0]["h2d_s"]
            out["runs"][key] = {"d2h_s": statistics.median(d2h), "h2d_s": statistics.median(h2d),
                                "d2d_s": statistics.median(ranks[0]["d2d_s"]),
                                "time_s": statistics.median([x + y for x, y in zip(d2h, h2d)])}
            continue
        slowest = slowest_per_iteration([r["times_s"][:iters] for r in ranks])
        med = statistics.median(slowest)
        out["runs"][key] = {"time_s": med, "min_s": min(slowest), "iters": iters,
                            "algbw_GBps": ALLREDUCE_BYTES / med / 1e9,
                            "busbw_GBps": ALLREDUCE_BYTES / med / 1e9 * 2 * (world - 1) / world,
                            "wrong": sum(r["wrong"] for r in ranks),
                            "device_transport": ranks[0]["device_transport"]}
    t = {k: v.get("time_s") for k, v in out["runs"].items()}
    values = {}
    if t.get("pyring x2") and t.get("gloo x2"):
        values["gloo_over_pyring_w2"] = t["gloo x2"] / t["pyring x2"]
    if t.get("pyring-staged x2") and t.get("copies x1"):
        values["pyring_over_copies_w2"] = t["pyring-staged x2"] / t["copies x1"]
    for lib in WIRE_JOBS:
        if t.get(f"{lib} x2") and t.get("pyring-staged x2"):
            values[f"staged_fp32_over_{lib.removeprefix('pyring-')}_w2"] = (
                t["pyring-staged x2"] / t[f"{lib} x2"])
    d2d = out["runs"].get("copies x1", {}).get("d2d_s")
    if t.get("pyring x2") and d2d:
        # The device ring at 2 ranks copies the buffer once to the peer and back in halves.
        values["pyring_ipc_over_d2d_w2"] = t["pyring x2"] / d2d
    for w in (2, 4):
        if t.get(f"pyring-symmetric x{w}") and d2d:  # the target: <= 3 at 2 ranks
            values[f"symmetric_over_d2d_w{w}"] = t[f"pyring-symmetric x{w}"] / d2d
    out["values"] = values
    bad = [k for k, v in out["runs"].items() if "error" in v or v.get("wrong")]
    if bad:
        out["error"] = f"failed or wrong: {', '.join(bad)}"
    return out


# ----------------------------------------------------------------------------- sanitizer
# The jobs the self-check runs under compute-sanitizer: each path a 2-rank allreduce takes on
# one GPU (the device ring over cuda_ipc, staging through pinned host memory, the one-bit wire's
# device codec, zero-copy on symmetric memory), on an odd element count so that no kernel sees
# only whole blocks.
SANITIZE_JOBS = ("pyring", "pyring-staged", "pyring-onebit", "pyring-symmetric")
SANITIZE_ELEMENTS = (1 << 18) + 37


def sanitize_jobs(timeout: float = 120.0) -> int:
    """Runs SANITIZE_JOBS at 2 ranks, one after another; prints one JSON line, {job: "ok" or
    the error}, and returns the exit status: 0 when every job ran and summed right."""
    import json

    out: dict[str, str] = {}
    for lib in SANITIZE_JOBS:
        try:
            ranks = launch(2, allreduce_rank, lib, 4 * SANITIZE_ELEMENTS, 1, 2, 60.0,
                           timeout=timeout)
            wrong = sum(r["wrong"] for r in ranks)
            out[lib] = f"{wrong} wrong elements" if wrong else "ok"
        except Exception as e:
            out[lib] = f"{type(e).__name__}: {e}"[:1500]
    print("sanitize_jobs " + json.dumps(out), flush=True)
    return 0 if all(v == "ok" for v in out.values()) else 1
