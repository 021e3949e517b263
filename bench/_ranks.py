"""The processes of bench/training.py: its ranks start through pyring.launch's run_ranks
(the launcher the multi-process tests use), and a failed run becomes a record, not an exception.

Every rank ends with os._exit once its result is sent (run_ranks' hard_exit): torch can
deadlock freeing a DDP whose gloo group is being destroyed (it joins gloo's thread while
holding the GIL), so a rank keeps what it built in KEEP and tears nothing down.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch

from pyring.launch import RankFailure, run_ranks

KEEP: list[Any] = []  # objects a rank must never free (see above)


def launch(
    fn: Callable,
    world: int,
    *args: Any,
    timeout: float,
    ranks: list[int] | None = None,
    store: tuple[str, int, str] | None = None,
) -> list[Any]:
    """fn(rank, world, store, *args) on `world` spawned ranks (or only `ranks` of them, meeting
    through `store`: see run_ranks); their results in rank order. Raises RankFailure when a
    rank fails or is still running after `timeout` seconds (every rank is then killed)."""
    return run_ranks(world, fn, *args, timeout=timeout, ranks=ranks, store=store, hard_exit=True)


def failure(e: BaseException) -> dict[str, Any]:
    """The record of a failed run: its first error in one line, and the details."""
    if isinstance(e, RankFailure):
        # An error says more than a hang; of several, the lowest rank's is reported.
        rank, (kind, msg, _) = min(e.failures.items(), key=lambda f: (f[1][0] == "Hang", f[0]))
        first = f"rank {rank}: {kind}: {msg.strip().splitlines()[0] if msg.strip() else ''}"
    else:
        first = f"{type(e).__name__}: {e}".splitlines()[0]
    return {"status": "failed", "error": first[:300], "detail": str(e)[-4000:]}


def setup_rank(local_rank: int, cfg: dict[str, Any]) -> torch.device:
    """Pins this rank to its core (cfg["pin"]), sets its torch threads and returns its device:
    GPU local_rank mod cfg["gpus"], or the CPU when cfg["gpus"] is 0."""
    if cfg["pin"]:  # this rank and every thread it starts later (pyring's, gloo's)
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[local_rank % len(cores)]})
    torch.set_num_threads(cfg["threads"])
    if not cfg["gpus"]:
        return torch.device("cpu")
    dev = torch.device(f"cuda:{local_rank % cfg['gpus']}")
    torch.cuda.set_device(dev)
    return dev
