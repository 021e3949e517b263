"""Links that carry device memory (the registry's device transports: cuda_ipc), made at init
for ranks bound to a device (``init(device=...)``). Every rank takes the same path: the device
links are used only when such a transport links every pair and every rank connected them;
otherwise device buffers are staged through pinned host memory over shm or tcp, and rank 0
logs why at INFO."""

from __future__ import annotations

import logging
from typing import Any

from .. import _C
from . import rendezvous
from .devices import KIND_NAMES

log = logging.getLogger("pyring")


def connect(core: Any, store: Any, rank: int, world: int, peers: list[dict], device: str | None,
            cfg: Any, job_id: str, needed: list[int], local_index: int,
            local_world: int) -> str | None:
    """The device links' transport once attached to ``core``; None where device buffers are
    staged. Collective over the ranks in ``peers`` (each published its ``device``)."""
    if world < 2 or not any(p["device"] for p in peers):
        return None
    prepared, why = None, ""
    if device is None:
        why = "bound to no device at init (init(device=...))"
    elif cfg.transport == "tcp":
        why = "transport='tcp' publishes no device transport"
    else:
        kind, index = device.split(":")
        order = list(core.ring_order)
        left = order[order.index(rank) - 1]  # the device collectives' only sender to this rank
        prepared = _C.prepare_device_transports(KIND_NAMES.index(kind), int(index), local_world,
                                                cfg.device_segment_bytes, job_id, rank, [left])
        why = "; ".join(f"{t}: {e}" for t, e in prepared.refused.items())
    try:
        mine = {"host": rendezvous.host_key(),
                "addresses": dict(prepared.addresses) if prepared else {}}
        every = rendezvous.exchange(store, rank, world, mine, cfg.timeout_s, key="device")
        pending = None
        if prepared is not None and prepared.addresses:
            endpoints = [(p["host"], p["addresses"]) for p in every]
            pending, err = core.connect_device_links(prepared, endpoints, needed, local_index,
                                                     local_world)
            why = err or why
        elif not why:
            why = "no device transport is built"
        oks = rendezvous.exchange(store, rank, world, "" if pending else why, cfg.timeout_s,
                                  key="device_ok")
    finally:
        if prepared is not None:
            prepared.release()
    failed = {r: w for r, w in enumerate(oks) if w}
    if failed:
        if rank == 0:
            log.info("device buffers are staged through pinned host memory (no device links): %s",
                     "; ".join(f"rank {r}: {w}" for r, w in sorted(failed.items())))
        return None
    core.attach_device_links(pending)
    if rank == 0:
        log.info("device buffers on %s move over %s links, device to device", device,
                 pending.transport)
    return pending.transport
