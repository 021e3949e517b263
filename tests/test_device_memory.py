"""pyring's own device memory (cuda_ipc inboxes, device scratch) beside a caching allocator that
holds the rest of the device: on an allocation failure pyring asks the allocator to release
its cache and tries once more; what it holds shows in stats(). On the sim device with a
capacity (PYRING_SIM_CAPACITY), as a GPU shared by several ranks is full."""

from __future__ import annotations

import time

import torch

from pyring.launch import run_ranks

MIB = 1 << 20
INBOX = 128 * MIB  # cuda_ipc's inbox at the default slot size
# The inbox, the 16 MiB input, its 8 MiB output and 24 MiB for the allocator's cache.
CAPACITY = INBOX + 48 * MIB


def full_device_body(rank, world, store, release):
    import pyring
    from pyring import _C
    from pyring.testing import sim

    calls = []
    with pyring.init(rank, world, store, set_default=False, device=f"sim:{rank}",
                     timeout=30) as comm:
        held = dict(comm.stats()["device_memory"])
        x = sim.SimArray(4 * MIB, torch.float32, rank)
        out = sim.SimArray(2 * MIB, torch.float32, rank)
        x.fill_(1.0)
        cache = []  # the caching allocator's blocks: the rest of the device
        while True:
            try:
                cache.append(sim.SimArray(MIB // 4, torch.float32, rank))
            except pyring.CudaError:
                break

        def releaser(device):
            calls.append(device)
            cache.clear()

        _C.set_cached_memory_releaser(releaser if release else None)
        start = time.monotonic()
        try:
            comm.reduce_scatter_tensor(out, x)  # takes 16 MiB of device scratch
            result = ("ok", out.to_host()[0].item())
        except pyring.Error as e:
            result = (type(e).__name__, str(e))
        waited = time.monotonic() - start
        after = dict(comm.stats()["device_memory"])
    return {"held": held, "after": after, "calls": calls, "cached": len(cache),
            "result": result, "waited": waited}


def test_a_full_device_releases_the_cache_and_retries():
    results = run_ranks(2, full_device_body, True, timeout=120,
                        env={"PYRING_SIM_DEVICES": "2", "PYRING_SIM_CAPACITY": str(CAPACITY)})
    for rank, r in enumerate(results):
        assert r["result"] == ("ok", 2.0), (rank, r)
        assert r["calls"] == [f"sim:{rank}"], r["calls"]
        assert r["held"] == {f"sim:{rank}": INBOX}, r["held"]
        assert r["after"][f"sim:{rank}"] == INBOX + 16 * MIB, r["after"]


def test_a_device_still_full_fails_every_rank_at_once_naming_the_memory():
    results = run_ranks(2, full_device_body, False, timeout=120,
                        env={"PYRING_SIM_DEVICES": "2", "PYRING_SIM_CAPACITY": str(CAPACITY)})
    for r in results:
        kind, message = r["result"]
        assert kind in ("CudaError", "CommError"), r["result"]
        assert "cudaErrorMemoryAllocation" in message, message
        assert r["cached"] > 0 and r["waited"] < 5.0, r
