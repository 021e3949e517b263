"""Allreduce (float32, sum) across emulated hosts: pyring ring, tree, auto and gloo, same run.

    python bench/hosts.py [--layouts 2x2,2x3] [--rates 1gbit,10gbit] [--min-bytes 4K]
                          [--max-bytes 256M] [--algos ring,tree,auto,gloo] [--seconds 2.5]
                          [--iters N] [--spin-us N] [--timeout 1800] [--tag NAME] [--out PATH]

Needs root: every host is a network namespace (pyring._emulate), joined by veth pairs whose
ends shape their egress with `tc tbf` at the rate ('none': unshaped). Each host's ranks share a
private IPC namespace and /dev/shm, so pyring sees HxK ranks on H hosts (shm inside, tcp
across). Every rank runs gloo (torch.distributed, from the environment) and pyring.init()
on the gloo group's store; per size, after one or two untimed warm-up calls of each
algorithm, the algorithms take turns, one iteration each: refill, barrier, timed allreduce
(in place), barrier. Iterations per size: --iters, else as many as fit --seconds for the
slowest algorithm (2 to 100). Rank r contributes r+1, so #wrong counts the elements that
are not W(W+1)/2 exactly, over every timed iteration and rank. Times: see _report.TIME_NOTE.
All hosts' ranks share this machine's cores: PYRING_SPIN_US is 20 when they outnumber them.

Bytes across the link, per iteration: "sent" sums comm.stats() deltas (pyring only) over
every rank's links to ranks of other hosts (payload plus pyring's headers); "wire" sums
each host's eth0 tx_bytes delta from before the first barrier to after the second (every
algorithm, with TCP/IP headers, ACKs and both barriers' traffic).

Writes bench/results/hosts_<tag>.json (or --out) after every layout and rate, with the
machine description and the link settings. `--worker CONFIG` runs one rank (internal).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _report
import machine

BENCH_DIR = Path(__file__).resolve().parent
ALGOS = ("ring", "tree", "auto", "gloo")


def parse_bytes(text: str) -> int:
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(t[-1:], 1)
    try:
        return int(t[:-1] if scale > 1 else t) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a byte count: {text!r}") from None


def sizes_between(lo: int, hi: int) -> list[int]:
    """Powers of 4 from lo, plus 32 MiB, up to hi."""
    out, s = {32 * 2**20} if lo <= 32 * 2**20 <= hi else set(), lo
    while s <= hi:
        out.add(s)
        s *= 4
    return sorted(out)


# ----------------------------------------------------------------------------- one rank
def _wire_bytes() -> int:
    with open("/sys/class/net/eth0/statistics/tx_bytes") as f:
        return int(f.read())


def _sent_by_peer(comm: Any, peers: list[int]) -> dict[int, int]:
    if hasattr(comm, "stats"):
        return {int(p): v["bytes_sent"] for p, v in comm.stats()["links"].items()}
    return {p: comm.link_bytes(p)[0] for p in peers if comm.transport(p)}  # older pyring


def worker(cfg: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    import pyring
    from pyring._emulate import report

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=cfg["op_timeout"]))
    comm = pyring.init(timeout=cfg["op_timeout"])  # on the gloo group's store
    rank, world = comm.rank, comm.world_size
    host = [h for h, k in enumerate(cfg["layout"]) for _ in range(k)]
    others = [p for p in range(world) if host[p] != host[rank]]
    want = float(world * (world + 1) // 2)
    buf = torch.empty(max(cfg["sizes"]) // 4)
    algos = cfg["algos"]

    def barrier(algo: str) -> None:
        dist.barrier() if algo == "gloo" else comm.barrier()

    def allreduce(algo: str, t: torch.Tensor) -> float:
        t0 = time.perf_counter()
        dist.all_reduce(t) if algo == "gloo" else comm.all_reduce(t, algo=algo)
        return time.perf_counter() - t0

    def warm(algo: str, t: torch.Tensor) -> float:
        t.fill_(float(rank + 1))
        barrier(algo)
        return allreduce(algo, t)

    out = open(os.path.join(cfg["dir"], f"rank{rank}.jsonl"), "a", buffering=1)
    for size in cfg["sizes"]:
        t = buf[: size // 4]
        slowest = torch.tensor([max(warm(a, t) for a in algos
                                    for _ in range(2 if size < 2**20 else 1))], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        iters = cfg["iters"] or max(2, min(100, int(cfg["seconds"] / float(slowest[0]))))
        rec = {a: {"us": [], "wrong": 0, "sent": dict.fromkeys(others, 0), "wire": 0}
               for a in algos}
        for _ in range(iters):
            for a in algos:
                t.fill_(float(rank + 1))
                w0 = _wire_bytes()
                barrier(a)
                s0 = _sent_by_peer(comm, others)
                rec[a]["us"].append(allreduce(a, t) * 1e6)
                s1 = _sent_by_peer(comm, others)
                barrier(a)
                rec[a]["wire"] += _wire_bytes() - w0
                rec[a]["wrong"] += int((t != want).sum())
                for p in others:
                    rec[a]["sent"][p] += s1.get(p, 0) - s0.get(p, 0)
        for a, r in rec.items():
            r["sent"] = None if a == "gloo" else {str(p): n / iters for p, n in r["sent"].items()}
            r["wire"] = r["wire"] / iters if comm.local_rank == 0 else None
        out.write(json.dumps({"rank": rank, "size": size, "iters": iters, "algos": rec}) + "\n")
    out.close()
    pyring.destroy()
    dist.destroy_process_group()
    report({"rank": rank, "host": host[rank], "pyring": pyring.__version__,
            "topology": comm.topology.describe() if hasattr(comm, "topology") else None})


# ----------------------------------------------------------------------------- parent
def aggregate(recs: list[dict[str, Any]], layout: list[int]) -> dict[str, Any]:
    """One row from the records of one size, one per rank."""
    size, world = recs[0]["size"], len(recs)
    host = [h for h, k in enumerate(layout) for _ in range(k)]
    row: dict[str, Any] = {"size": size, "count": size // 4, "type": "float32", "redop": "sum",
                           "iters": recs[0]["iters"], "algos": {}}
    for a in recs[0]["algos"]:
        per = [r["algos"][a] for r in recs]
        wrong = sum(p["wrong"] for p in per)
        st = _report._mode_stats([p["us"] for p in per], size, world, wrong)
        counted = per[0]["sent"] is not None  # pyring algorithms; gloo has no counters
        links = {f"{r['rank']}->{p}": n for r, q in zip(recs, per)
                 for p, n in (q["sent"] or {}).items() if n}
        by_host: dict[int, float] = {}
        for r, q in zip(recs, per):
            h = host[r["rank"]]
            by_host[h] = by_host.get(h, 0) + sum((q["sent"] or {}).values())
        st["link_bytes_per_iter"] = links if counted else None
        st["sent_across_per_iter"] = sum(links.values()) if counted else None
        st["sent_out_of_host_per_iter"] = by_host if counted else None
        st["wire_per_iter"] = sum(q["wire"] for q in per if q["wire"] is not None)
        row["algos"][a] = st
    t = {a: s["time_us"] for a, s in row["algos"].items()}
    row["speedup"] = {f"tree_vs_{o}": round(t[o] / t["tree"], 3) for o in ("ring", "gloo")
                      if "tree" in t and o in t and t["tree"] > 0}
    return row


def table_header(algos: list[str], title: str) -> str:
    block = "      time   algbw   busbw  #wrong"
    lines = [f"# {title}", f"# {_report.TIME_NOTE}; in place",
             "#" + " " * 43 + "".join(f"{a:>34s}" for a in algos)
             + "  tree speed-up vs",
             "#       size         count      type   redop" + block * len(algos)
             + "     ring     gloo",
             "#        (B)    (elements)                  "
             + "      (us)  (GB/s)  (GB/s)        " * len(algos)]
    return "\n".join(lines)


def table_row(row: dict[str, Any]) -> str:
    line = f"{row['size']:12d}  {row['count']:12d}  {'float':>8s}  {row['redop']:>6s}"
    for s in row["algos"].values():
        line += (f"  {_report._t(s['time_us'])} {s['algbw_GBps']:7.2f} {s['busbw_GBps']:7.2f}"
                 f" {s['wrong']:7d}")
    for o in ("ring", "gloo"):
        v = row["speedup"].get(f"tree_vs_{o}")
        line += f" {v:7.2f}x" if v is not None else f" {'-':>8s}"
    return line


def bytes_table(rows: list[dict[str, Any]], algos: list[str]) -> str:
    head = "".join(f"  {a + ' sent':>11s}" for a in algos if a != "gloo")
    head += "".join(f"  {a + ' wire':>11s}" for a in algos)
    lines = ["# bytes across the link per iteration (MB = 1e6 B): 'sent' from comm.stats(), "
             "'wire' from eth0 tx_bytes (headers, ACKs and two barriers included)",
             f"#   size{head}"]
    for row in rows:
        s = row["algos"]
        cells = "".join(f"  {s[a]['sent_across_per_iter'] / 1e6:11.3f}"
                        if s[a]["sent_across_per_iter"] is not None else f"  {'-':>11s}"
                        for a in algos if a != "gloo")
        cells += "".join(f"  {s[a]['wire_per_iter'] / 1e6:11.3f}" for a in algos)
        lines.append(f"{_report.human_bytes(row['size']):>8s}{cells}")
    return "\n".join(lines)


def run_one(layout: list[int], rate: str | None, args: argparse.Namespace, tmp: Path) -> dict:
    from pyring._emulate import EmulatedHosts, RankFailure

    work = Path(tempfile.mkdtemp(dir=tmp))
    world = sum(layout)
    cfg = {"layout": layout, "sizes": args.sizes, "algos": args.algos, "dir": str(work),
           "iters": args.iters, "seconds": args.seconds, "op_timeout": args.op_timeout}
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(cfg)]
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    # Every emulated host's ranks share this machine's cores, which pyring's spin heuristic
    # (local world vs cores) cannot see: long spins would starve the other hosts' ranks.
    spin = args.spin_us if args.spin_us is not None else os.environ.get("PYRING_SPIN_US")
    if spin is None and world > len(os.sched_getaffinity(0)):
        spin = "20"
    if spin is not None:
        env["PYRING_SPIN_US"] = str(spin)
    title = (f"{len(layout)} hosts x {'+'.join(map(str, layout))} ranks (W={world}), "
             f"link {rate or 'unshaped'}")
    rows: list[dict[str, Any]] = []
    seen: list[list[dict]] = [[] for _ in range(world)]
    offsets = [0] * world

    def progress() -> None:
        for r in range(world):
            path = work / f"rank{r}.jsonl"
            if path.exists():
                with open(path) as f:
                    f.seek(offsets[r])
                    chunk = f.read()
                end = chunk.rfind("\n") + 1
                offsets[r] += len(chunk[:end].encode())
                seen[r] += [json.loads(x) for x in chunk[:end].splitlines()]
        while all(len(s) > len(rows) for s in seen):
            rows.append(aggregate([s[len(rows)] for s in seen], layout))
            print(table_row(rows[-1]), flush=True)

    status, error, info, load_before = "ok", None, None, os.getloadavg()
    t0 = time.monotonic()
    with EmulatedHosts(hosts=len(layout), rate=rate) as hosts:
        if rate:
            title += f" (tbf burst {hosts.burst} B, latency {hosts.latency})"
        title += ", float32 sum"
        print("\n" + table_header(args.algos, title), flush=True)
        try:
            info = hosts.run(layout, argv, env=env, timeout=args.timeout, progress=progress)
        except RankFailure as e:
            status, error = "error", str(e)
            print(f"# FAILED: {e}", file=sys.stderr, flush=True)
        progress()
        link = hosts.link
    if rows:
        avg = {a: statistics.fmean(r["algos"][a]["busbw_GBps"] for r in rows) for a in args.algos}
        print("# Avg bus bandwidth    : " + ", ".join(f"{a} {v:.4f}" for a, v in avg.items())
              + " GB/s", flush=True)
        print(bytes_table(rows, args.algos), flush=True)
    wrong = sum(s["wrong"] for r in rows for s in r["algos"].values())
    if status == "ok" and wrong:
        status = "wrong"
    elapsed = time.monotonic() - t0
    print(f"# {title}: {status}, {elapsed:.1f} s", flush=True)
    return {"layout": layout, "world": world, "rate": rate, "link": link, "status": status,
            "error": error, "seconds": round(elapsed, 1), "ranks": info, "pyring_spin_us": spin,
            "loadavg_before_after": [load_before, os.getloadavg()], "rows": rows}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="\n\n".join(__doc__.split("\n\n")[2:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layouts", default="2x2,2x3", help="HOSTSxRANKS list (default 2x2,2x3)")
    p.add_argument("--rates", default="1gbit,10gbit",
                   help="tc tbf rates, 'none' for an unshaped link (default 1gbit,10gbit)")
    p.add_argument("--min-bytes", type=parse_bytes, default=4 * 2**10, help="default 4K")
    p.add_argument("--max-bytes", type=parse_bytes, default=256 * 2**20, help="default 256M")
    p.add_argument("--algos", default=",".join(ALGOS), help="subset of ring,tree,auto,gloo")
    p.add_argument("--seconds", type=float, default=2.5,
                   help="timed seconds per size for the slowest algorithm (default 2.5)")
    p.add_argument("--iters", type=int, help="timed iterations per size (default: --seconds)")
    p.add_argument("--spin-us", type=int, help="PYRING_SPIN_US for the ranks (default: "
                   "$PYRING_SPIN_US, else 20 when the world exceeds this machine's cores)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per layout and rate")
    p.add_argument("--op-timeout", type=float, default=600, help="seconds per collective")
    p.add_argument("--tag", default=socket.gethostname())
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    args.algos = [a for a in args.algos.split(",") if a]
    if not args.algos or set(args.algos) - set(ALGOS):
        p.error(f"--algos: choose from {','.join(ALGOS)}")
    try:
        args.layouts = [[int(k)] * int(h) for h, k in (x.split("x") for x in
                                                       args.layouts.split(","))]
    except ValueError:
        p.error(f"--layouts: expected e.g. 2x2,2x3, got {args.layouts!r}")
    args.rates = [None if r == "none" else r for r in args.rates.split(",") if r]
    if args.min_bytes < 4 or args.min_bytes > args.max_bytes or args.min_bytes % 4:
        p.error("--min-bytes must be a multiple of 4 and at most --max-bytes")
    args.sizes = sizes_between(args.min_bytes, args.max_bytes)
    return args


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] == ["--worker"]:
        worker(json.loads(sys.argv[2]))
        return 0
    from pyring._emulate import available

    args = parse_args(argv)
    ok, why = available(shaping=True)
    if not ok:
        print(f"# cannot emulate hosts: {why}", file=sys.stderr)
        return 2
    tag = "".join(c if c.isalnum() or c in "-_." else "_" for c in args.tag)
    out = args.out or BENCH_DIR / "results" / f"hosts_{tag}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    desc = machine.describe()
    print(f"# allreduce float32 sum on emulated hosts; {desc['cpu']['model']}, "
          f"{desc['cpu']['usable_cores']} cores; torch {desc['packages']['torch']}", flush=True)
    doc: dict[str, Any] = {
        "benchmark": "hosts", "command": shlex.join([sys.executable, *sys.argv]),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "dtype": "float32", "op": "sum", "timing": "in place; " + _report.TIME_NOTE,
        "bytes": "sent: comm.stats() deltas to other hosts' ranks; wire: eth0 tx_bytes deltas",
        "machine": desc, "runs": [],
    }
    failed = False
    with tempfile.TemporaryDirectory(prefix="pyring-hosts-") as tmp:
        for rate in args.rates:
            for layout in args.layouts:
                res = run_one(layout, rate, args, Path(tmp))
                failed |= res["status"] != "ok"
                doc["runs"].append(res)
                doc["finished_at"] = datetime.datetime.now(datetime.timezone.utc).isoformat()
                out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"# json: {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
