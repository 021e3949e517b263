"""Runs a function on N real processes that meet through a TCPStore: the project's one launcher
of local ranks (the main job, the multi-process tests, bench/ and the self-check).

``run_ranks(world, fn, *args)`` starts ``world`` spawned processes, each calling
``fn(rank, world, store, *args)``, and returns their results in rank order. A rank that raises,
dies or is still running at ``timeout`` (every rank is then killed) makes it raise RankFailure
with each such rank's error and traceback.
A rank dies with the process that started it. By default the store is a TCPStore hosted here;
``store=(host, port, prefix)`` joins an existing one (torchrun's) under a key prefix instead,
and ``ranks`` starts only some of the world's ranks here.
"""

from __future__ import annotations

import ctypes
import datetime
import multiprocessing as mp
import os
import queue
import signal
import time
import traceback
from typing import Any, Callable

import torch.distributed as dist

_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """SIGKILL to this process once `parent` (the process that started it) is gone."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the rank outlives a killed parent
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(3)


def _child(
    fn: Callable,
    rank: int,
    world: int,
    where: tuple,
    env: dict,
    results: Any,
    args: tuple,
    parent: int,
    hard_exit: bool,
) -> None:
    _die_with_parent(parent)
    os.environ.update(env)
    try:
        host, port, prefix, joined = where
        store = dist.TCPStore(
            host,
            port,
            None if joined else world,
            is_master=False,
            timeout=datetime.timedelta(seconds=60),
        )
        if prefix:
            store = dist.PrefixStore(prefix, store)
        results.put((rank, True, fn(rank, world, store, *args)))
    except BaseException as e:  # report everything, including SystemExit
        results.put((rank, False, (type(e).__name__, str(e), traceback.format_exc())))
    if hard_exit:
        results.close()
        results.join_thread()  # the result is sent
        os._exit(0)


class RankFailure(AssertionError):
    def __init__(self, failures: dict[int, tuple[str, str, str]]) -> None:
        self.failures = failures
        text = "\n".join(f"--- rank {r}: {t}: {m}\n{tb}" for r, (t, m, tb) in failures.items())
        super().__init__(f"{len(failures)} rank(s) failed:\n{text}")


def run_ranks(
    world: int,
    fn: Callable,
    *args: Any,
    env: dict | None = None,
    timeout: float = 120.0,
    allow_failures: bool = False,
    ranks: list[int] | None = None,
    store: tuple[str, int, str] | None = None,
    hard_exit: bool = False,
) -> list[Any]:
    """Returns each started rank's result (or, with allow_failures, (type, message) of its
    error; None for a rank that died without reporting), in the order of `ranks` (default:
    every rank of `world`). With hard_exit, a rank's process ends with os._exit once its
    result is sent: neither the objects fn left alive nor atexit handlers are torn down."""
    ctx = mp.get_context("spawn")
    mine = list(range(world)) if ranks is None else list(ranks)
    if store is None:
        master = dist.TCPStore(
            "127.0.0.1",
            0,
            world + 1,
            is_master=True,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=60),
        )
        where = ("127.0.0.1", master.port, "", False)
    else:
        where = (*store, True)
    results = ctx.Queue()
    procs = {
        r: ctx.Process(
            target=_child,
            daemon=True,
            args=(fn, r, world, where, env or {}, results, args, os.getpid(), hard_exit),
        )
        for r in mine
    }
    for p in procs.values():
        p.start()
    got: dict[int, Any] = {}
    failures: dict[int, tuple[str, str, str]] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(got) + len(failures) < len(mine):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                rank, ok, value = results.get(timeout=min(left, 0.5))
            except queue.Empty:
                # A rank that died without reporting (SIGKILL) counts once it has exited.
                if all(not p.is_alive() for p in procs.values()):
                    break
                continue
            if ok:
                got[rank] = value
            else:
                failures[rank] = value
    finally:
        for p in procs.values():
            p.join(timeout=max(0.0, min(5.0, deadline - time.monotonic())))
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
                p.join()
    missing = [r for r in mine if r not in got and r not in failures]
    if allow_failures:
        out = {r: got.get(r) for r in mine}
        for r, (t, m, _) in failures.items():
            out[r] = (t, m)
        return [out[r] for r in mine]
    for r in missing:
        failures[r] = (
            "Hang",
            f"no result within {timeout:.0f} s (exit code {procs[r].exitcode})",
            "",
        )
    if failures:
        raise RankFailure(dict(sorted(failures.items())))
    return [got[r] for r in mine]
