#!/usr/bin/env python
"""Instructions per call of a small allreduce, split by layer, for one or more builds.

    python bench/callpath.py --refs 27d670e,HEAD          # before/after, ~6 minutes
    python bench/callpath.py --refs HEAD --bytes 65536 --calls 500

Each git ref is exported and built RelWithDebInfo (symbols, same -O3 code) into
build/callpath/<sha>/, beside a copy of its Python package. Per ref, 2 ranks run an in-place
float32 sum all_reduce of --bytes: rank 1 natively, rank 0 under `valgrind --tool=callgrind
--separate-threads=yes`, --calls and then 2 x --calls times after 100 warm-up calls. Rank 0
runs about 50 times slower than its peer, so the peer's data is nearly always there when it
looks, and the counts repeat from run to run to a few instructions per call. A layer's
instructions per call are (inclusive count at 2N calls - at N calls) / N, on rank 0's calling
thread only:

  python      everything from the Python loop down to the first native function (pyring's
              Python layer, the interpreter, torch's tensor getters on the old path)
  binding     that native entry (pybind11's dispatcher, or the short-path builtin) down to
              Communicator::run_sync: argument conversion, GIL release
  core        run_sync down to the collective: progress-engine hand-off, flight recorder,
              sequence numbers, the selector's choice
  exchange    pyring::allreduce: the algorithm (header, scratch, schedule), the transport
              (ShmLink's posts and progress: copies into and out of shm), the reductions
and, inside exchange (reductions may run inside the transport, as pieces land):
  kernels     reduce_finish, reduce_accumulate, widen, wherever they run
  polling     drive()'s own loop around the transport: the polls that found nothing new

Writes bench/results/callpath_<tag>.json with the machine's description.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
from _build import build, check_needs  # noqa: E402
from _results import add_replace_flag, result_path  # noqa: E402
from machine import describe  # noqa: E402

RANK_SCRIPT = """
import sys, time
from datetime import timedelta
pkg = sys.argv[5]
# The build under test, not an editable install's redirect to the working tree.
sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith("_editable")]
sys.path.insert(0, pkg)
import torch
import torch.distributed as dist
import pyring
assert pyring.__file__.startswith(pkg), f"pyring came from {pyring.__file__}, not {pkg}"
rank, calls, port, nbytes = (int(a) for a in sys.argv[1:5])
store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=timedelta(seconds=900))
comm = pyring.init(rank, 2, store, timeout=900)
t = torch.zeros(nbytes // 4)
for _ in range(100):
    comm.all_reduce(t)
store.add("warm", 1)
while store.add("warm", 0) < 2:
    time.sleep(0.001)
for _ in range(calls):
    comm.all_reduce(t)
comm.barrier()
comm.close()
"""

# Layer boundaries: (name, pattern of the function whose inclusive count starts it).
ENTRY = r"(fast_all_reduce\(_object\*|pybind11::cpp_function::dispatcher\().*pyring/_C"
FUNCS = {
    "entry": ENTRY,
    "run_sync": r"pyring::Communicator::run_sync\(",
    "allreduce": r"pyring::allreduce\(pyring::Communicator&",
    "drive": r"pyring::drive\(",
    "progress": r"pyring::ShmLink::progress\(\)",
    "post_send": r"pyring::ShmLink::post_send\(",
    "post_recv": r"pyring::ShmLink::post_recv\(",
    "reduce_finish": r"pyring::reduce_finish\(",
    "reduce_accumulate": r"pyring::reduce_accumulate\(",
    "widen": r"pyring::widen\(",
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def profile(pkg: Path, calls: int, nbytes: int, work: Path) -> dict[str, int]:
    """Inclusive instruction counts by function of rank 0's calling thread."""
    script = work / "rank.py"
    script.write_text(RANK_SCRIPT)
    # A fixed string hash seed: dict probe counts, and so the Python layer's count, repeat.
    env = {**os.environ, "PYRING_TRANSPORT": "shm", "PYTHONHASHSEED": "0"}
    env.pop("PYRING_DEBUG", None)
    port = _port()
    rest = [str(calls), str(port), str(nbytes), str(pkg)]
    prefix = work / f"cg{calls}"
    peer = subprocess.Popen([sys.executable, str(script), "1", *rest], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        subprocess.run(["valgrind", "--tool=callgrind", "--separate-threads=yes",
                        f"--callgrind-out-file={prefix}.%p", sys.executable, str(script), "0",
                        *rest], env=env, check=True, capture_output=True, timeout=900)
        peer.wait(timeout=60)
    finally:
        peer.kill()
    main_thread = sorted(work.glob(f"cg{calls}.*-01"))[-1]
    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100",
                           "--auto=no", str(main_thread)], check=True, capture_output=True,
                          text=True).stdout
    found: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+) \([^)]*\)\s+(.*)$", line)
        if not m:
            continue
        count, what = int(m.group(1).replace(",", "")), m.group(2)
        if what.startswith("PROGRAM TOTALS"):
            found["total"] = count
        for name, pattern in FUNCS.items():
            # A function split over several source files (inlining) appears once per file,
            # each line with the function's inclusive count or a part of it: take the largest.
            if re.search(pattern, what):
                found[name] = max(found.get(name, 0), count)
    return found


def layers(small: dict[str, int], big: dict[str, int], calls: int) -> dict[str, float]:
    per = {k: (big.get(k, 0) - small.get(k, 0)) / calls for k in set(small) | set(big)}
    out = {
        "python": per["total"] - per["entry"],
        "binding": per["entry"] - per["run_sync"],
        "core": per["run_sync"] - per["allreduce"],
        "exchange": per["allreduce"],
        "kernels": per.get("reduce_finish", 0) + per.get("reduce_accumulate", 0)
        + per.get("widen", 0),
        "polling": per.get("drive", 0) - per.get("progress", 0),
        "total": per["total"],
    }
    return {k: round(v, 1) for k, v in out.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--refs", default="HEAD", help="comma-separated git refs (default HEAD)")
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--bytes", type=int, default=4096)
    ap.add_argument("--tag", default="vm")
    ap.add_argument("--out", default=None)
    add_replace_flag(ap)
    args = ap.parse_args()
    check_needs("bench/callpath.py")
    if not shutil.which("valgrind") or not shutil.which("callgrind_annotate"):
        sys.exit("callpath.py needs valgrind (apt-get install -y valgrind)")
    result: dict[str, Any] = {"benchmark": "callpath", "command": sys.argv, "machine": describe(),
                              "calls": args.calls, "bytes": args.bytes, "builds": {}}
    cols = ("python", "binding", "core", "exchange", "kernels", "polling", "total")
    print(f"# instructions per call, 2-rank in-place all_reduce of {args.bytes} B (rank 0)")
    print(f"{'ref':>12} " + " ".join(f"{c:>10}" for c in cols))
    for ref in args.refs.split(","):
        pkg = build(ref, ROOT / "build" / "callpath")
        with tempfile.TemporaryDirectory() as tmp:
            counts = [profile(pkg, n, args.bytes, Path(tmp)) for n in (args.calls, 2 * args.calls)]
        row = layers(counts[0], counts[1], args.calls)
        result["builds"][ref] = {"sha": pkg.parent.name, "package": str(pkg), "layers": row,
                                 "counts": counts}
        print(f"{ref:>12} " + " ".join(f"{row[c]:>10.0f}" for c in cols), flush=True)
    out = result_path(f"callpath_{args.tag}", args.out, args.replace)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"# json: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
