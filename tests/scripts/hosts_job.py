"""One rank on an emulated host (tests/test_hosts.py): ``hosts_job.py CONFIG_JSON``.

Config keys: ``mode`` ("check" or "fail"); for "check": ``algos`` (per-call algo names),
``topology`` (init's topology, None: the default), ``counters`` (measure per-link bytes),
``fail_rank`` for "fail". A "check" rank reports what it saw (namespaces, topology, link
transports, per-peer bytes sent by one allreduce of each algo) and a list of wrong results;
it never stops early on a wrong value, so every rank runs the same collectives.
"""

import json
import os
import sys
import time

cfg = json.loads(sys.argv[1])
rank = int(os.environ["RANK"])
if cfg["mode"] == "fail":  # a failing rank, the others hang until they are killed
    if rank == cfg["fail_rank"]:
        raise RuntimeError(f"rank {rank} fails on purpose")
    time.sleep(600)

import torch  # noqa: E402

import pyring  # noqa: E402
from pyring.tools.emulate import report  # noqa: E402

COUNT = 983040  # 3.75 MiB of float32; divisible by every world size from 1 to 6
kwargs = {} if cfg.get("topology") is None else {"topology": cfg["topology"]}
comm = pyring.init(**kwargs)
world = comm.world_size
wrong: list[str] = []


def pattern(n: int) -> torch.Tensor:
    """1..7 repeating: every sum of W <= 6 ranks' multiples of it is exact in float32."""
    return torch.arange(n, dtype=torch.int64).remainder(7).add(1)


def check(name: str, got: torch.Tensor, want: torch.Tensor, exact: bool = True) -> None:
    same = torch.equal(got, want) if exact else torch.allclose(got, want, rtol=1e-6, atol=0)
    if not same:
        bad = (got != want).nonzero().flatten()[:3].tolist()
        wrong.append(f"rank {rank}: {name}: wrong at {bad}: got {got[bad].tolist()}, "
                     f"want {want[bad].tolist()} ({got.numel()} elements)")


def cases(algo: str) -> None:
    tri = world * (world + 1) // 2
    for n in (0, 1, world - 1, 4097, COUNT):
        p = pattern(n)
        t = (p * (rank + 1)).float()
        comm.all_reduce(t, algo=algo)
        check(f"{algo} float32 sum n={n}", t, (p * tri).float())
        t = (p * (rank + 1)).float()
        comm.all_reduce(t, op="avg", algo=algo)
        check(f"{algo} float32 avg n={n}", t, (p * tri).float() / world, exact=False)
    for n in (world - 1, 65537):
        p = pattern(n)
        t = (p * (rank + 1)).bfloat16()
        comm.all_reduce(t, algo=algo)
        check(f"{algo} bfloat16 sum n={n}", t.float(), (p * tri).float())
        t = p - 1000 * rank
        comm.all_reduce(t, op="max", algo=algo)
        check(f"{algo} int64 max n={n}", t, p)
    src = (pattern(COUNT) * (rank + 1)).float()
    out = torch.empty_like(src)
    comm.all_reduce(src, out=out, algo=algo)
    check(f"{algo} float32 sum out-of-place", out, (pattern(COUNT) * tri).float())
    check(f"{algo} out-of-place input kept", src, (pattern(COUNT) * (rank + 1)).float())


def bytes_sent(algo: str) -> dict[str, int]:
    """Bytes this rank sent to each peer during one float32 allreduce of COUNT elements."""
    t = torch.ones(COUNT)
    comm.reset_stats()
    comm.all_reduce(t, algo=algo)
    stats = comm.stats()
    calls = stats["calls"]  # one call, counted under the algorithm that ran (auto picks one)
    if sum(calls.values()) != 1 or (algo != "auto" and calls.get(algo) != 1):
        wrong.append(f"rank {rank}: one {algo} allreduce since reset_stats(), calls={calls}")
    check(f"{algo} counted allreduce", t, torch.full((COUNT,), float(world)))
    return {str(p): link["bytes_sent"] for p, link in stats["links"].items()}


for algo in cfg["algos"]:
    cases(algo)
sent = {algo: bytes_sent(algo) for algo in cfg["algos"]} if cfg.get("counters") else {}
topo = comm.topology
result = {
    "rank": rank,
    "host": int(os.environ["PYRING_EMULATE_HOST"]),
    "ipc_ns": os.readlink("/proc/self/ns/ipc"),
    "net_ns": os.readlink("/proc/self/ns/net"),
    "shm_dev": os.stat("/dev/shm").st_dev,
    "local": [comm.local_rank, comm.local_world_size],
    "levels": list(topo.levels),
    "groups": [[list(g) for g in level] for level in topo.groups],
    "transports": {str(p): comm.transport(p) for p in range(world) if p != rank},
    "sent": sent,
    "count_bytes": COUNT * 4,
    "wrong": wrong,
}
pyring.destroy()
report(result)
