"""The soak's workload: random mixes of every collective, algorithm, wire format and size,
each result verified on the rank that received it.

Every rank draws the same calls from ``random.Random(seed)``, so no coordination is needed
beyond the collectives themselves. Inputs are functions of (call number, rank) that every
rank can rebuild, so each rank computes its own expected result:
- lossless calls (fp32 wire, every dtype) use small integers and must be exact;
- fp16/bf16 wires must be within (world + 2) unit roundoffs of the exact sum of magnitudes;
- every other wire of the codec registry (one-bit, int8; fresh state, positive inputs) must
  give every rank the same finite values, each between the smallest and the largest input
  magnitude, widened by BAND of the largest (one-bit: none; int8: two quantization steps;
  a wire not listed there: 5%).
"""

from __future__ import annotations

import random
from typing import Any

import torch

import pyring
from pyring.optim.compression import FEEDBACK_WIRES
from pyring.optim.compression import WIRES as WIRE_NAMES

ALGOS = ("auto", "ring", "direct", "tree")
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64,
          torch.int8, torch.uint8)
OPS = ("sum", "prod", "max", "min", "avg")
WIRES = WIRE_NAMES[1:]  # every compressed wire of the codec registry
UNIT_ROUNDOFF = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}
BAND = {"onebit": 1e-6, "int8": 2 / 127}
KINDS = ("all_reduce", "all_reduce", "all_reduce_async", "wire", "broadcast", "all_gather",
         "reduce_scatter", "reduce", "gather", "scatter", "all_to_all", "send_recv", "barrier")


def _size(rng: random.Random) -> int:
    return rng.choice((0, 1, 3, 7, 100, 1000, 4099, 65537, rng.randint(1, 1 << 20)))


def _input(n: int, dtype: torch.dtype, call: int, rank: int, op: str = "sum") -> torch.Tensor:
    """Small integers: every sum, product, max, min and average of them is exact."""
    g = torch.Generator().manual_seed(call * 1009 + rank)
    lo, hi = ((1, 3) if op == "prod" else (0, 9)) if dtype == torch.uint8 else \
        ((-2, 3) if op == "prod" else (-8, 9))
    return torch.randint(lo, hi, (n,), generator=g).to(dtype)


def _reduce(xs: list[torch.Tensor], op: str, dtype: torch.dtype) -> torch.Tensor:
    s = torch.stack([x.to(torch.float64) for x in xs])
    r = {"sum": lambda: s.sum(0), "prod": lambda: s.prod(0), "max": lambda: s.max(0).values,
         "min": lambda: s.min(0).values, "avg": lambda: s.sum(0) / len(xs)}[op]()
    if op == "avg" and not dtype.is_floating_point:
        r = torch.trunc(r)
    return r.to(dtype)


def _wrong(got: torch.Tensor, want: torch.Tensor) -> int:
    return int((got.to(torch.float64) != want.to(torch.float64)).sum())


class Mix:
    """One rank's side of the soak. ``step()`` runs one random call and returns the number
    of wrong elements it produced."""

    def __init__(self, comm: Any, seed: int) -> None:
        self.comm, self.rng, self.call = comm, random.Random(seed), 0
        self.rank, self.world = comm.rank, comm.world_size
        self.counts: dict[str, int] = {}

    def step(self) -> int:
        self.call += 1
        kind = self.rng.choice(KINDS)
        self.counts[kind] = self.counts.get(kind, 0) + 1
        return getattr(self, "_" + kind)()

    def _inputs(self, n: int, dtype: torch.dtype, op: str = "sum") -> list[torch.Tensor]:
        return [_input(n, dtype, self.call, r, op) for r in range(self.world)]

    def _all_reduce(self) -> int:
        rng, n, dtype = self.rng, _size(self.rng), self.rng.choice(DTYPES)
        op, algo = rng.choice(OPS), rng.choice(ALGOS)
        xs = self._inputs(n, dtype, op)
        t = xs[self.rank].clone()
        self.comm.all_reduce(t, op=op, algo=algo)
        return _wrong(t, _reduce(xs, op, dtype))

    def _all_reduce_async(self) -> int:
        """Several calls in flight at once, waited in reverse order."""
        k = self.rng.randint(2, 5)
        specs = [(_size(self.rng) // 4, self.rng.choice(("sum", "max"))) for _ in range(k)]
        inputs = [self._inputs(n, torch.float32, op) for n, op in specs]
        ts = [xs[self.rank].clone() for xs in inputs]
        works = [self.comm.all_reduce(t, op=op, async_op=True) for t, (_, op) in zip(ts, specs)]
        for w in reversed(works):
            w.wait()
        return sum(_wrong(t, _reduce(xs, op, torch.float32))
                   for t, xs, (_, op) in zip(ts, inputs, specs))

    def _wire(self) -> int:
        rng, n = self.rng, max(1, _size(self.rng))
        wire, op, algo = rng.choice(WIRES), rng.choice(("sum", "avg")), rng.choice(ALGOS)
        banded = wire not in UNIT_ROUNDOFF
        if banded:
            op = "avg"
            xs = [1 + torch.rand(n, generator=torch.Generator().manual_seed(self.call * 31 + r))
                  for r in range(self.world)]
        else:
            xs = [x.to(torch.float32) for x in self._inputs(n, torch.float32)]
        t = xs[self.rank].clone()
        state = pyring.OneBitState() if wire in FEEDBACK_WIRES else None
        self.comm.all_reduce(t, op=op, wire=wire, state=state, algo=algo)
        if not torch.isfinite(t).all():
            return n
        if banded:
            same = torch.empty(self.world * n)
            self.comm.all_gather_into_tensor(same, t)
            lo = min(float(x.min()) for x in xs)
            hi = max(float(x.max()) for x in xs)
            band = BAND.get(wire, 0.05) * hi
            bad = int(((t < lo - band) | (t > hi + band)).sum())
            return bad + int((same.view(self.world, n) != t).any(1).sum())
        exact = _reduce(xs, op, torch.float64)
        scale = torch.stack([x.abs().to(torch.float64) for x in xs]).sum(0)
        if op == "avg":
            scale = scale / self.world
        bound = (self.world + 2) * UNIT_ROUNDOFF[wire] * scale
        return int(((t.to(torch.float64) - exact).abs() > bound).sum())

    def _broadcast(self) -> int:
        n, dtype, root = _size(self.rng), self.rng.choice(DTYPES), self.rng.randrange(self.world)
        xs = self._inputs(n, dtype)
        t = xs[self.rank].clone()
        self.comm.broadcast(t, src=root)
        return _wrong(t, xs[root])

    def _all_gather(self) -> int:
        n, dtype = _size(self.rng) // self.world, self.rng.choice(DTYPES)
        xs = self._inputs(n, dtype)
        out = torch.empty(n * self.world, dtype=dtype)
        self.comm.all_gather_into_tensor(out, xs[self.rank])
        return _wrong(out, torch.cat(xs))

    def _reduce_scatter(self) -> int:
        n, dtype = _size(self.rng) // self.world, self.rng.choice(DTYPES)
        op = self.rng.choice(OPS)
        xs = self._inputs(n * self.world, dtype, op)
        out = torch.empty(n, dtype=dtype)
        self.comm.reduce_scatter_tensor(out, xs[self.rank], op=op)
        return _wrong(out, _reduce(xs, op, dtype)[self.rank * n:(self.rank + 1) * n])

    def _reduce(self) -> int:
        n, dtype, root = _size(self.rng), self.rng.choice(DTYPES), self.rng.randrange(self.world)
        op = self.rng.choice(OPS)
        xs = self._inputs(n, dtype, op)
        t = xs[self.rank].clone()
        self.comm.reduce(t, dst=root, op=op)
        return _wrong(t, _reduce(xs, op, dtype) if self.rank == root else xs[self.rank])

    def _gather(self) -> int:
        n, root = _size(self.rng) // 4, self.rng.randrange(self.world)
        xs = self._inputs(n, torch.float32)
        out = [torch.empty(n) for _ in range(self.world)] if self.rank == root else None
        self.comm.gather(xs[self.rank], out, dst=root)
        return sum(_wrong(o, x) for o, x in zip(out, xs)) if out else 0

    def _scatter(self) -> int:
        n, root = _size(self.rng) // 4, self.rng.randrange(self.world)
        parts = [_input(n, torch.float32, self.call, 100 + r) for r in range(self.world)]
        out = torch.empty(n)
        self.comm.scatter(out, parts if self.rank == root else None, src=root)
        return _wrong(out, parts[self.rank])

    def _all_to_all(self) -> int:
        rows = _size(self.rng) // (16 * self.world) + 1
        xs = [_input(rows * self.world, torch.float32, self.call, r) for r in range(self.world)]
        out = torch.empty(rows * self.world)
        self.comm.all_to_all_single(out, xs[self.rank])
        want = torch.cat([x[self.rank * rows:(self.rank + 1) * rows] for x in xs])
        return _wrong(out, want)

    def _send_recv(self) -> int:
        """Every rank sends to the next and receives from the previous one."""
        n = _size(self.rng)
        xs = self._inputs(n, torch.float32)
        nxt, prv = (self.rank + 1) % self.world, (self.rank - 1) % self.world
        got = torch.empty(n)
        send = self.comm.isend(xs[self.rank], nxt)
        self.comm.recv(got, prv)
        send.wait()
        return _wrong(got, xs[prv])

    def _barrier(self) -> int:
        self.comm.barrier()
        return 0

