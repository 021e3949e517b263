"""Checks that every rank passes the same description of its tensors (names, shapes, dtypes).

One 16-byte allgather when the ranks agree; when they differ, a second allgather of the
descriptions so that every rank raises the same :class:`pyring.Error` naming the first entry
that differs.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..errors import Error


def describe(t: Any) -> str:
    return f"shape {tuple(t.shape)} {str(t.dtype).replace('torch.', '')}"


def check_same_on_all_ranks(comm: Any, what: str, entries: list[tuple[str, str]]) -> None:
    """Raises pyring.Error on every rank unless every rank passed equal ``entries``, a list of
    (key, description) pairs such as ("parameter 'fc.weight'", "shape (4, 3) float32").
    A collective: every rank must call it at the same point."""
    import torch

    world = comm.world_size
    if world == 1:
        return
    blob = json.dumps(entries).encode()
    digest = int.from_bytes(hashlib.sha256(blob).digest()[:7], "little")
    mine = torch.tensor([len(blob), digest], dtype=torch.int64)
    rows = torch.empty(world * 2, dtype=torch.int64)
    comm.all_gather_into_tensor(rows, mine)
    rows = rows.view(world, 2)
    if bool((rows == rows[0]).all()):
        return
    width = int(rows[:, 0].max())
    padded = torch.zeros(width, dtype=torch.uint8)
    padded[: len(blob)] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    every = torch.empty(world * width, dtype=torch.uint8)
    comm.all_gather_into_tensor(every, padded)
    tables = [json.loads(every[r * width: r * width + int(rows[r, 0])].numpy().tobytes())
              for r in range(world)]
    raise Error(f"{what} on rank {comm.rank}: {_first_difference(tables)}")


def _first_difference(tables: list[list[list[str]]]) -> str:
    maps = [dict(map(tuple, t)) for t in tables]
    keys = [k for t in tables for k, _ in t]
    for key in dict.fromkeys(keys):
        seen = [m.get(key, "missing") for m in maps]
        others = [(r, d) for r, d in enumerate(seen) if d != seen[0]]
        if others:
            said = ", ".join(f"{d} on rank {r}" for r, d in others[:3])
            more = f" (and {len(others) - 3} more ranks)" if len(others) > 3 else ""
            return f"{key} is {seen[0]} on rank 0 but {said}{more}"
    bad = [r for r, t in enumerate(tables) if t != tables[0]]
    return f"the ranks list the same entries in different orders (ranks {bad} differ from 0)"
