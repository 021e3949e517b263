#!/usr/bin/env python
"""Allreduce of pyring beside the libraries users would pick, taking turns in one run: the
project's one allreduce timing harness.

    python bench/allreduce.py                                  # 2 ranks, 4K..64M, pyring and gloo
    python bench/allreduce.py --libs pyring,mpi,gloo,oneccl --sizes 4K,64K,1M,16M,64M --runs 10
    python bench/allreduce.py --algos ring,direct,tree --sizes 4K..64M   # pyring's algorithms
    python bench/allreduce.py --transport tcp --libs pyring,gloo,tcp --sizes 64M
    python bench/allreduce.py --hosts 2x2 --rate 1gbit --algos ring,tree --libs pyring,gloo
    python bench/allreduce.py --libs pyring,mpi,oneccl --load membw   # a busy machine

The machines this runs on move whole runs by 2-5x from one minute to the next, so separate runs
of each library cannot be compared. Here the ranks start once per run; each rank joins every
library and the libraries take turns, block by block, on the same float32 buffer, each round
starting one library later. Per call the buffer is refilled, the library's own barrier runs,
and one in-place sum allreduce is timed. A call's time is the slowest rank's; a block's time is
the median over its calls; a library's time is the median over its blocks. `X/pyring` is, per
round, X's block time over pyring's (> 1: pyring faster), median over rounds. Every result is
checked (rank r contributes r+1).

Libraries (--libs, pyring first):
- pyring; pyring-<variant>, a communicator of its own with one setting changed: -cached and
  -streaming (PYRING_SHM_COPY), -ring, -direct and -tree (PYRING_ALGO; --algos adds them),
  -tcpN (PYRING_SOCKET_NSTREAMS=N, N in 2..16); -symmetric, whose buffers are pyring.empty
  tensors (zero-copy: ranks read each other's mappings). With it, the JSON and the last line
  also compare every row with pyring-symmetric (`X/pyring-symmetric`, runs where it is ahead);
- gloo (torch.distributed); mpi (Open MPI through mpi4py; the ranks then start under mpirun);
- oneccl (bench/oneccl/install.sh; its own job under Intel MPI's launcher, taking turns with
  the other libraries' job round by round; skipped, saying so, where it is not installed);
- memcpy: each rank copies the buffer, all at once (the memory system's pace);
- tcp: 2 ranks send the buffer each way over one TCP connection, nothing reduced (the ceiling
  of any allreduce over tcp).

--transport applies to pyring. --out-of-place puts the result in a second buffer (gloo has no
such call: its time includes copying the input there). --hosts HxK runs H emulated hosts of K
ranks (pyring.tools.emulate: network namespaces, root needed), their links shaped to --rate;
pyring's cross-host bytes per call and each host's eth0 bytes are recorded. --flow-cap caps
every TCP connection (a path that limits each flow). --load runs a background load
(bench/busy.py) through the run; the JSON records memcpy's rate with and without it. --runs
repeats the whole measurement and counts the runs where pyring is ahead of gloo, Open MPI and
oneCCL at every size. pyring times some choices over the first calls of each size class
(zero-copy or the slots, cached or non-temporal stores; docs/symmetric.md), so before a size's
blocks each library in the ranks' job makes --settle untimed calls. Per library the JSON also
has the cores each rank's process kept busy during its calls (user + system time over wall
time). Writes bench/results/allreduce_<tag>.json (or --out) with the machine's description.
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
from datetime import timedelta
from pathlib import Path
from typing import Any

import _allreduce_rank as rank_job
from _results import add_replace_flag, result_path

BENCH = Path(__file__).resolve().parent
PEERS = ("gloo", "mpi", "oneccl", "memcpy", "tcp")
ALGOS = ("ring", "direct", "tree")
SYMMETRIC = "pyring-symmetric"
ONECCL_ALGO = "direct:0-1048576;ring:1048577-max"  # its best per size here; default is slow


def _sizes(spec: str) -> list[int]:
    from pyring.config import parse_bytes

    if ".." in spec:
        lo, hi = (parse_bytes(x, "--sizes") for x in spec.split(".."))
        sizes = []
        while lo <= hi:
            sizes.append(lo)
            lo *= 2
    else:
        sizes = [parse_bytes(x, "--sizes") for x in spec.split(",")]
    bad = [n for n in sizes if n % 4]
    if bad or not sizes:
        sys.exit(f"--sizes: every size must be a positive multiple of 4, got {spec!r}")
    return sizes


def _libs(args: argparse.Namespace) -> list[str]:
    libs = args.libs.split(",") + [f"pyring-{a}" for a in args.algos.split(",") if a]
    valid = {"pyring", *PEERS, *(f"pyring-{v}" for v in rank_job.PYRING_VARIANTS),
             *(f"pyring-tcp{n}" for n in range(2, 17))}
    if libs[0] != "pyring" or len(set(libs)) != len(libs) or not set(libs) <= valid:
        sys.exit(f"--libs/--algos: pyring first, then distinct names among "
                 f"{', '.join(sorted(valid - {'pyring'}))}; got {','.join(libs)}")
    return libs


def _drop(args: argparse.Namespace, lib: str, why: str) -> None:
    print(f"# {lib} skipped: {why}")
    args.libs = [x for x in args.libs if x != lib]
    args.dropped = [*getattr(args, "dropped", []), f"{lib}: {why}"]


def _check_peers(args: argparse.Namespace) -> None:
    """Drops, saying why, the libraries this machine or this layout cannot run."""
    if args.hosts:
        for lib in ("mpi", "oneccl", "memcpy", "tcp"):
            if lib in args.libs:
                _drop(args, lib, "not across emulated hosts (pyring and gloo only)")
    if "tcp" in args.libs and args.world != 2:
        _drop(args, "tcp", "the bare exchange is for 2 ranks")
    if "mpi" in args.libs:
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            _drop(args, "mpi", "mpi4py is not installed (pip install mpi4py)")
        if "mpi" in args.libs and not shutil.which("mpirun"):
            _drop(args, "mpi", "no mpirun (apt-get install -y openmpi-bin libopenmpi-dev)")
    args.ccl = None
    if "oneccl" in args.libs:
        env = Path(os.environ.get("PYRING_ONECCL_PREFIX", BENCH / "oneccl" / "env"))
        prog, hydra = env / "bin" / "ccl_allreduce", env / "bin" / "mpiexec.hydra"
        if prog.exists() and hydra.exists():
            args.ccl = [str(hydra), "-n", str(args.world), str(prog)]
        else:
            _drop(args, "oneccl", f"{prog} missing: run bench/oneccl/install.sh (needs PyPI)")


def _config(args: argparse.Namespace, libs: list[str], blocks: int) -> dict[str, Any]:
    return {"libs": libs, "sizes": args.sizes, "blocks": blocks, "iters": args.iters,
            "warmup": args.warmup, "settle": args.settle, "layout": args.layout,
            "out_of_place": args.out_of_place}


def _env(args: argparse.Namespace, tmp: str) -> dict[str, str]:
    """The ranks' environment beyond this process's."""
    env = {"OMP_NUM_THREADS": "1"}
    if args.transport:
        env["PYRING_TRANSPORT"] = args.transport
    if args.flow_cap > 0:
        shim = Path(tmp) / "flow_cap.so"
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", str(BENCH / "flow_cap.c"), "-o",
                        str(shim), "-ldl"], check=True)
        env.update(LD_PRELOAD=str(shim), FLOW_CAP_BYTES_PER_S=str(int(args.flow_cap * 1e6)))
    if args.hosts and args.world > len(os.sched_getaffinity(0)):
        # Every emulated host's ranks share this machine's cores, which pyring's spin rule
        # (local world against cores) cannot see: long spins would starve the other hosts.
        env.setdefault("PYRING_SPIN_US", os.environ.get("PYRING_SPIN_US", "20"))
    return env


def _launch(args: argparse.Namespace, libs: list[str], blocks: int) -> list[dict]:
    """One job of `libs` (oneCCL aside), `blocks` rounds: the raw entries of rank 0."""
    cfg = _config(args, libs, blocks)
    with tempfile.TemporaryDirectory() as tmp:
        env = _env(args, tmp)
        if args.hosts:
            from pyring.tools.emulate import EmulatedHosts

            argv = [sys.executable, __file__, "--rank", json.dumps(cfg)]
            with EmulatedHosts(hosts=len(args.layout), rate=args.rate) as hosts:
                args.link = hosts.link
                return hosts.run(args.layout, argv, env=env, timeout=args.timeout)[0]
        if "mpi" in libs:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                cfg["port"] = s.getsockname()[1]
            cfg["result"] = str(Path(tmp) / "result.json")
            cmd = [shutil.which("mpirun"), "--allow-run-as-root", "--oversubscribe", "-np",
                   str(args.world), "--bind-to", "none", sys.executable, __file__, "--rank",
                   json.dumps(cfg)]
            subprocess.run(cmd, check=True, timeout=args.timeout, env={**os.environ, **env})
            return json.loads(Path(cfg["result"]).read_text())
        from pyring.launch import run_ranks

        saved = dict(os.environ)
        os.environ.update(env)  # before the ranks' interpreters start (LD_PRELOAD)
        try:
            return run_ranks(args.world, rank_job.run, cfg, timeout=args.timeout,
                             hard_exit=True)[0]
        finally:
            os.environ.clear()
            os.environ.update(saved)


def rank_main(cfg: dict[str, Any]) -> int:
    """A rank started by mpirun or by the emulated hosts."""
    import torch.distributed as dist

    if "port" in cfg:
        from mpi4py import MPI

        mpi = MPI.COMM_WORLD
        rank, world = mpi.Get_rank(), mpi.Get_size()
        store = dist.TCPStore("127.0.0.1", cfg["port"], world, rank == 0,
                              timeout=timedelta(seconds=120))
        out = rank_job.run(rank, world, store, cfg, mpi)
        if rank == 0:
            Path(cfg["result"]).write_text(json.dumps(out))
        return 0
    from pyring.tools.emulate import report

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          rank == 0, timeout=timedelta(seconds=120))
    report(rank_job.run(rank, world, store, cfg))
    return 0


def _oneccl_block(args: argparse.Namespace) -> list[dict]:
    """One oneCCL block per size: [{"blocks": [[seconds, ...]], "wrong": n}, ...]."""
    env = {**os.environ, "CCL_ATL_TRANSPORT": "mpi", "CCL_LOG_LEVEL": "error",
           "CCL_ALLREDUCE": ONECCL_ALGO}
    cmd = [*args.ccl, ",".join(map(str, args.sizes)), "1", str(args.iters), str(args.warmup)]
    out = subprocess.run(cmd, check=True, timeout=args.timeout, env=env, capture_output=True,
                         text=True)
    line = [x for x in out.stdout.splitlines() if x.startswith("{")][-1]
    return json.loads(line)["sizes"]


def _measure(args: argparse.Namespace) -> list[dict]:
    """One run. With oneCCL, each round is one job of the other libraries and one oneCCL job,
    taking turns going first; without it, one job of every round."""
    others = [lib for lib in args.libs if lib != "oneccl"]
    if args.ccl is None:
        return _launch(args, others, args.blocks)
    merged: list[dict] = []
    for r in range(args.blocks):
        ccl_sizes = _oneccl_block(args) if r % 2 else None
        sizes = _launch(args, others, 1)
        if ccl_sizes is None:
            ccl_sizes = _oneccl_block(args)
        for k, (e, c) in enumerate(zip(sizes, ccl_sizes)):
            times = c["blocks"][0]
            block = {"lib": "oneccl", "median_us": statistics.median(times),
                     "min_us": min(times), "sent_across_per_call": 0, "wire_per_call": 0,
                     "cores_busy": [], "barrier_us": None, "entry_skew_us": None}
            if len(merged) <= k:
                merged.append({**e, "blocks": [], "wrong": dict.fromkeys(args.libs, 0)})
            m = merged[k]
            m["blocks"].extend(e["blocks"] + [block])
            for n in others:
                m["wrong"][n] += e["wrong"][n]
            m["wrong"]["oneccl"] += c["wrong"]
    return merged


def _summarize(entry: dict, libs: list[str]) -> dict:
    blocks, k = entry["blocks"], len(libs)
    med = {lib: statistics.median(b["median_us"] for b in blocks if b["lib"] == lib)
           for lib in libs}
    ratios: dict[str, list[float]] = {lib: [] for lib in libs[1:]}
    sym: dict[str, list[float]] = {lib: [] for lib in libs if lib != SYMMETRIC}
    for r in range(0, len(blocks), k):
        round_ = {b["lib"]: b["median_us"] for b in blocks[r:r + k]}
        for lib in ratios:
            ratios[lib].append(round_[lib] / round_["pyring"])
        if SYMMETRIC in libs:
            for lib in sym:
                sym[lib].append(round_[lib] / round_[SYMMETRIC])
    across = {lib: statistics.median(b["sent_across_per_call"] for b in blocks
                                     if b["lib"] == lib) for lib in libs}
    wire = {lib: statistics.median(b["wire_per_call"] for b in blocks if b["lib"] == lib)
            for lib in libs}
    cores = {lib: statistics.median(statistics.fmean(b["cores_busy"]) for b in blocks
                                    if b["lib"] == lib and b["cores_busy"]) if lib != "oneccl"
             else None for lib in libs}
    # Each call is timed after its library's barrier: a barrier that lets the ranks go one by
    # one adds its spread to the call's time.
    waits = {f: {lib: statistics.median(b[f] for b in blocks if b["lib"] == lib)
                 if lib != "oneccl" else None for lib in libs}
             for f in ("barrier_us", "entry_skew_us")}
    return {**entry, "median_us": med, "cores_busy": cores, **waits,
            "algbw_GBps": {lib: entry["bytes"] / (us * 1e3) for lib, us in med.items()},
            "ratio_over_pyring": ratios,
            "median_ratio": {lib: statistics.median(v) for lib, v in ratios.items()},
            "median_ratio_over_symmetric": ({lib: statistics.median(v) for lib, v in sym.items()}
                                            if SYMMETRIC in libs else None),
            "sent_across_per_call": across, "wire_per_call": wire}


def _ahead(sizes: list[dict]) -> bool:
    """pyring is ahead of every other library that ran (memcpy, tcp and its own variants
    aside)."""
    return all(ratio > 1.0 for e in sizes for lib, ratio in e["median_ratio"].items()
               if lib in ("gloo", "mpi", "oneccl"))


def _ahead_of(sizes: list[dict], lib: str) -> bool:
    """pyring is ahead of row `lib` at every size of one run."""
    return all(e["median_ratio"][lib] > 1.0 for e in sizes)


def _symmetric_ahead_of(sizes: list[dict], lib: str) -> bool:
    """pyring-symmetric is ahead of row `lib` at every size of one run."""
    return all(e["median_ratio_over_symmetric"][lib] > 1.0 for e in sizes)


def _ahead_line(libs: list[str], runs: list[list[dict]]) -> str:
    """For every row that ran besides pyring, the runs in which pyring was ahead of it at every
    size: true of every row it names, and naming no row that did not run."""
    return "; ".join(f"{lib} in {sum(_ahead_of(r, lib) for r in runs)} of {len(runs)}"
                     for lib in libs[1:]) or "no other row ran"


def _print(args: argparse.Namespace, sizes: list[dict], where: str) -> int:
    place = "out-of-place" if args.out_of_place else "in-place"
    print(f"# {args.world} ranks, {place} float32 sum, {where}, {args.blocks} rounds; time = "
          "median over rounds of the block's median slowest-rank time")
    libs = args.libs
    head = f"{'size':>10} " + " ".join(f"{lib + ' us':>12} {'GB/s':>6}" for lib in libs)
    head += " " + " ".join(f"{lib + '/pyring':>12}" for lib in libs[1:]) + "  streamed"
    print(head)
    wrong = 0
    for e in sizes:
        line = f"{e['bytes']:>10} " + " ".join(
            f"{e['median_us'][lib]:>12.2f} {e['algbw_GBps'][lib]:>6.2f}" for lib in libs)
        line += " " + " ".join(f"{e['median_ratio'][lib]:>12.2f}" for lib in libs[1:])
        line += f"  {max(e['pyring_streamed_fraction']):>8.2f}"
        print(line)
        wrong += sum(e["wrong"].values())
    if args.hosts:
        print("# bytes per call across the hosts (MB): pyring's sent (comm.stats), every "
              "host's eth0 tx")
        for e in sizes:
            print(f"{e['bytes']:>10} " + " ".join(
                f"{lib}: {e['sent_across_per_call'][lib] / 1e6:.3f} sent, "
                f"{e['wire_per_call'][lib] / 1e6:.3f} wire" for lib in libs))
    print("# cores busy per rank during the calls (user + system / wall, mean over ranks): "
          + ", ".join(f"{lib} {sizes[-1]['cores_busy'][lib]:.2f}" for lib in libs
                      if sizes[-1]["cores_busy"][lib] is not None) + f" at {sizes[-1]['bytes']} B")
    print("# barrier before each call, slowest rank, us (spread of the ranks' starts after it): "
          + "; ".join(f"{e['bytes']} B: " + ", ".join(
              f"{lib} {e['barrier_us'][lib]:.1f} ({e['entry_skew_us'][lib]:.1f})" for lib in libs
              if e["barrier_us"][lib] is not None) for e in sizes))
    print(f"# wrong elements: {wrong}; 'X/pyring' > 1: pyring faster; streamed: the largest "
          f"fraction of a rank's bytes that pyring copied into shm slots with non-temporal "
          f"stores (PYRING_SHM_COPY)")
    return wrong


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[2:]))
    ap.add_argument("--libs", default="pyring,gloo", help="pyring first (see below)")
    ap.add_argument("--algos", default="", help=f"adds pyring-<algo> for some of {ALGOS}")
    ap.add_argument("--sizes", "--bytes", dest="sizes", default="4K..64M",
                    help="4096, 4K,64K or a range of powers of two 4K..256M")
    ap.add_argument("--transport", choices=("shm", "tcp"), help="pyring's (default: auto)")
    ap.add_argument("--out-of-place", action="store_true",
                    help="the result into a second buffer (gloo: a copy, then in place)")
    ap.add_argument("--world", type=int, default=2, help="local ranks (without --hosts)")
    ap.add_argument("--hosts", default="", metavar="HxK", help="emulated hosts x ranks each")
    ap.add_argument("--rate", default="1gbit", help="--hosts links' rate ('none': unshaped)")
    ap.add_argument("--blocks", type=int, default=10, help="rounds (blocks per library)")
    ap.add_argument("--iters", type=int, default=200,
                    help="timed calls per block up to 1 MiB; above, divided by size/1MiB")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--settle", type=int, default=24,
                    help="untimed calls of each library in the ranks' job before a size's "
                         "blocks, so that pyring's timed choices have settled")
    ap.add_argument("--flow-cap", type=float, default=0.0, metavar="MB/S",
                    help="cap every TCP connection at this rate (bench/flow_cap.c)")
    ap.add_argument("--load", default="none", choices=("none", "cpu", "membw", "mixed"),
                    help="background load through the whole run (bench/busy.py)")
    ap.add_argument("--runs", type=int, default=1, help="independent runs")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per job")
    ap.add_argument("--tag", default="vm")
    ap.add_argument("--out", default=None)
    add_replace_flag(ap)
    args = ap.parse_args(argv)
    args.libs = _libs(args)
    args.sizes = _sizes(args.sizes)
    args.layout, args.link = None, None
    if args.hosts:
        try:
            h, k = (int(x) for x in args.hosts.lower().split("x"))
        except ValueError:
            ap.error(f"--hosts: expected HxK such as 2x2, got {args.hosts!r}")
        if h < 1 or k < 1:
            ap.error(f"--hosts: {args.hosts!r} needs at least 1 host of 1 rank")
        args.layout, args.world = [k] * h, h * k
        args.rate = None if args.rate == "none" else args.rate
    if args.world < 2:
        ap.error(f"--world: at least 2 ranks, got {args.world}")
    _check_peers(args)
    if len(args.libs) < 2:
        dropped = getattr(args, "dropped", [])
        ap.error("nothing to compare pyring with: " + (
            f"every other library was skipped ({'; '.join(dropped)})" if dropped
            else "give --libs or --algos"))
    return args


def main() -> int:
    if sys.argv[1:2] == ["--rank"]:
        return rank_main(json.loads(sys.argv[2]))
    args = parse()
    if args.hosts:
        from pyring.tools.emulate import available

        ok, why = available(shaping=args.rate is not None)
        if not ok:
            sys.exit(f"--hosts: cannot emulate hosts here: {why}")
    import busy
    from machine import describe

    result = result_path(f"allreduce_{args.tag}", args.out, args.replace)
    quiet_memcpy = busy.memcpy_gbps()
    runs = []
    with busy.Load(args.load) as load:
        loaded_memcpy = busy.memcpy_gbps()
        for _ in range(args.runs):
            runs.append([_summarize(e, args.libs) for e in _measure(args)])
    transport = args.transport or ("shm within a host, tcp across" if args.hosts else "shm")
    where = (f"{args.hosts} emulated hosts, links {args.rate or 'unshaped'}, "
             if args.hosts else "") + f"pyring over {transport}"
    if args.flow_cap > 0:
        where += f", each TCP connection capped at {args.flow_cap:g} MB/s"
    summary = {"benchmark": "allreduce", "command": ["python", "bench/allreduce.py",
                                                     *sys.argv[1:]],
               "machine": describe(), "world": args.world, "where": where,
               "transport": args.transport or ("auto" if args.hosts else "shm"),
               "hosts": args.hosts or None, "rate": args.rate if args.hosts else None,
               "link": args.link, "flow_cap_MBps": args.flow_cap, "libs": args.libs,
               "out_of_place": args.out_of_place,
               "load": load.describe(),
               "memcpy_GBps": {"quiet": quiet_memcpy, "under_load": loaded_memcpy},
               "rounds": args.blocks, "sizes": runs[-1], "runs": runs,
               "pyring_ahead_runs": sum(_ahead(r) for r in runs),
               "pyring_ahead_runs_by_row": {lib: sum(_ahead_of(r, lib) for r in runs)
                                            for lib in args.libs[1:]}}
    if SYMMETRIC in args.libs:
        peers = [lib for lib in args.libs if lib in ("gloo", "mpi", "oneccl")]
        summary["symmetric_ahead_runs_by_row"] = {
            lib: sum(_symmetric_ahead_of(r, lib) for r in runs) for lib in peers + ["pyring"]}
        if "memcpy" in args.libs:
            # pyring-symmetric's speed as a fraction of memcpy's, per run at the largest size.
            summary["symmetric_over_memcpy_speed"] = [
                r[-1]["median_ratio_over_symmetric"]["memcpy"] for r in runs]
    result.write_text(json.dumps(summary, indent=1) + "\n")
    wrong = sum(_print(args, sizes, where) for sizes in runs)
    print(f"# load {args.load}: memcpy {quiet_memcpy:.1f} GB/s quiet, {loaded_memcpy:.1f} GB/s "
          f"under it; pyring ahead at every size of {_ahead_line(args.libs, runs)} run(s)")
    if SYMMETRIC in args.libs:
        print("# pyring-symmetric ahead at every size of: " + "; ".join(
            f"{lib} in {n} of {len(runs)}"
            for lib, n in summary["symmetric_ahead_runs_by_row"].items()) + " run(s)")
        if "symmetric_over_memcpy_speed" in summary:
            print("# pyring-symmetric's speed over memcpy's at the largest size, per run: "
                  + ", ".join(f"{x:.2f}" for x in summary["symmetric_over_memcpy_speed"]))
    print(f"# json: {result}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
