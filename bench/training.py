#!/usr/bin/env python
"""Training step time and speedup of every gradient-sync method, in two modes.

    python bench/training.py                        # --mode step, ~7 min on 2 cores
    python bench/training.py --rounds 1 --blocks 1 --block 1 --dim 128 --layers 2
    python bench/training.py --mode scaling         # 1 and 2 CPU ranks here, < 5 min
    python bench/training.py --mode scaling --ranks 1,2,4,8   # one rank per GPU
    torchrun --nnodes 4 --nproc-per-node 8 ... bench/training.py --mode scaling --tag c --replace
    python bench/training.py --mode scaling --merge bench/results/scaling_c1.json \\
        bench/results/scaling_c_w32.json --tag c --replace

Both modes time one training step (bench/_train_step.py: examples/train.py's CharGPT on its
corpus, AdamW, a fixed batch per rank) with each method: pyring (pyring.DistributedOptimizer;
its buckets are symmetric memory where every rank shares the host), pyring-private (the same
with private buckets, symmetric_buckets=False; --methods adds it),
ddp-pyring, ddp-gloo, ddp-nccl (DistributedDataParallel on that backend, gradients as bucket
views), ddp-pyring-copy and ddp-gloo-copy (DDP with its defaults); beside them the bare model
(compute) and one allreduce of the gradients' size alone with each library (alone-LIB).

--mode step (bench/_step_mode.py, bench/_step_report.py): the methods side by side at 1 and 2
ranks, on the CPU. Every round is one job of two freshly spawned ranks that interleaves, block
by block, every method at 2 ranks and at 1 rank (rank 0 alone, rank 1 asleep), the bare model
at 2 and 1 rank(s), the bare model at 2 ranks meeting once per step (lockstep) and alone-LIB.
Interleaving every second or so cancels the shared machine's drift, which moves whole runs by
10-40%, so methods are compared within one job. Per-round figures, then their medians over
--rounds. Default model 5 x 512 (16.1 M parameters, 64 MB of gradients), batch 2 x 64.
Writes bench/results/training_<tag>.json with --replace, else a file of its own under
bench/results/runs/ (bench/_results.py).

--mode scaling (bench/_scaling_mode.py, bench/_speedup_report.py): speedup against the number
of ranks (weak scaling), every run (compute xN, alone-LIB xN, METHOD xN) in fresh processes,
rank r on GPU r mod the GPU count where there are GPUs (several ranks share a GPU when --ranks
exceeds it; ddp-nccl then fails, as NCCL refuses two ranks on one GPU, and is reported). The
plan runs --repeats times, interleaved, and each run reports its median
repeat (every repeat's step is kept). Default model 4 x 128 (0.88 M parameters), batch 16 x 128.
Writes bench/results/scaling_<tag>.json (under torchrun: scaling_<tag>_w<N>.json) with
--replace, else a file of its own under bench/results/runs/, and a PNG of speedup against
ranks with the ideal line beside it.

Every rank runs --threads torch threads, pinned to one core with --pin (as mpirun's default
--bind-to core), with glibc's heap trimming off (MALLOC_ENV; --default-malloc leaves it on).
A job or run that fails or outlives --run-limit is killed, reported and skipped; the exit
status is then 1. The numbers are defined under each table and in the JSON ("definitions").
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import torch  # noqa: E402
from _results import add_replace_flag, result_path
from _train_step import METHODS  # noqa: E402

# Set for every rank unless --default-malloc: glibc then never hands freed heap memory back to
# the system, so a step's temporaries (AdamW's, autograd's) do not page-fault afresh each step,
# a cost that otherwise lands on whichever rank's heap happens to be trimmed.
MALLOC_ENV = {"MALLOC_TRIM_THRESHOLD_": str(16 << 30), "MALLOC_MMAP_THRESHOLD_": str(4 << 30)}
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
MODES = ("step", "scaling")
# name, type, default in --mode step, in --mode scaling (None: not an option of that mode), help
OPTIONS = (
    ("dim", int, 512, 128, "model width"),
    ("layers", int, 5, 4, "transformer blocks"),
    ("heads", int, 8, 4, "attention heads"),
    ("seq", int, 64, 128, "sequence length"),
    ("batch", int, 2, 16, "sequences per rank per step"),
    ("threads", int, 1, 1, "torch threads per rank"),
    ("bucket-mb", float, 25.0, 25.0, "pyring.DistributedOptimizer's bucket size (MiB)"),
    ("data-mb", float, 4.0, 4.0, "corpus MiB read from the standard library"),
    ("warmup", int, 1, 3, "untimed blocks per job (step), untimed iterations per run (scaling)"),
    ("timeout", float, 120.0, 120.0, "collective deadline (s)"),
    ("run-limit", float, 600.0, 240.0, "a job (step) or run (scaling) is killed after (s)"),
    ("blocks", int, 6, None, "timed blocks per job"),
    ("block", int, 3, None, "timed iterations per mode and block (after one untimed)"),
    ("rounds", int, 3, None, "every job runs this many times; figures are medians over rounds"),
    ("steps", int, None, 20, "timed steps per run"),
    (
        "repeats",
        int,
        None,
        3,
        "the whole plan runs this often, interleaved; each run reports its median repeat",
    ),
    ("comm-iters", int, None, 20, "timed allreduces per alone-LIB run"),
)
STEP_METHODS = tuple(m for m in METHODS if m not in ("ddp-nccl", "pyring-private"))
SCALING_METHODS = METHODS[:4] if GPUS >= 2 else METHODS[:3]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=MODES, default="step")
    p.add_argument(
        "--methods",
        help=f"comma-separated, of {', '.join(METHODS)} (default: step "
        f"{','.join(STEP_METHODS)}; scaling {','.join(SCALING_METHODS)})",
    )
    for name, kind, *defaults, what in OPTIONS:  # a mode without a default lacks the option
        used = ", ".join(f"{m} {v}" for m, v in zip(MODES, defaults) if v is not None)
        p.add_argument(f"--{name}", type=kind, help=f"{what} (default: {used})")
    top = GPUS or len(os.sched_getaffinity(0))  # powers of two up to the GPUs (and all) or cores
    worlds = sorted({1 << k for k in range(top.bit_length())} | ({top} if GPUS else set()))
    p.add_argument(
        "--ranks",
        help="scaling: world sizes to spawn locally (ignored under "
        f"torchrun; default {','.join(map(str, worlds))})",
    )
    p.add_argument(
        "--predict",
        default="1,2,4,8,16",
        help="scaling: rank counts for the cost model's prediction (bench/_scaling_model.py)",
    )
    p.add_argument(
        "--merge",
        nargs="+",
        metavar="JSON",
        help="scaling: one table and plot from earlier results",
    )
    p.add_argument(
        "--pin",
        action="store_true",
        help="bind each rank (all its threads) to one core: local rank r to the r-th",
    )
    p.add_argument(
        "--default-malloc",
        action="store_true",
        help="leave glibc's heap trimming on in the ranks (see MALLOC_ENV)",
    )
    p.add_argument("--tag", default=socket.gethostname())
    p.add_argument("--out", default=None, help="JSON path (scaling: the PNG beside it)")
    add_replace_flag(p)
    args = p.parse_args(argv)
    col = MODES.index(args.mode)
    for name, _, *defaults, _ in OPTIONS:
        key = name.replace("-", "_")
        if getattr(args, key) is None:
            setattr(args, key, defaults[col])
        elif defaults[col] is None:
            p.error(f"--{name} is not an option of --mode {args.mode}")
        elif isinstance(defaults[col], int) and getattr(args, key) < 1 and key != "warmup":
            p.error(f"--{name} must be >= 1")
    args.predict = [int(w) for w in args.predict.split(",") if w]
    if args.mode == "step" and (args.ranks or args.merge):
        p.error("--ranks and --merge are options of --mode scaling")
    args.ranks = [int(w) for w in (args.ranks or ",".join(map(str, worlds))).split(",") if w]
    valid = STEP_METHODS if args.mode == "step" else METHODS
    args.methods = [
        m
        for m in (
            args.methods or ",".join(STEP_METHODS if args.mode == "step" else SCALING_METHODS)
        ).split(",")
        if m
    ]
    bad = sorted(set(args.methods) - set(valid))
    if bad:
        p.error(f"unknown methods {bad} for --mode {args.mode}; valid: {', '.join(valid)}")
    if args.dim % args.heads:
        p.error("--dim must be a multiple of --heads")
    return args


def config(args: argparse.Namespace) -> dict[str, Any]:
    """What every rank needs, as written to the JSON's "config"."""
    col = MODES.index(args.mode)
    cfg = {
        n.replace("-", "_"): getattr(args, n.replace("-", "_"))
        for n, _, *defaults, _ in OPTIONS
        if defaults[col] is not None
    }
    return cfg | {
        "mode": args.mode,
        "pin": args.pin,
        "gpus": GPUS if args.mode == "scaling" else 0,
        "malloc_env": {} if args.default_malloc else MALLOC_ENV,
    }


def step_mode(args: argparse.Namespace, cfg: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Runs --mode step; (the JSON's mode-specific fields, whether every job ran)."""
    import _step_mode
    from _step_report import DEFINITIONS, print_table, summarize

    jobs = _step_mode.run(args.methods, cfg)
    ok = [j for j in jobs if j.get("status") == "ok"]
    cfg["params"] = ok[0]["params"] if ok else 0
    rows = summarize(jobs, args.methods)
    print_table(rows, cfg)
    doc = {"benchmark": "training", "rounds": jobs, "summary": rows, "definitions": DEFINITIONS}
    return doc, len(ok) == len(jobs)


def scaling_mode(
    args: argparse.Namespace, cfg: dict[str, Any], out: Path
) -> tuple[dict[str, Any], bool] | None:
    """Runs --mode scaling (or merges earlier results); as step_mode, None on a torchrun rank
    other than 0."""
    import _scaling_mode as sm
    from _scaling_model import predict, print_predictions
    from _speedup_report import DEFINITIONS, plot, print_table

    if args.merge:
        docs = [json.loads(Path(path).read_text()) for path in args.merge]
        runs, cfg = {k: v for d in docs for k, v in d["runs"].items()}, docs[0]["config"]
    elif "RANK" in os.environ:  # under torchrun
        world = int(os.environ["WORLD_SIZE"])
        runs = sm.run_torchrun(sm.kinds_at(world, args.methods), cfg)
        if int(os.environ["RANK"]) != 0:
            return None
    else:
        runs = sm.run_local(sorted(set(args.ranks)), args.methods, cfg)
    cfg["params"] = next((v["params"] for v in runs.values() if v.get("status") == "ok"), 0)
    rows = sm.summarize(runs, cfg["batch"], METHODS)
    print_table(rows, cfg)
    predicted = predict(rows, cfg, args.predict)
    print_predictions(predicted)
    err = plot(
        rows + predicted,
        out.with_suffix(".png"),
        f"CharGPT {cfg['params'] / 1e6:.1f} M params, "
        f"batch {cfg['batch']}/rank, {'GPU' if cfg['gpus'] else 'CPU'}",
        METHODS,
    )
    print(err or f"\nplotted {out.with_suffix('.png')}")
    doc = {
        "benchmark": "scaling",
        "config": cfg,
        "runs": runs,
        "summary": rows,
        "predicted": predicted,
        "definitions": DEFINITIONS,
    }
    return doc, all(v.get("status") == "ok" for v in runs.values())


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    cfg = config(args)
    os.environ.update(cfg["malloc_env"])  # every rank is spawned from here, and inherits it
    tag = "".join(c if c.isalnum() or c in "-_." else "_" for c in args.tag)
    torchrun = args.mode == "scaling" and not args.merge and "RANK" in os.environ
    stem = f"{'training' if args.mode == 'step' else 'scaling'}_{tag}"
    if torchrun:
        stem += f"_w{os.environ['WORLD_SIZE']}"
    out = result_path(stem, args.out, args.replace)
    out.parent.mkdir(parents=True, exist_ok=True)
    load0, t0 = os.getloadavg(), time.perf_counter()
    if load0[0] > 1.5 and not (args.merge or torchrun):
        print(f"warning: load average {load0[0]:.2f} at start: timings are not trustworthy")
    if args.mode == "step":
        res = step_mode(args, cfg)
    else:
        res = scaling_mode(args, cfg, out)
        if res is None:
            return 0
    from machine import describe

    fields, ok = res
    doc = {
        "benchmark": fields.pop("benchmark"),
        "command": sys.argv,
        "config": fields.pop("config", cfg),
        "machine": describe(),
        "loadavg_start": load0,
        "loadavg_end": os.getloadavg(),
        "wall_s": round(time.perf_counter() - t0, 1),
        **fields,
    }
    out.write_text(json.dumps(doc, indent=1))
    print(f"\nwrote {out} ({doc['wall_s']:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
