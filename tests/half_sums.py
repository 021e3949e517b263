"""Exact checks of the fp16 and bf16 wires, shared by the tests that run them over different
links: sums of small integers are exact in both formats, so any wrong element is a defect of
the schedule (a segment sent to the wrong place, ranks cutting chunks differently)."""

from __future__ import annotations

import torch


def half_sum_errors(comm, sizes, algo: str = "auto") -> dict[str, int]:
    """Wrong elements after one sum allreduce per size and wire, keyed "algo n wire"."""
    rank, world = comm.rank, comm.world_size
    wrong = {}
    for n in sizes:
        base = torch.arange(n) % 7
        want = (base * world + sum(range(world))).to(torch.float32)
        for wire in ("bf16", "fp16"):
            x = (base + rank).to(torch.float32)
            comm.all_reduce(x, op="sum", wire=wire, algo=algo)
            wrong[f"{algo} {n} {wire}"] = int((x != want).sum())
    return wrong
