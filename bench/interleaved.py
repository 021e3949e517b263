#!/usr/bin/env python
"""pyring, Open MPI, gloo and oneCCL allreduce, taking turns block by block.

    python bench/interleaved.py                      # 2 ranks, 4 KiB, pyring and mpi
    python bench/interleaved.py --bytes 64M --libs pyring,mpi,gloo --blocks 10 --iters 10
    python bench/interleaved.py --bytes 4K..64M --libs pyring,mpi,gloo,oneccl --load membw
    PYRING_TRANSPORT=tcp python bench/interleaved.py --bytes 64M --libs pyring,gloo

The machines this runs on move whole runs by 2-5x from one minute to the next, so separate
runs of each library cannot be compared. Here `mpirun` starts the ranks once; each rank joins
pyring (a TCPStore on rank 0) and gloo (torch.distributed on the same store) besides MPI, and
the libraries take turns, block by block, on the same float32 buffer; each round rotates which
library goes first. Per iteration the buffer is refilled, the library's own barrier runs, and
one in-place sum allreduce is timed (pyring: comm.all_reduce(tensor); mpi: mpi4py's
Allreduce(IN_PLACE) on the tensor's numpy view; gloo: dist.all_reduce(tensor)). An
iteration's time is the slowest rank's; a block's time is the median over its iterations; a
library's time is the median over its blocks. `ratio` is, per round, the library's block time
over pyring's (> 1: pyring faster). Every result is checked (rank r contributes r+1).
'memcpy' (each rank copies the buffer, both at once) shows the memory system's pace in the
same rounds. oneCCL (installed by bench/oneccl/install.sh; skipped, saying so, where it is
not) runs in processes of its own under Intel MPI's launcher: each round is then one mpirun of
the other libraries and one oneCCL job (bench/oneccl/ccl_allreduce.cpp, timed the same way),
taking turns going first. --load runs a background load (bench/busy.py) through the whole
run; the JSON records memcpy's rate with and without it. --runs repeats the whole measurement
and counts the runs where pyring is ahead of every library at every size. PYRING_TRANSPORT
applies to pyring. Needs Open MPI and mpi4py (also for a run without
'mpi': mpirun starts the ranks). Writes bench/results/interleaved_<tag>.json with the
machine's description.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def _iters(nbytes: int, args: argparse.Namespace) -> tuple[int, int]:
    """(timed, warm-up) iterations per block: --iters up to 1 MiB, fewer above, at least 3."""
    scale = max(1, nbytes // (1 << 20))
    return max(3, args.iters // scale), max(1, args.warmup // scale)


def rank_main(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    import pyring

    mpi = MPI.COMM_WORLD
    rank, world = mpi.Get_rank(), mpi.Get_size()
    store = dist.TCPStore("127.0.0.1", args.port, world, rank == 0,
                          timeout=timedelta(seconds=120))
    comm = pyring.init(rank, world, store)
    variants = {}  # pyring-<variant>: a communicator of its own with _variant_env's setting
    for name in args.libs:
        if name.startswith("pyring-"):
            var, value = _variant_env(name)
            before = os.environ.get(var)
            os.environ[var] = value
            variants[name] = pyring.init(rank, world, store, set_default=False)
            if before is None:
                del os.environ[var]
            else:
                os.environ[var] = before
    torch.set_num_threads(1)
    if "gloo" in args.libs:
        dist.init_process_group("gloo", store=dist.PrefixStore("gloo", store), rank=rank,
                                world_size=world)
    want = world * (world + 1) / 2
    clock = time.perf_counter
    names = args.libs
    per_size = []
    for nbytes in args.sizes:
        t = torch.empty(nbytes // 4, dtype=torch.float32)
        a = t.numpy()
        copy_dst = torch.empty_like(t) if "memcpy" in names else None
        libs = {
            "pyring": (comm.barrier, lambda t=t: comm.all_reduce(t)),
            "mpi": (mpi.Barrier, lambda a=a: mpi.Allreduce(MPI.IN_PLACE, a)),
            "gloo": (dist.barrier, lambda t=t: dist.all_reduce(t)),
            "memcpy": (mpi.Barrier, lambda t=t, d=copy_dst: d.copy_(t)),
        }
        for name, c in variants.items():
            libs[name] = (c.barrier, lambda t=t, c=c: c.all_reduce(t))
        iters, warmup = _iters(nbytes, args)
        blocks: list[tuple[str, list[float]]] = []
        wrong = {name: 0 for name in names}
        comm.reset_stats()
        for b in range(args.blocks * len(names)):
            r, i = divmod(b, len(names))
            name = names[(r + i) % len(names)]
            barrier, call = libs[name]
            times = []
            for i in range(warmup + iters):
                t.fill_(rank + 1)
                barrier()
                t0 = clock()
                call()
                t1 = clock()
                if i >= warmup:
                    times.append(t1 - t0)
            if name != "memcpy":  # the one entry that leaves the buffer as it is
                wrong[name] += int((t != want).sum())
            blocks.append((name, times))
        links = comm.stats()["links"].values()
        streamed = (sum(v.get("bytes_streamed", 0) for v in links)
                    / max(1, sum(v["bytes_sent"] for v in links)))
        gathered = mpi.gather((blocks, wrong, streamed), root=0)
        if rank == 0:
            out = []
            for b, (name, _) in enumerate(blocks):
                slowest = [max(g[0][b][1][i] for g in gathered) for i in range(iters)]
                out.append({"lib": name, "median_us": statistics.median(slowest) * 1e6,
                            "min_us": min(slowest) * 1e6})
            per_size.append({"bytes": nbytes, "iters": iters, "blocks": out,
                             "pyring_streamed_fraction": [g[2] for g in gathered],
                             "wrong": {n: sum(g[1][n] for g in gathered) for n in names}})
    comm.close()
    for c in variants.values():
        c.close()
    if "gloo" in names:
        dist.destroy_process_group()
    if rank == 0:
        Path(args.result).write_text(json.dumps(per_size))
    return 0


def _sizes(spec: str) -> list[int]:
    from pyring.config import parse_bytes

    if ".." in spec:
        lo, hi = (parse_bytes(x, "--bytes") for x in spec.split(".."))
        sizes = []
        while lo <= hi:
            sizes.append(lo)
            lo *= 2
    else:
        sizes = [parse_bytes(x, "--bytes") for x in spec.split(",")]
    for n in sizes:
        if n < 4 or n % 4:
            sys.exit(f"--bytes: every size must be a positive multiple of 4, got {n}")
    return sizes


def _summarize(entry: dict, libs: list[str]) -> dict:
    blocks, k = entry["blocks"], len(libs)
    med = {lib: statistics.median(b["median_us"] for b in blocks if b["lib"] == lib)
           for lib in libs}
    ratios: dict[str, list[float]] = {lib: [] for lib in libs[1:]}
    for r in range(0, len(blocks), k):
        round_ = {b["lib"]: b["median_us"] for b in blocks[r:r + k]}
        for lib in ratios:
            ratios[lib].append(round_[lib] / round_["pyring"])
    return {**entry, "median_us": med,
            "algbw_GBps": {lib: entry["bytes"] / (us * 1e3) for lib, us in med.items()},
            "ratio_over_pyring": ratios,
            "median_ratio": {lib: statistics.median(v) for lib, v in ratios.items()}}


def _variant_env(name: str) -> tuple[str, str]:
    """pyring-cached / pyring-streaming: PYRING_SHM_COPY; pyring-tcpN: PYRING_SOCKET_NSTREAMS=N;
    pyring-ring / pyring-direct / pyring-tree: PYRING_ALGO."""
    variant = name.removeprefix("pyring-")
    if variant.startswith("tcp"):
        return "PYRING_SOCKET_NSTREAMS", variant.removeprefix("tcp")
    if variant in ("ring", "direct", "tree"):
        return "PYRING_ALGO", variant
    return "PYRING_SHM_COPY", variant


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--bytes", default="4K",
                    help="sizes: 4096, 4K,64K, or a range of powers of two 4K..256M")
    ap.add_argument("--libs", default="pyring,mpi",
                    help="pyring first, then any of mpi, gloo, oneccl (bench/oneccl/install.sh), "
                         "memcpy (each rank copies the "
                         "buffer, both at once: the memory system's pace), pyring-cached, "
                         "pyring-streaming (pyring with that PYRING_SHM_COPY), pyring-tcpN "
                         "(pyring with PYRING_SOCKET_NSTREAMS=N, N in 2..16), pyring-ring, "
                         "pyring-direct, pyring-tree (pyring with that PYRING_ALGO)")
    ap.add_argument("--blocks", type=int, default=20, help="rounds (blocks per library)")
    ap.add_argument("--iters", type=int, default=500,
                    help="timed calls per block up to 1 MiB; above, divided by size/1MiB")
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--flow-cap", type=float, default=0.0, metavar="MB/S",
                    help="cap every TCP connection at this rate (bench/flow_cap.c, "
                         "SO_MAX_PACING_RATE): a path that limits each flow, not their sum")
    ap.add_argument("--load", default="none", choices=("none", "cpu", "membw", "mixed"),
                    help="background load during the whole run, the same for every library "
                         "(bench/busy.py)")
    ap.add_argument("--runs", type=int, default=1,
                    help="independent runs; the JSON counts those where pyring is ahead of "
                         "every library at every size")
    ap.add_argument("--tag", default="vm")
    ap.add_argument("--out", default=None)
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--result", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.libs = args.libs.split(",")
    known = {"pyring", "mpi", "gloo", "oneccl", "memcpy", "pyring-cached", "pyring-streaming",
             "pyring-ring", "pyring-direct", "pyring-tree",
             *(f"pyring-tcp{n}" for n in range(2, 17))}
    if args.libs[0] != "pyring" or not set(args.libs) <= known or len(set(args.libs)) != len(
            args.libs) or len(args.libs) < 2:
        others = ", ".join(sorted(n for n in known - {"pyring"} if not n.startswith("pyring-tcp")))
        others += ", pyring-tcpN (N in 2..16)"
        sys.exit(f"--libs must be pyring followed by some of {others}, got {','.join(args.libs)}")
    args.sizes = _sizes(args.bytes)
    if args.rank:
        return rank_main(args)
    mpirun = shutil.which("mpirun")
    if not mpirun:
        sys.exit("interleaved.py needs Open MPI: apt-get install -y openmpi-bin "
                 "libopenmpi-dev; pip install mpi4py")
    import busy

    result = Path(args.out or BENCH / "results" / f"interleaved_{args.tag}.json")
    transport = os.environ.get("PYRING_TRANSPORT", "shm")
    ccl = None
    if "oneccl" in args.libs:
        ccl = _oneccl()
        if isinstance(ccl, str):  # not installed: say so and go on without it
            print(f"# oneccl skipped: {ccl}")
            args.libs = [lib for lib in args.libs if lib != "oneccl"]
            ccl = None
    quiet_memcpy = busy.memcpy_gbps()
    runs = []
    with busy.Load(args.load) as load:
        loaded_memcpy = busy.memcpy_gbps()
        for _ in range(args.runs):
            runs.append([_summarize(e, args.libs) for e in _measure(args, mpirun, ccl, result)])
    from machine import describe

    summary = {"benchmark": "interleaved", "command": sys.argv, "machine": describe(),
               "world": args.world, "transport": transport, "flow_cap_MBps": args.flow_cap,
               "libs": args.libs, "load": load.describe(),
               "memcpy_GBps": {"quiet": quiet_memcpy, "under_load": loaded_memcpy},
               "rounds": args.blocks, "sizes": runs[-1], "runs": runs,
               "pyring_ahead_runs": sum(_ahead(r) for r in runs)}
    result.write_text(json.dumps(summary, indent=1) + "\n")
    wrong = 0
    for sizes in runs:
        wrong += _print(args, sizes, transport)
    print(f"# load {args.load}: memcpy {quiet_memcpy:.1f} GB/s quiet, {loaded_memcpy:.1f} GB/s "
          f"under it; pyring ahead of every library at every size in "
          f"{summary['pyring_ahead_runs']} of {len(runs)} run(s)")
    print(f"# json: {result}")
    return 1 if wrong else 0


def _oneccl() -> list[str] | str:
    """The oneCCL program's command prefix, or why it cannot run (bench/oneccl/install.sh)."""
    env = Path(os.environ.get("PYRING_ONECCL_PREFIX", BENCH / "oneccl" / "env"))
    prog, hydra = env / "bin" / "ccl_allreduce", env / "bin" / "mpiexec.hydra"
    if not (prog.exists() and hydra.exists()):
        return f"{prog} missing: run bench/oneccl/install.sh (needs PyPI)"
    return [str(hydra), "-n", "2", str(prog)]


def _oneccl_block(ccl: list[str], args: argparse.Namespace) -> list[dict]:
    """One block of oneCCL per size, as raw per-size entries of (name, times)."""
    env = {**os.environ, "CCL_ATL_TRANSPORT": "mpi", "CCL_LOG_LEVEL": "error",
           # Its best setting per size on this kind of machine; its default (direct) is
           # pathological at 64 MiB.
           "CCL_ALLREDUCE": "direct:0-1048576;ring:1048577-max"}
    cmd = [*ccl, ",".join(map(str, args.sizes)), "1", str(args.iters), str(args.warmup)]
    cmd[2] = str(args.world)
    out = subprocess.run(cmd, check=True, timeout=1800, env=env, capture_output=True, text=True)
    line = [x for x in out.stdout.splitlines() if x.startswith("{")][-1]
    return json.loads(line)["sizes"]


def _measure(args: argparse.Namespace, mpirun: str, ccl: list[str] | None,
             result: Path) -> list[dict]:
    """One run: every library's blocks per size (raw entries, as rank_main writes them). With
    oneCCL, each round is one mpirun of the other libraries and one oneCCL job, taking turns
    going first; without it, one mpirun of every round."""
    others = [lib for lib in args.libs if lib != "oneccl"]
    if ccl is None:
        return _mpirun(args, mpirun, others, args.blocks, result)
    merged: list[dict] = []
    for r in range(args.blocks):
        first_ccl = r % 2 == 1
        ccl_sizes = _oneccl_block(ccl, args) if first_ccl else None
        sizes = _mpirun(args, mpirun, others, 1, result)
        if ccl_sizes is None:
            ccl_sizes = _oneccl_block(ccl, args)
        for k, (e, c) in enumerate(zip(sizes, ccl_sizes)):
            times = c["blocks"][0]
            block = {"lib": "oneccl", "median_us": statistics.median(times),
                     "min_us": min(times)}
            if not merged or len(merged) <= k:
                merged.append({**e, "blocks": [], "wrong": {**e["wrong"], "oneccl": 0}})
            m = merged[k]
            m["blocks"].extend(e["blocks"] + [block])
            m["wrong"] = {n: m["wrong"].get(n, 0) + e["wrong"].get(n, 0) for n in others}
            m["wrong"]["oneccl"] = m["wrong"].get("oneccl", 0) + c["wrong"]
    return merged


def _mpirun(args: argparse.Namespace, mpirun: str, libs: list[str], blocks: int,
            result: Path) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    raw = result.with_suffix(".raw.json")
    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(args.world),
           "--bind-to", "none", sys.executable, __file__, "--rank", "--port", str(port),
           "--result", str(raw), "--bytes", args.bytes, "--blocks", str(blocks),
           "--iters", str(args.iters), "--warmup", str(args.warmup), "--libs", ",".join(libs)]
    transport = os.environ.get("PYRING_TRANSPORT", "shm")
    env = {**os.environ, "PYRING_TRANSPORT": transport}
    with tempfile.TemporaryDirectory() as tmp:
        if args.flow_cap > 0:
            shim = Path(tmp) / "flow_cap.so"
            subprocess.run(["cc", "-O2", "-shared", "-fPIC", str(BENCH / "flow_cap.c"), "-o",
                            str(shim), "-ldl"], check=True)
            env.update(LD_PRELOAD=str(shim), FLOW_CAP_BYTES_PER_S=str(int(args.flow_cap * 1e6)))
        subprocess.run(cmd, check=True, timeout=3600, env=env)
    sizes = json.loads(raw.read_text())
    raw.unlink()
    return sizes


def _ahead(sizes: list[dict]) -> bool:
    """pyring is ahead of every other library (memcpy aside) at every size."""
    return all(ratio > 1.0 for e in sizes for lib, ratio in e["median_ratio"].items()
               if lib != "memcpy" and not lib.startswith("pyring-"))


def _print(args: argparse.Namespace, sizes: list[dict], transport: str) -> int:
    cap = f", each TCP connection capped at {args.flow_cap:g} MB/s" if args.flow_cap > 0 else ""
    print(f"# {args.world} ranks, in-place float32 sum over {transport}{cap}, {args.blocks} "
          "rounds; time = median over rounds of the block's median slowest-rank time")
    head = f"{'size':>10} " + " ".join(f"{lib + ' us':>12} {'GB/s':>6}" for lib in args.libs)
    head += " " + " ".join(f"{lib + '/pyring':>12}" for lib in args.libs[1:]) + "  streamed"
    print(head)
    wrong = 0
    for e in sizes:
        line = f"{e['bytes']:>10} " + " ".join(
            f"{e['median_us'][lib]:>12.2f} {e['algbw_GBps'][lib]:>6.2f}" for lib in args.libs)
        line += " " + " ".join(f"{e['median_ratio'][lib]:>12.2f}" for lib in args.libs[1:])
        line += f"  {max(e['pyring_streamed_fraction']):>8.2f}"
        print(line)
        wrong += sum(e["wrong"].values())
    print(f"# wrong elements: {wrong}; '/pyring' is the median over rounds of X's time / "
          f"pyring's (> 1: pyring faster); streamed: the largest fraction of a rank's bytes "
          f"that pyring copied into shm slots with non-temporal stores (PYRING_SHM_COPY)")
    return wrong


if __name__ == "__main__":
    sys.exit(main())
