"""Does a compressed DDP hook overlap backward? Two emulated hosts of one rank each over a
shaped link; DDP (gloo for its own setup) on the main job's CharGPT, its buckets averaged by
a pyring hook. Three timings per hook, interleaved over rounds, medians of the slowest rank:

- ``compute``: forward and backward under ``no_sync()`` (no exchange);
- ``exchange``: the same buckets (sizes recorded from a hooked step) averaged one after the
  other on the hook's wire, with nothing else running;
- ``step``: forward and backward with the hook, until DDP has the averaged gradients.

Beside each time, the rank's CPU time over it (all its threads, ``cpu_s``) and how often the
rank's main thread was preempted (``preempted``): a step that takes more CPU than compute and
exchange alone shows the two slowing each other down.

    python bench/overlap.py [--rate 100mbit] [--hooks onebit,bf16] [--rounds 5] [--tag NAME]
                            [--timeline]

``--hooks`` takes the wires of the codec registry (fp32: the plain allreduce hook; the others
through ``pyring.hooks.compressed_hook``) and ``noop`` (a control: the bucket handed back
unexchanged, so its step is backward plus DDP's own cost).

``--timeline`` records each step's hook calls and collectives (start and duration, ms from the
step's start) and reports the step's floor: the compute, or the last rank's first hook plus
the exchange alone where that is longer (no byte leaves before the first bucket is handed
over).

Target (issue 26): step <= 0.75 x (compute + exchange), at a rate where the exchange takes
0.5x to 2x the compute. Writes bench/results/overlap_<rate>_<tag>.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

from _results import add_replace_flag, result_path  # noqa: E402
from machine import describe  # noqa: E402

from pyring.optim.compression import WIRES
from pyring.tools.timing import slowest_median

HOOKS = (*WIRES, "noop")  # every wire of the codec registry, and the control


def _preemptions() -> int:
    """The calling thread's involuntary context switches so far (Linux; 0 elsewhere)."""
    try:
        with open("/proc/thread-self/status") as f:
            return next(int(line.split(":")[1]) for line in f
                        if line.startswith("nonvoluntary_ctxt_switches"))
    except (OSError, StopIteration):
        return 0


def _noop_hook(state, bucket):
    """A control: hands DDP its bucket back at once, unexchanged (DDP's own cost alone)."""
    import torch

    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def _rank(cfg: dict) -> dict:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import pyring
    from pyring import hooks
    from pyring.tools.emulate import report
    from pyring.tools.workload import CharGPT

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          rank == 0, timeout=datetime.timedelta(seconds=600))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    comm = pyring.init(set_default=False)
    g = torch.Generator().manual_seed(rank)
    x = torch.randint(0, 256, (cfg["batch"], cfg["seq"] + 1), generator=g)
    out: dict = {}
    for name in cfg["hooks"]:
        compressed = name in WIRES[1:]
        state = hooks.CompressedHookState(comm, name) if compressed else comm
        hook = (hooks.compressed_hook if compressed else
                {WIRES[0]: hooks.allreduce_hook, "noop": _noop_hook}[name])
        sizes: list[int] = []
        called: list[float] = []

        def recording(st, bucket, hook=hook, sizes=sizes, called=called):
            sizes.append(bucket.buffer().numel())
            called.append(time.time())
            return hook(st, bucket)

        torch.manual_seed(0)  # one DDP per hook: a DDP takes one hook
        model = DDP(CharGPT(cfg["dim"], cfg["layers"], 4, cfg["seq"]),
                    bucket_cap_mb=cfg["bucket_mb"])
        model.register_comm_hook(state, recording)
        model(x[:, :-1], x[:, 1:]).backward()  # DDP rebuilds its buckets after this one
        sizes.clear()
        model(x[:, :-1], x[:, 1:]).backward()
        bucket_sizes = list(sizes)
        bufs = [torch.randn(n, generator=g) for n in bucket_sizes]
        ex = pyring.GradientExchange(name if compressed else "none")
        t = {"compute": [], "exchange": [], "step": []}
        cpu = {"compute": [], "exchange": [], "step": []}
        preempted = {"compute": [], "exchange": [], "step": []}
        timeline: list = []
        for r in range(cfg["rounds"] + 1):
            comm.barrier()
            t0, c0, p0 = time.perf_counter(), time.process_time(), _preemptions()
            with model.no_sync():
                model(x[:, :-1], x[:, 1:]).backward()
            t1, c1, p1 = time.perf_counter(), time.process_time(), _preemptions()
            comm.barrier()
            t2, c2, p2 = time.perf_counter(), time.process_time(), _preemptions()
            for k, b in enumerate(bufs if name != "noop" else []):
                ex.average(comm, b, k).wait()
            t3, c3, p3 = time.perf_counter(), time.process_time(), _preemptions()
            comm.barrier()
            called.clear()
            w4 = time.time()
            t4, c4, p4 = time.perf_counter(), time.process_time(), _preemptions()
            model(x[:, :-1], x[:, 1:]).backward()
            t5, c5, p5 = time.perf_counter(), time.process_time(), _preemptions()
            if r and cfg.get("timeline"):
                runs = [e for e in comm.debug_dump() if e["start"] >= w4]
                timeline.append({"end_ms": (t5 - t4) * 1e3,
                                 "hooks_ms": [(c - w4) * 1e3 for c in called],
                                 "runs_ms": [((e["start"] - w4) * 1e3, e["duration_s"] * 1e3,
                                              e["count"]) for e in runs]})
            if r:
                for k, (wall, used, n) in {"compute": (t1 - t0, c1 - c0, p1 - p0),
                                           "exchange": (t3 - t2, c3 - c2, p3 - p2),
                                           "step": (t5 - t4, c5 - c4, p5 - p4)}.items():
                    t[k].append(wall)
                    cpu[k].append(used)
                    preempted[k].append(n)
        out[name] = {"times_s": t, "cpu_s": cpu, "preempted": preempted,
                     "buckets": bucket_sizes, **({"timeline": timeline} if timeline else {})}
    comm.close()
    dist.destroy_process_group()
    report(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", default="100mbit")
    p.add_argument("--hooks", default="onebit,bf16")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--bucket-mb", type=float, default=1.0)
    p.add_argument("--tag", default=socket.gethostname())
    p.add_argument("--timeline", action="store_true",
                   help="record each step's hook calls and collectives (start, duration) in ms "
                        "from the step's start")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    add_replace_flag(p)
    args = p.parse_args()
    if args.worker:
        return _rank(json.loads(args.worker))
    unknown = set(args.hooks.split(",")) - set(HOOKS)
    if unknown:
        p.error(f"--hooks: unknown {', '.join(sorted(unknown))} (valid: {', '.join(HOOKS)})")
    from pyring.tools.emulate import EmulatedHosts

    cfg = {"hooks": args.hooks.split(","), "rounds": args.rounds, "dim": args.dim,
           "layers": args.layers, "seq": args.seq, "batch": args.batch,
           "bucket_mb": args.bucket_mb, "timeline": args.timeline}
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(cfg)]
    with EmulatedHosts(hosts=2, rate=args.rate) as hosts:
        ranks = hosts.run(1, argv, timeout=1800)
        link = hosts.link
    summary = {}
    for name in cfg["hooks"]:
        med = {}
        for k in ("compute", "exchange", "step"):
            med[k] = slowest_median([r[name]["times_s"][k][:args.rounds] for r in ranks])
        for k in ("compute", "exchange", "step"):  # medians over rounds and ranks
            med[f"{k}_cpu"] = statistics.median(c for r in ranks for c in r[name]["cpu_s"][k])
            med[f"{k}_preempted"] = statistics.median(
                c for r in ranks for c in r[name]["preempted"][k])
        ratio = med["step"] / (med["compute"] + med["exchange"])
        balance = med["exchange"] / med["compute"]
        summary[name] = {**{(k if k.endswith("_preempted") else f"{k}_s"): v
                            for k, v in med.items()}, "step_over_sum": ratio,
                         "exchange_over_compute": balance,
                         "buckets": ranks[0][name]["buckets"]}
        print(f"{name:>7s} @ {args.rate}: compute {med['compute'] * 1e3:8.1f} ms  exchange "
              f"{med['exchange'] * 1e3:8.1f} ms  step {med['step'] * 1e3:8.1f} ms  "
              f"step/(compute+exchange) {ratio:.2f}  exchange/compute {balance:.2f}\n"
              f"{'':>7s}   CPU time per rank: compute {med['compute_cpu'] * 1e3:6.1f} ms  "
              f"exchange {med['exchange_cpu'] * 1e3:6.1f} ms  step {med['step_cpu'] * 1e3:6.1f} ms"
              f"; main thread preempted {med['compute_preempted']:g} / "
              f"{med['step_preempted']:g} times in compute / step")
        if args.timeline and name != "noop":
            # The step ends no sooner than the compute, nor than the last rank's first bucket
            # handed over plus the exchange of every bucket (the link's floor).
            first = statistics.median(max(r[name]["timeline"][i]["hooks_ms"][0] for r in ranks)
                                      for i in range(args.rounds)) / 1e3
            floor = max(med["compute"], first + med["exchange"])
            summary[name].update(first_bucket_s=first, floor_s=floor,
                                 floor_over_sum=floor / (med["compute"] + med["exchange"]))
            print(f"{'':>7s}   first bucket handed over at {first * 1e3:.1f} ms: the step's floor "
                  f"is {floor * 1e3:.1f} ms, {summary[name]['floor_over_sum']:.2f} of the sum")
    # Judged only where the rate puts the exchange within 0.5x to 2x the compute (None else).
    targets = {f"{n}: step <= 0.75 x (compute + exchange)": s["step_over_sum"] <= 0.75
               if 0.5 <= s["exchange_over_compute"] <= 2 else None for n, s in summary.items()}
    print(json.dumps(targets, indent=1))
    out = result_path(f"overlap_{args.rate}_{args.tag}", None, args.replace)
    out.write_text(json.dumps({"machine": describe(), "command": " ".join(["python"] + sys.argv),
                               "link": link, "config": cfg, "summary": summary,
                               "targets": targets, "per_rank": ranks}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
