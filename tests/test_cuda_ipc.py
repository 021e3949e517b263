"""Device buffers over cuda_ipc links on the sim device: the ring runs on the device buffers
themselves, segments copied device to device into the peer's registered inbox and reduced by
the device kernels, with no staging through the host. The collective matrix at 2, 3 and 4
ranks (two ranks per sim device) under random stream delays; the fallback to host staging
where IPC is refused, decided the same on every rank; a peer that dies mid-collective."""

from __future__ import annotations

import logging
import os

import pytest
import torch
from test_sim_matrix import DELAY_US, _all_reduce_cases, _async_cases, _dev, _other_cases

from pyring.launch import run_ranks


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _capture() -> _Capture:
    h = _Capture()
    log = logging.getLogger("pyring")
    log.addHandler(h)
    log.setLevel(logging.INFO)
    return h


def matrix_body(rank, world, store):
    import pyring

    bad: list[str] = []
    dev = f"sim:{_dev(rank)}"
    with pyring.init(rank, world, store, segment_bytes=128, set_default=False,
                     device=dev) as comm:
        assert comm._c.device_transport == "cuda_ipc"
        _all_reduce_cases(comm, rank, world, bad, "cuda_ipc seg=128")
        _other_cases(comm, rank, world, bad)
        _async_cases(comm, rank, world, bad)
        stats = comm.stats()
    ring = stats["device_links"]
    if not ring or any(v["transport"] != "cuda_ipc" for v in ring.values()):
        bad.append(f"device links {ring}")
    # Every payload byte went device to device: the host links carried the headers alone.
    moved = sum(v["bytes_sent"] for v in ring.values())
    if moved < 100_000 or stats["bytes_sent"] > moved // 10:
        bad.append(f"{moved} bytes over device links, {stats['bytes_sent']} over host links")
    return bad


@pytest.mark.parametrize("world", [2, 3, 4])
def test_cuda_ipc_matrix(world):
    results = run_ranks(world, matrix_body, env={"PYRING_SIM_DELAY_US": DELAY_US}, timeout=400)
    for rank, bad in enumerate(results):
        assert not bad, f"rank {rank}: {len(bad)} wrong results:\n" + "\n".join(bad[:20])


def memory_body(rank, world, store):
    import pyring
    from pyring import _C

    before = _C.sim_allocated_bytes()
    with pyring.init(rank, world, store, segment_bytes=1 << 20, set_default=False,
                     device=f"sim:{_dev(rank)}") as comm:
        assert comm._c.device_transport == "cuda_ipc"
        return _C.sim_allocated_bytes() - before


@pytest.mark.parametrize("world", [2, 4])
def test_device_memory_is_one_inbox_whatever_the_local_world(world):
    # The device collectives are ring schedules: a rank receives from its left neighbour
    # alone, so it holds one inbox of 8 slots, not one per local rank.
    assert run_ranks(world, memory_body, timeout=120) == [8 << 20] * world


def refused_body(rank, world, store):
    import pyring
    from pyring.testing.sim import SimArray

    if rank == 1:
        os.environ["PYRING_SIM_IPC"] = "refuse"
    h = _capture()
    with pyring.init(rank, world, store, set_default=False, device=f"sim:{_dev(rank)}") as comm:
        x = SimArray.from_tensor(torch.arange(3001, dtype=torch.float32) * (rank + 1), _dev(rank))
        comm.all_reduce(x)
        ok = torch.equal(x.to_host(), torch.arange(3001, dtype=torch.float32) * 6)
        return comm._c.device_transport, ok, comm.stats()["device_links"], h.lines


def test_refused_ipc_falls_back_to_staging_on_every_rank():
    results = run_ranks(3, refused_body, timeout=120)
    for rank, (transport, ok, links, _lines) in enumerate(results):
        assert transport is None and links == {}, (rank, transport, links)
        assert ok, f"rank {rank}: wrong all_reduce after the fallback"
    staged = [m for m in results[0][3] if "staged through pinned host memory" in m]
    assert staged and "rank 1" in staged[0] and "IPC refused" in staged[0], results[0][3]


def dying_body(rank, world, store):
    import pyring
    from pyring.errors import CommError
    from pyring.testing.sim import SimArray

    with pyring.init(rank, world, store, set_default=False, timeout=20,
                     device=f"sim:{_dev(rank)}") as comm:
        x = SimArray(1 << 20, torch.float32, _dev(rank)).fill_(1.0)
        comm.all_reduce(x)
        if rank == 1:
            os._exit(0)
        try:
            comm.all_reduce(x)
            return "no error"
        except CommError as e:
            return str(e)


def test_dead_peer_fails_the_device_collective():
    msg = run_ranks(2, dying_body, timeout=120, allow_failures=True)[0]
    assert "rank 1" in str(msg) and ("died" in str(msg) or "gave up" in str(msg)), msg


def env_body(rank, world, store):
    import pyring

    with pyring.init(rank, world, store, set_default=False) as comm:
        return comm.device, comm._c.device_transport


def test_pyring_device_binds_at_init():
    for got in run_ranks(2, env_body, env={"PYRING_DEVICE": "sim:0"}, timeout=60):
        assert tuple(got) == ("sim:0", "cuda_ipc"), got


def _usage() -> tuple[int, int, int, int]:
    """(resident KiB, open fds, threads, /dev/shm entries) of this process."""
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    return (int(status["VmRSS"].split()[0]), len(os.listdir("/proc/self/fd")),
            int(status["Threads"]), len(os.listdir("/dev/shm")))


def churn_body(rank, world, store):
    import pyring
    from pyring.testing.sim import SimArray

    def one(k):
        with pyring.init(rank, world, store, set_default=False, device="sim:0",
                         segment_bytes=4096) as comm:
            x = SimArray.from_tensor(torch.full((3000,), float(rank + k)), 0)
            comm.all_reduce(x)
            assert x.to_host()[0].item() == float(sum(r + k for r in range(world)))
            assert comm._c.device_transport == "cuda_ipc"

    for k in range(10):  # warm-up: allocators and caches reach their size
        one(k)
    before = _usage()
    for k in range(150):
        one(k)
    return before, _usage()


def test_device_links_leak_nothing_across_communicators():
    for before, after in run_ranks(2, churn_body, timeout=600):
        rss, fds, threads, shm = (a - b for a, b in zip(after, before))
        assert fds <= 0 and threads <= 0 and shm <= 0, (before, after)
        assert rss < 8 * 1024, (before, after)  # KiB, over 150 communicators


def traced_body(rank, world, store):
    import pyring

    with pyring.init(rank, world, store, segment_bytes=4096, set_default=False,
                     device=f"sim:{_dev(rank)}") as comm:
        from pyring.testing import sim

        x = sim.SimArray(10_000, torch.float32, _dev(rank)).fill_(float(rank + 1))
        for _ in range(3):
            comm.all_reduce(x)
        return float(x.to_host()[0])


def test_ipc_trace_accounts_for_every_slot(tmp_path):
    """PYRING_IPC_TRACE: every slot a link queued is published, and handed on and released by
    its peer; pyring/runtime/ipc_trace.py's summary matches them up."""
    from pyring.runtime import ipc_trace as _ipc_trace

    prefix = str(tmp_path / "ipc")
    assert run_ranks(2, traced_body, env={"PYRING_IPC_TRACE": prefix}, timeout=120) == [12.0] * 2
    links = _ipc_trace.read_trace(prefix)
    assert sorted(links) == [(0, 1), (1, 0)], links
    # 40 KB of float32 in 4 KiB slots: 5 slots each way per phase, two phases, three calls.
    for ev in links.values():
        # A collective ends once its slots are handed on: the releases of the last call's
        # slots (at most an inbox of 8) may be seen only after the link wrote its trace.
        assert len(ev["q"]) == len(ev["p"]) == len(ev["r"]) == 30 and 22 <= len(ev["f"]) <= 30, {
            k: len(v) for k, v in ev.items()}
        assert all(p >= q for q, p in zip(ev["q"], ev["p"]))
    summary = _ipc_trace.summarize_trace(prefix)
    assert summary["slots"] == 60 and summary["links"] == 2, summary
    assert summary["copy_us_median"] >= 0 and summary["hold_us_median"] >= 0, summary


def late_close_body(rank, world, store, how):
    """Both ranks map each other's region; rank 1 closes 1.5 s after rank 0 (or dies). Rank 0's
    close waits for rank 1 to unmap its region, or returns once rank 1 is dead."""
    import gc
    import os
    import time

    import pyring
    from pyring.testing import sim

    comm = pyring.init(rank, world, store, set_default=False, device=f"sim:{rank}")
    x = sim.SimArray(1 << 16, torch.float32, rank)
    x.fill_(1.0)
    comm.all_reduce(x)
    store.set(f"ran/{rank}", "1")
    store.wait([f"ran/{r}" for r in range(world)])
    if rank == 1:
        if how == "dies":
            os._exit(0)
        time.sleep(1.5)
    start = time.monotonic()
    comm.close()
    del comm  # the links, and this rank's region, go with the communicator
    gc.collect()
    return {"close_s": time.monotonic() - start, "held": pyring._C.device_memory_held()}


@pytest.mark.parametrize("how", ["closes", "dies"])
def test_a_region_is_freed_only_once_its_sender_unmapped_it(how):
    results = run_ranks(2, late_close_body, how, env={"PYRING_SIM_DEVICES": "2"},
                        allow_failures=how == "dies", timeout=120)
    first = results[0]
    if how == "closes":
        assert 1.0 < first["close_s"] < 5.0, first  # waited for rank 1's close
    else:
        assert first["close_s"] < 1.0, first  # a dead sender maps nothing
    assert first["held"] == {}, first


def unmapped_body(rank, world, store):
    import ctypes

    import pyring._C as C
    from pyring.testing import sim

    if rank == 0:
        a = sim.SimArray(1 << 20, torch.float32, 0)  # 4 MiB: a file of its own
        a.fill_(1.0).to_host()
        store.set("h", C.sim_ipc_handle(0, a.ptr))
        store.wait(["opened"])
        C.sim_cuda_free(0, a.ptr)
        a.ptr = 0
        store.set("freed", b"1")
        return "freed"
    p = C.sim_ipc_open(0, store.get("h"))
    view = (ctypes.c_float * 4).from_address(C.sim_host_view(p))
    before = view[0]
    store.set("opened", b"1")
    store.wait(["freed"])
    view[0] = 2.0  # a late write into freed memory: must fault, not land
    return ("wrote", before)


def test_sim_freed_memory_faults_in_a_process_that_still_maps_it():
    results = run_ranks(2, unmapped_body, allow_failures=True, timeout=60)
    assert results[0] == "freed"
    assert results[1] is None, results[1]  # killed by the fault (SIGBUS)
