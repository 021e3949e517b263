"""Counting the bytes a rank receives over a span of collectives, free of the neighbouring
calls: a compressed call sends its first segments at once, so a rank that reads or resets its
counters while another has already begun the next call would count some of that call."""

from __future__ import annotations

from ..optim.compression import received_bytes


def reset_counts(comm) -> None:
    """Zeroes the counters once no rank can still send this rank bytes of an earlier call,
    and before any rank sends bytes of the next (every rank calls it)."""
    comm.barrier()
    comm.reset_stats()
    comm.barrier()


def received_since_reset(comm) -> int:
    """Bytes received since reset_counts(), read once every rank has ended the calls counted
    and before any rank sends bytes of the next (every rank calls it; the barrier's own few
    bytes are counted)."""
    comm.barrier()
    got = received_bytes(comm.stats())
    comm.barrier()
    return got
