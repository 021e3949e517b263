"""Desync detection at PYRING_DEBUG=DETAIL: before each collective every rank publishes its
description, and every rank raises DesyncError naming the ranks that differ.

The description (sequence number, kind, dtype, count, op, root, algorithm and wire format) is
eight int64 that travel in an all-gather of their own, which every rank runs whatever it was
asked for, so a rank that calls something else is named by all, not only by its ring
neighbours. The check runs after the call's own validation and before any byte of its data is
sent; the communicator stays usable after a DesyncError.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _C
from ..config import ALGOS
from ..errors import DesyncError
from .buffers import DTYPE_NAMES, view_of

KINDS = ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor", "barrier",
         "reduce", "gather", "scatter", "all_to_all_single", "all_to_all")
WIRES: tuple[str, ...] = tuple(_C.WIRE_NAMES)
OPS: tuple[str, ...] = tuple(_C.OP_NAMES)  # index = the core's op code
_FIELDS = 8
_INT64 = DTYPE_NAMES.index("int64")


def dtype_code(dtype: Any) -> int:
    name = str(dtype).removeprefix("torch.")
    return DTYPE_NAMES.index(name) if name in DTYPE_NAMES else -1


def _describe(row: list[int]) -> str:
    seq, kind, dtype, count, op, root, algo, wire = row
    if not 0 <= kind < len(KINDS):
        return f"an unknown call #{seq}"
    parts = [f"count={count}"] if KINDS[kind] != "barrier" else []
    if 0 <= dtype < len(DTYPE_NAMES):
        parts.append(f"dtype={DTYPE_NAMES[dtype]}")
    if 0 <= op < len(OPS):
        parts.append(f"op={OPS[op]}")
    if root >= 0:
        parts.append(f"root={root}")
    if 0 <= algo < len(ALGOS):
        parts.append(f"algo={ALGOS[algo]}")
    if wire > 0:
        parts.append(f"wire={WIRES[wire] if wire < len(WIRES) else wire}")
    return f"{KINDS[kind]} #{seq}({', '.join(parts)})"


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def check(comm: Any, kind: str, count: int = 0, dtype: int = -1, op: int = -1,
          root: int = -1, algo: str | None = None, wire: str = "fp32") -> None:
    """Raises DesyncError on every rank when the ranks' descriptions of this call differ.
    ``dtype`` and ``op`` are the core's codes (-1: none)."""
    comm._desync_seq += 1
    op_index = op
    algo_index = ALGOS.index(algo) if algo in ALGOS else -1
    mine = np.array([comm._desync_seq, KINDS.index(kind), dtype, count, op_index, root,
                     algo_index, WIRES.index(wire)], dtype=np.int64)
    rows = np.empty(comm.world_size * _FIELDS, dtype=np.int64)
    src, dst = view_of(mine, kind, "description"), view_of(rows, kind, "descriptions")
    comm._c.all_gather(src.ptr, dst.ptr, _FIELDS, _INT64, False)
    table = [tuple(r) for r in rows.reshape(comm.world_size, _FIELDS).tolist()]
    if all(r == table[0] for r in table):
        return
    groups: dict[tuple, list[int]] = {}
    for r, row in enumerate(table):
        groups.setdefault(row, []).append(r)
    # The largest group (on a tie, rank 0's) is the reference; the others are named.
    ref = max(groups, key=lambda row: (len(groups[row]), -groups[row][0]))
    others = "; ".join(f"{_ranks(ranks)} called {_describe(list(row))}"
                       for row, ranks in groups.items() if row != ref)
    raise DesyncError(
        f"{_describe(list(table[comm.rank]))} on rank {comm.rank}/{comm.world_size}: the ranks "
        f"called different collectives: {others}, while {_ranks(groups[ref])} called "
        f"{_describe(list(ref))}"
    )
