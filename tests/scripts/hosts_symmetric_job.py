"""One rank on an emulated host (tests/test_symmetric_hosts.py): all_reduce on pyring.empty
tensors across hosts, every result checked (never stopping early, so every rank runs the same
collectives), then the bytes one float32 all_reduce of COUNT elements sent to each peer."""

import os

import torch

import pyring
from pyring.tools.emulate import report

COUNT = 983040  # 3.75 MiB of float32
rank = int(os.environ["RANK"])
comm = pyring.init()
world = comm.world_size
wrong: list[str] = []


def pattern(n: int) -> torch.Tensor:
    """1..7 repeating: every sum of W <= 6 ranks' multiples of it is exact in float32."""
    return torch.arange(n, dtype=torch.int64).remainder(7).add(1)


def check(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    if not torch.equal(got, want):
        bad = (got != want).nonzero().flatten()[:3].tolist()
        wrong.append(f"rank {rank}: {name}: wrong at {bad}: got {got[bad].tolist()}, "
                     f"want {want[bad].tolist()} ({got.numel()} elements)")


def sym(src: torch.Tensor) -> torch.Tensor:
    t = pyring.empty(src.numel(), dtype=src.dtype)
    t.copy_(src)
    return t


tri = world * (world + 1) // 2
calls = 0
for n in (1, world - 1, 4097, COUNT):
    p = pattern(n)
    t = sym((p * (rank + 1)).float())
    comm.all_reduce(t)
    check(f"float32 sum n={n}", t, (p * tri).float())
    t = sym((p * (rank + 1)).float())
    comm.all_reduce(t, op="avg")
    check(f"float32 avg n={n}", t, (p * tri).float() / world)
    t = sym((p * (rank + 1)).bfloat16())
    comm.all_reduce(t)
    check(f"bfloat16 sum n={n}", t, (p * tri).bfloat16())
    t = sym(p - 1000 * rank)
    comm.all_reduce(t, op="max")
    check(f"int64 max n={n}", t, p)
    src = sym((p * (rank + 1)).float())
    out = pyring.empty(n)
    comm.all_reduce(src, out=out)
    check(f"float32 sum into symmetric n={n}", out, (p * tri).float())
    check(f"input kept n={n}", src, (p * (rank + 1)).float())
    calls += 5
    out = torch.zeros(n)  # private: the links' schedule, still right
    comm.all_reduce(src, out=out)
    check(f"float32 sum into private n={n}", out, (p * tri).float())
zc = comm.stats()["zero_copy"]
t = sym(torch.ones(COUNT))
comm.reset_stats()
comm.all_reduce(t)
check("counted all_reduce", t, torch.full((COUNT,), float(world)))
stats = comm.stats()
result = {
    "rank": rank,
    "host": int(os.environ["PYRING_EMULATE_HOST"]),
    "zero_copy_calls": zc["calls"],
    "calls": calls,
    "sent": {str(p): link["bytes_sent"] for p, link in stats["links"].items()},
    "zero_copy_bytes": stats["zero_copy"]["bytes"],
    "wrong": wrong,
}
pyring.destroy()
report(result)
