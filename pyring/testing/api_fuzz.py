"""Random calls of the Python API, run on a pool of real ranks: each call either returns the
right result on every rank, or raises TypeError or ValueError on every rank before a byte is
sent. Shared by tests/test_fuzz_api.py (a bounded run) and bench/soak.py (--fuzz-calls)."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import torch

from pyring.launch import Ranks
from pyring.optim.compression import STATELESS_WIRES

KINDS = ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor", "barrier",
         "reduce")
DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32",
          "int64", "bool", "complex64")
OPS = ("sum", "prod", "max", "min", "avg", "xor")
LAYOUTS = ("contiguous", "transposed", "strided", "expanded")
OUTS = (None, "fresh", "wrong_size", "wrong_dtype", "overlap", "same")
ALGOS = (None, "auto", "ring", "direct", "tree", "spiral")
WIRES = ("fp32", *STATELESS_WIRES)  # fp32 twice as often: the ordinary allreduce
TIMEOUT_S = 30.0


def make_input(spec: dict, rank: int) -> Any:
    """This rank's input, values small enough that every result is exact in every dtype."""
    dtype = getattr(torch, spec["dtype"])
    shape = tuple(spec["shape"])
    n = 1
    for d in shape:
        n *= d
    base = (torch.arange(n, dtype=torch.int64) % 5 + rank + 1).reshape(shape)
    layout = spec["layout"]
    if layout == "transposed" and len(shape) >= 2:
        base = base.transpose(0, 1).contiguous().transpose(0, 1)
    elif layout == "strided" and len(shape) >= 1:
        base = torch.stack([base, base], -1)[..., 0]
    elif layout == "expanded" and len(shape) >= 1 and shape[0] > 1:
        base = base[:1].expand(shape)
    t = base.to(dtype) if spec["device"] == "cpu" else torch.empty(shape, dtype=dtype,
                                                                   device="meta")
    return t.numpy() if spec["numpy"] and t.device.type == "cpu" and spec["dtype"] != "bfloat16" \
        else t


def _sent(comm: Any) -> int:
    s = comm.stats()
    return s["bytes_sent"] + s["p2p"]["bytes_sent"]


def execute(comm: Any, rank: int, spec: dict) -> tuple:
    """Runs one call; returns ('ok', result as a float64 tensor or None, bytes sent) or
    (exception type, message, bytes sent)."""
    t = make_input(spec, rank)
    kind, world = spec["kind"], comm.world_size
    before = _sent(comm)
    try:
        result = _run(comm, kind, t, spec, world)
    except Exception as e:  # reported to the driver, which judges it
        return type(e).__name__, str(e)[:500], _sent(comm) - before
    if result is not None:
        result = torch.as_tensor(result).to(torch.float64).reshape(-1)
    return "ok", result, _sent(comm) - before


def _like(t: Any, n: int, dtype: Any = None) -> Any:
    if isinstance(t, torch.Tensor):
        return torch.zeros(n, dtype=dtype or t.dtype, device=t.device)
    import numpy as np
    return np.zeros(n, dtype=dtype or t.dtype)


def _wait(w: Any) -> None:
    if w is not None:
        w.wait()


def _run(comm: Any, kind: str, t: Any, spec: dict, world: int) -> Any:
    a = spec["async_op"]
    n = t.numel() if isinstance(t, torch.Tensor) else t.size
    if kind == "all_reduce":
        out = {None: None, "fresh": lambda: _like(t, 0) if n == 0 else t * 0,
               "wrong_size": lambda: _like(t, n + 1),
               "wrong_dtype": lambda: _like(t, n, torch.float64 if isinstance(t, torch.Tensor)
                                            and t.dtype != torch.float64 else "int64"),
               "overlap": lambda: t.reshape(-1)[1:] if n > 1 else _like(t, n + 2),
               "same": lambda: t}[spec["out"]]
        out = out() if callable(out) else out
        _wait(comm.all_reduce(t, op=spec["op"], async_op=a, out=out, algo=spec["algo"],
                              wire=spec["wire"]))
        return t if out is None else out
    if kind == "broadcast":
        _wait(comm.broadcast(t, src=spec["root"], async_op=a))
        return t
    if kind == "all_gather_into_tensor":
        out = _like(t, n * world + (spec["out"] == "wrong_size"))
        _wait(comm.all_gather_into_tensor(out, t, async_op=a))
        return out
    if kind == "reduce_scatter_tensor":
        out = _like(t, n // world + (spec["out"] == "wrong_size"))
        _wait(comm.reduce_scatter_tensor(out, t, op=spec["op"], async_op=a))
        return out
    if kind == "reduce":
        _wait(comm.reduce(t, dst=spec["root"], op=spec["op"], async_op=a))
        return t
    _wait(comm.barrier(async_op=a))
    return None


def _reduce(inputs: list, op: str, dtype: Any) -> torch.Tensor:
    stack = torch.stack([x.to(torch.float64) for x in inputs])
    if op == "sum":
        r = stack.sum(0)
    elif op == "prod":
        r = stack.prod(0)
    elif op == "max":
        r = stack.max(0).values
    elif op == "min":
        r = stack.min(0).values
    else:  # avg: integers truncate, as the core's division does
        r = stack.sum(0) / len(inputs)
        if not dtype.is_floating_point:
            r = torch.trunc(r)
    return r.to(dtype).to(torch.float64)


def expected(spec: dict, world: int) -> list:
    """Each rank's expected result (float64, flat), from torch on the same inputs."""
    inputs = [torch.as_tensor(make_input(dict(spec, numpy=False), r)).reshape(-1)
              for r in range(world)]
    dtype = inputs[0].dtype
    kind = spec["kind"]
    if kind == "all_reduce":
        return [_reduce(inputs, spec["op"], dtype)] * world
    if kind == "broadcast":
        return [inputs[spec["root"]].to(torch.float64)] * world
    if kind == "all_gather_into_tensor":
        return [torch.cat(inputs).to(torch.float64)] * world
    if kind == "reduce_scatter_tensor":
        full = _reduce(inputs, spec["op"], dtype)
        k = full.numel() // world
        return [full[r * k:(r + 1) * k] for r in range(world)]
    if kind == "reduce":
        full = _reduce(inputs, spec["op"], dtype)
        return [full if r == spec["root"] else inputs[r].to(torch.float64) for r in range(world)]
    return [None] * world


def judge(spec: dict, outcomes: list, world: int) -> str | None:
    """None when the outcomes are right; otherwise what is wrong."""
    kinds = {o[0] for o in outcomes}
    if kinds == {"ok"}:
        if spec["device"] != "cpu" and spec["kind"] != "barrier":
            return "a meta tensor was accepted"
        for r, (want, got) in enumerate(zip(expected(spec, world), (o[1] for o in outcomes))):
            if want is None and got is None:
                continue
            if got is None or want is None or not torch.equal(want, got):
                return f"rank {r}: wrong result {got} (expected {want})"
        return None
    if not kinds <= {"TypeError", "ValueError"}:
        return f"unexpected outcomes {[o[:2] for o in outcomes]}"
    if "ok" in kinds:
        return f"ranks disagree: {[o[:2] for o in outcomes]}"
    sent = [o[2] for o in outcomes]
    if any(sent):
        return f"bytes were sent before the error: {sent}"
    return None


def _worker(rank: int, world: int, store: Any, conns: list) -> None:
    conn = conns[rank]
    for r, c in enumerate(conns):
        if r != rank:
            c.close()  # each end stays open in its rank only: a dead rank reads as EOF
    import pyring

    comm = pyring.init(rank, world, store, set_default=False, timeout=TIMEOUT_S / 2,
                       segment_bytes=4096)
    while True:
        spec = conn.recv()
        if spec is None:
            break
        conn.send(execute(comm, rank, spec))
    comm.close()


class Pool:
    """``world`` ranks that run whatever call the driver sends them."""

    def __init__(self, world: int, env: dict | None = None) -> None:
        self.world = world
        pipes = [mp.Pipe() for _ in range(world)]
        self._conns = [mine for mine, _ in pipes]
        try:
            self._ranks = Ranks(world, _worker, [theirs for _, theirs in pipes],
                                env=dict(env or {}))
        finally:
            for _, theirs in pipes:
                theirs.close()  # the ranks hold their ends

    def call(self, spec: dict) -> list | None:
        """Every rank's outcome, or None when a rank did not answer within TIMEOUT_S."""
        for c in self._conns:
            c.send(spec)
        out = []
        for c in self._conns:
            if not c.poll(TIMEOUT_S):
                return None
            out.append(c.recv())
        return out

    def close(self) -> None:
        for c in self._conns:
            try:
                c.send(None)
            except OSError:
                pass
        self._ranks.join(10)
        self._ranks.close()
        for c in self._conns:
            c.close()
