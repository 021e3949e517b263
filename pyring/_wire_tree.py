"""The hierarchical compressed allreduce: full precision inside a host, compressed across.

On a topology of several hosts (the top level's groups), for a float32 vector ``x``:

1. every rank of a host sends ``x`` to the host's first rank, its leader, which adds them in
   float32 (within a host the links are shared memory: full precision costs little);
2. the leaders run the compressed schedule of pyring/compression.py among themselves: each
   compresses its host's sum chunk by chunk (one-bit with the state's worker residual), sends
   chunk j to leader j, which adds the copies in float32, compresses again (the server
   residual) and sends the result to every leader;
3. each leader decodes every chunk and sends the result to its host's ranks.

Only step 2 crosses hosts, once per host rather than once per rank. Every rank ends with the
leaders' values. Messages travel the point-to-point links with tag WIRE_TAG, which user code
must not use; a compressed payload is preceded by its size.
"""

from __future__ import annotations

from typing import Any

import torch

from .compression import OneBitState, decode, encode, split_chunks

WIRE_TAG = -(1 << 62)


def _send_payload(comm: Any, payload: Any, peer: int, works: list) -> None:
    works.append(comm.isend(torch.tensor([payload.numel()], dtype=torch.int64), peer, WIRE_TAG))
    works.append(comm.isend(payload, peer, WIRE_TAG))


def _recv_payload(comm: Any, peer: int) -> Any:
    size = torch.empty(1, dtype=torch.int64)
    comm.recv(size, peer, WIRE_TAG)
    buf = torch.empty(int(size.item()), dtype=torch.uint8)
    comm.recv(buf, peer, WIRE_TAG)
    return buf


def tree_all_reduce(comm: Any, x: Any, op: str, wire: str, state: OneBitState | None,
                    groups: list[list[int]]) -> None:
    """Reduces the contiguous float32 ``x`` in place (see the module)."""
    rank = comm.rank
    host = next(g for g in groups if rank in g)
    if rank != host[0]:
        comm.send(x, host[0], WIRE_TAG)
        comm.recv(x, host[0], WIRE_TAG)
        return
    part = torch.empty_like(x)
    for r in host[1:]:  # in rank order: the same sum on every run
        comm.recv(part, r, WIRE_TAG)
        x.add_(part)
    leaders = [g[0] for g in groups]
    me = leaders.index(rank)
    chunks = split_chunks(x.numel(), len(leaders))
    own_off, own_n = chunks[me]
    mc = state._bind(x.numel(), chunks, me) if wire == "onebit" else None
    works: list = []
    payloads = []
    for j, (off, n) in enumerate(chunks):
        residual = state.worker[off:off + n] if mc else None
        payloads.append(encode(wire, x[off:off + n], residual, mc and mc.enc[j]))
        if j != me:
            _send_payload(comm, payloads[j], leaders[j], works)
    acc = torch.zeros(own_n, dtype=torch.float32)
    alpha = 1.0 / comm.world_size if op == "avg" else 1.0
    for j, peer in enumerate(leaders):
        got = payloads[me] if j == me else _recv_payload(comm, peer)
        decode(wire, got, alpha, True, acc, mc and mc.recv[j])
    mine = encode(wire, acc, state.server if mc else None, mc and mc.server)
    for j, peer in enumerate(leaders):
        if j != me:
            _send_payload(comm, mine, peer, works)
    for j, (off, n) in enumerate(chunks):
        decode(wire, mine if j == me else _recv_payload(comm, leaders[j]), 1.0, False,
               x[off:off + n], mc and mc.gather[j])
    for w in works:
        w.wait()
    for r in host[1:]:
        comm.send(x, r, WIRE_TAG)
