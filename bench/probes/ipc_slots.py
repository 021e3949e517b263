#!/usr/bin/env python
"""How the cuda_ipc slot size sets the time of a 64 MiB float32 all_reduce of ranks that share
GPU 0 (bound at init: the ring runs on the device), beside a device-to-device copy of the same
buffer and pyring's one-rank call, all in one run.

Each slot is one device copy into the peer's inbox, one kernel, and two hand-offs between the
ranks' progress threads (published, released); ranks of one GPU without MPS also take turns on
it. Fewer, larger slots mean fewer of both. ``--libs pyring,pyring-hostwait`` also times each
call waited for on the host instead of on the caller's stream: whether a stream left waiting
for the collective slows the other ranks' work on the shared GPU.

    python bench/probes/ipc_slots.py [--slots 2M,8M,32M] [--worlds 2,4] [--libs pyring]
                                     [--trace] [--out PATH]

``--trace`` runs one more 2-rank job at the first slot size with PYRING_IPC_TRACE and adds
where a slot's time goes (summarize_trace): the sender's copy (queued to published, as its
progress thread saw it), the hand-off to the receiver (published to handed on) and the
receiver's hold (handed on to released: its kernel or copy, and the flag behind it);
pyring/runtime/ipc_trace.py reads the files.

Times are the median over 20 calls of the slowest rank's, each call followed by
torch.cuda.synchronize() (pyring/tools/selfcheck_ranks.py's allreduce_rank); "wrong" counts
elements that are not world ** calls.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).absolute().parents[2]))

from pyring._settings import parse_bytes  # noqa: E402
from pyring.launch import run_ranks  # noqa: E402
from pyring.runtime.ipc_trace import summarize_trace  # noqa: E402
from pyring.tools.selfcheck_ranks import ALLREDUCE_BYTES, BOUND_JOBS, allreduce_rank  # noqa: E402
from pyring.tools.selfcheck_report import devices_here, machine  # noqa: E402

WARMUP, ITERS = 3, 20


def timed(world: int, lib: str, env: dict[str, str], limit: float) -> dict[str, Any]:
    try:
        ranks = run_ranks(world, allreduce_rank, lib, ALLREDUCE_BYTES, WARMUP, ITERS, 30.0,
                          env=env, timeout=limit, hard_exit=True)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"[-2000:]}
    if lib == "copies":
        return {"d2d_s": statistics.median(ranks[0]["d2d_s"])}
    slowest = [max(r["times_s"][i] for r in ranks) for i in range(ITERS)]
    return {"time_s": statistics.median(slowest), "min_s": min(slowest),
            "wrong": sum(r["wrong"] for r in ranks),
            "device_transport": ranks[0]["device_transport"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slots", default="2M,8M,32M",
                   help="cuda_ipc slot sizes (PYRING_SEGMENT_BYTES)")
    p.add_argument("--worlds", default="2,4", help="ranks on GPU 0")
    p.add_argument("--libs", default="pyring", help=f"of {', '.join(BOUND_JOBS)}")
    p.add_argument("--limit", type=float, default=60.0, help="seconds per job")
    p.add_argument("--trace", action="store_true",
                   help="one more 2-rank job with PYRING_IPC_TRACE, summarised")
    p.add_argument("--out", default="bench/results/ipc_slots.json")
    a = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        p.exit(2, "ipc_slots.py: needs a CUDA GPU (torch.cuda.is_available() is False)\n")
    runs: dict[str, Any] = {"copies x1": timed(1, "copies", {}, a.limit),
                            "pyring x1": timed(1, "pyring", {}, a.limit)}
    libs = a.libs.split(",")
    if set(libs) - set(BOUND_JOBS):
        p.error(f"--libs {a.libs}: not of {', '.join(BOUND_JOBS)}")
    for world in (int(w) for w in a.worlds.split(",")):
        for slot in a.slots.split(","):
            for lib in libs:
                key = f"{lib} x{world} slot {slot}"
                env = {"PYRING_SEGMENT_BYTES": str(parse_bytes(slot, "--slots"))}
                runs[key] = timed(world, lib, env, a.limit)
                print(key, runs[key], flush=True)
    trace = None
    if a.trace:
        slot = str(parse_bytes(a.slots.split(",")[0], "--slots"))
        with tempfile.TemporaryDirectory() as tmp:
            prefix = str(Path(tmp) / "ipc")
            runs["traced x2"] = timed(2, "pyring", {"PYRING_SEGMENT_BYTES": slot,
                                                    "PYRING_IPC_TRACE": prefix}, a.limit)
            trace = summarize_trace(prefix) if "error" not in runs["traced x2"] else None
    d2d = runs["copies x1"].get("d2d_s")
    for r in runs.values():
        if d2d and r.get("time_s"):
            r["over_d2d"] = r["time_s"] / d2d
    doc = {"probe": "ipc_slots", "bytes": ALLREDUCE_BYTES, "command": sys.argv,
           "machine": machine(devices_here(), Path(__file__).parents[2]), "runs": runs,
           "trace": trace}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1))
    for k, v in runs.items():
        print(f"{k:24s} {json.dumps(v)[:200]}")
    if trace is not None:
        print(f"trace (per slot, us): {json.dumps(trace)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
