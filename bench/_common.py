"""Worker-side pieces shared by every allreduce benchmark worker (no torch import).

A worker is started with one argument, the path of a JSON config written by
bench/allreduce.py, holding:
  lib, rank (absent for MPI, which takes it from COMM_WORLD), world, sizes (bytes),
  iters and warmup (one entry per size), result_dir, plus library-specific keys.
Each rank appends JSON lines to <result_dir>/rank<r>.jsonl, flushed after every line:
  {"event": "hello", "rank", "pid"}              before the library is initialised
  {"event": "start", "rank", "info": {...}}      after initialisation (versions etc.)
  {"event": "row", "rank", "size", "oop_us": [...], "ip_us": [...],
   "oop_wrong": n, "ip_wrong": n}                one per size, in order
  {"event": "skip", "rank", "reason"}            library unavailable; exit code SKIP_RC
  {"event": "error", "rank", "reason", "traceback"}  then a non-zero exit
  {"event": "done", "rank"}
The parent aggregates rows across ranks; workers never talk to each other except
through the library under test.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any, Callable

SKIP_RC = 3


class Recorder:
    """Appends event records for one rank; every write is flushed at once."""

    def __init__(self, result_dir: str, rank: int) -> None:
        self.rank = rank
        self._f = open(os.path.join(result_dir, f"rank{rank}.jsonl"), "a", buffering=1)

    def emit(self, event: str, **fields: Any) -> None:
        rec = {"event": event, "rank": self.rank, **fields}
        self._f.write(json.dumps(rec) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


class Ops:
    """What measure() drives for one message size. All methods are collective
    except the refill/check ones; check_* return the number of wrong elements."""

    def barrier(self) -> None:
        raise NotImplementedError

    def refill_oop(self) -> None:
        """Poison the out-of-place output so a stale result cannot pass the check."""
        raise NotImplementedError

    def run_oop(self) -> None:
        raise NotImplementedError

    def check_oop(self) -> int:
        raise NotImplementedError

    def refill_ip(self) -> None:
        """Restore the in-place buffer to this rank's input value."""
        raise NotImplementedError

    def run_ip(self) -> None:
        raise NotImplementedError

    def check_ip(self) -> int:
        raise NotImplementedError


def _timed_loop(
    refill: Callable[[], None], run: Callable[[], None], barrier: Callable[[], None],
    iters: int, warmup: int
) -> list[float]:
    """Times each call of run() alone (microseconds); refill() and then a barrier run untimed
    before each, so every rank starts the timed call together and no rank's time includes
    waiting for another rank's refill."""
    clock = time.perf_counter
    times = []
    for i in range(warmup + iters):
        refill()
        barrier()
        t0 = clock()
        run()
        t1 = clock()
        if i >= warmup:
            times.append((t1 - t0) * 1e6)
    return times


def measure(ops: Ops, iters: int, warmup: int) -> dict[str, Any]:
    """Out-of-place then in-place, each after a barrier; results of the last
    iteration of each are checked."""
    ops.barrier()
    oop_us = _timed_loop(ops.refill_oop, ops.run_oop, ops.barrier, iters, warmup)
    oop_wrong = ops.check_oop()
    ops.barrier()
    ip_us = _timed_loop(ops.refill_ip, ops.run_ip, ops.barrier, iters, warmup)
    ip_wrong = ops.check_ip()
    return {
        "oop_us": [round(t, 3) for t in oop_us],
        "ip_us": [round(t, 3) for t in ip_us],
        "oop_wrong": int(oop_wrong),
        "ip_wrong": int(ip_wrong),
    }


def load_config() -> dict[str, Any]:
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} CONFIG.json (started by bench/allreduce.py)")
    with open(sys.argv[1]) as f:
        return json.load(f)


def run_worker(
    cfg: dict[str, Any],
    rank: int,
    setup: Callable[[], tuple[dict[str, Any], Callable[[int], Ops], Callable[[], None]]],
) -> int:
    """Runs every size for one rank and returns the process exit code.

    setup() initialises the library and returns (info, make_ops, teardown); it raises
    ImportError when the library is not available, which is reported as a skip.
    make_ops(nbytes) returns the Ops for one size.
    """
    rec = Recorder(cfg["result_dir"], rank)
    rec.emit("hello", pid=os.getpid())
    try:
        try:
            info, make_ops, teardown = setup()
        except ImportError as e:
            rec.emit("skip", reason=f"{type(e).__name__}: {e}")
            return SKIP_RC
        rec.emit("start", info=info)
        for size, iters, warmup in zip(cfg["sizes"], cfg["iters"], cfg["warmup"]):
            row = measure(make_ops(size), iters, warmup)
            rec.emit("row", size=size, **row)
        teardown()
        rec.emit("done")
        return 0
    except BaseException as e:  # every failure must reach the parent
        rec.emit("error", reason=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
        return 1
    finally:
        rec.close()
