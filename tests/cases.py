"""Closed-form inputs and expected results for the collective matrix.

Rank r's element i is a small integer, periodic in i, chosen per op so that every dtype
represents every partial result exactly. The expected output is computed over one period from
all ranks' inputs, with pyring's rounding rule (float16/bfloat16 accumulate in float32 and round
once; integer avg truncates), then tiled to the element count.
"""

from __future__ import annotations

import torch

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int32, torch.int64]
OPS = ["sum", "avg", "max", "min", "prod"]
_PERIOD = {"sum": 3, "avg": 3, "prod": 2, "max": 11, "min": 11}


def counts_for(world: int) -> list[int]:
    """0, 1, fewer than the world, and an odd count spanning many segments."""
    return sorted({0, 1, max(world - 1, 0), 1001})


def _tile(period: torch.Tensor, count: int) -> torch.Tensor:
    reps = -(-count // period.numel())
    return period.repeat(reps)[:count].contiguous()


def _period_input(op: str, rank: int, dtype: torch.dtype) -> torch.Tensor:
    i = torch.arange(_PERIOD[op], dtype=torch.int64)
    if op == "prod":
        x = 1 + (rank + i) % 2
    elif op in ("max", "min"):
        x = (rank * 7 + i * 3) % 11
        if dtype != torch.uint8:
            x = x - 5
    else:
        x = rank + 1 + i % 3
    return x.to(dtype)


def rank_input(op: str, rank: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    return _tile(_period_input(op, rank, dtype), count)


def expected(op: str, world: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    wide = torch.float64 if dtype.is_floating_point else torch.int64
    stack = torch.stack([_period_input(op, r, dtype).to(wide) for r in range(world)])
    if op == "sum":
        res = stack.sum(0)
    elif op == "avg":
        s = stack.sum(0)
        if dtype == torch.float64:
            res = s / world
        elif dtype.is_floating_point:  # float32 division, then one rounding to dtype
            res = s.to(torch.float32) / world
        else:
            res = torch.div(s, world, rounding_mode="trunc")
    elif op == "max":
        res = stack.max(0).values
    elif op == "min":
        res = stack.min(0).values
    else:
        res = stack.prod(0)
    return _tile(res.to(dtype), count)
