"""Runs a function on N real processes that meet through a TCPStore hosted by the test.

``run_ranks(world, fn, *args)`` starts ``world`` spawned processes, each calling
``fn(rank, world, store, *args)``, and returns their results in rank order. A rank that raises
fails the test with its traceback; ranks still running at ``timeout`` are killed and reported.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import queue
import signal
import time
import traceback
from typing import Any, Callable

import torch.distributed as dist


def _child(fn: Callable, rank: int, world: int, port: int, env: dict, results: Any,
           args: tuple) -> None:
    os.environ.update(env)
    try:
        store = dist.TCPStore("127.0.0.1", port, world, is_master=False,
                              timeout=datetime.timedelta(seconds=60))
        results.put((rank, True, fn(rank, world, store, *args)))
    except BaseException as e:  # report everything, including SystemExit
        results.put((rank, False, (type(e).__name__, str(e), traceback.format_exc())))


class RankFailure(AssertionError):
    def __init__(self, failures: dict[int, tuple[str, str, str]]) -> None:
        self.failures = failures
        text = "\n".join(f"--- rank {r}: {t}: {m}\n{tb}" for r, (t, m, tb) in failures.items())
        super().__init__(f"{len(failures)} rank(s) failed:\n{text}")


def run_ranks(world: int, fn: Callable, *args: Any, env: dict | None = None,
              timeout: float = 120.0, allow_failures: bool = False) -> list[Any]:
    """Returns each rank's result (or, with allow_failures, (type, message) of its error;
    None for a rank that died without reporting)."""
    ctx = mp.get_context("spawn")
    store = dist.TCPStore("127.0.0.1", 0, world + 1, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=60))
    results = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(fn, r, world, store.port, env or {}, results, args),
                         daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    got: dict[int, Any] = {}
    failures: dict[int, tuple[str, str, str]] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(got) + len(failures) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                rank, ok, value = results.get(timeout=min(left, 0.5))
            except queue.Empty:
                # A rank that died without reporting (SIGKILL) counts once it has exited.
                if all(not p.is_alive() for p in procs):
                    break
                continue
            if ok:
                got[rank] = value
            else:
                failures[rank] = value
    finally:
        for p in procs:
            p.join(timeout=max(0.0, min(5.0, deadline - time.monotonic())))
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
                p.join()
    missing = [r for r in range(world) if r not in got and r not in failures]
    if allow_failures:
        out = [got.get(r) for r in range(world)]
        for r, (t, m, _) in failures.items():
            out[r] = (t, m)
        return out
    for r in missing:
        failures[r] = ("Hang", f"no result within {timeout:.0f} s (exit code "
                       f"{procs[r].exitcode})", "")
    if failures:
        raise RankFailure(failures)
    return [got[r] for r in range(world)]
