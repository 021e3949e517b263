"""A rank of bench/lsan.py: communicators created and destroyed, then the soak's verified mix.
Returns the count of wrong elements (0 when every result was right)."""

from __future__ import annotations

from typing import Any

from _soak_mix import Mix

import pyring


def rank(rank: int, world: int, store: Any, calls: int, cycles: int) -> int:
    for _ in range(cycles):
        with pyring.init(rank, world, store, set_default=False, timeout=600) as c:
            c.barrier()
    wrong = 0
    with pyring.init(rank, world, store, set_default=False, timeout=600) as comm:
        mix = Mix(comm, seed=1)
        for _ in range(calls):
            wrong += mix.step()
    return wrong
