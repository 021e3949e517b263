"""The sim device refuses what CUDA refuses and waits where CUDA waits, so that code that
passes on the sim does not fail on a GPU for one of these: an IPC handle opened by the process
that exported it, the same allocation opened twice (one mapping, counted), a flag outside
mapped pinned memory, host code reading a device address (it faults), a copy to pageable memory
(holds the host), the legacy default stream (waits for, and is waited on by, blocking streams).
pyring's own code passes under all of them:
the sim suites (test_sim_streams, test_cuda_ipc, test_sim_matrix, ...) run on this sim."""

from __future__ import annotations

import ctypes
import time

import numpy as np
import pytest
import torch

from pyring.launch import run_ranks


def own_handle_body(rank, world, store):
    import pyring
    import pyring._C as C
    from pyring.testing import sim

    a = sim.SimArray(256, torch.float32, 0)
    with pytest.raises(pyring.CudaError, match="cudaErrorInvalidContext"):
        C.sim_ipc_open(0, C.sim_ipc_handle(0, a.ptr))
    return True


def test_a_handle_does_not_open_in_the_process_that_exported_it():
    assert run_ranks(1, own_handle_body, timeout=60) == [True]


def twice_body(rank, world, store):
    import pyring._C as C
    from pyring.testing import sim

    if rank == 0:
        a = sim.SimArray(256, torch.int32, 0)
        a.copy_(torch.arange(256, dtype=torch.int32)).to_host()
        store.set("h", C.sim_ipc_handle(0, a.ptr))
        store.wait(["done"])
        return None
    h = store.get("h")
    p, q = C.sim_ipc_open(0, h), C.sim_ipc_open(0, h)
    mappings = [C.sim_ipc_mappings()]
    C.sim_ipc_close(0, p)
    mappings.append(C.sim_ipc_mappings())
    # Still mapped: opened twice, closed once.
    value = (ctypes.c_int32 * 4).from_address(C.sim_host_view(q))[3]
    C.sim_ipc_close(0, q)
    mappings.append(C.sim_ipc_mappings())
    store.set("done", b"1")
    return p == q, mappings, value


def test_the_same_allocation_opened_twice_maps_once_until_closed_twice():
    same, mappings, value = run_ranks(2, twice_body, timeout=60)[1]
    assert same and mappings == [1, 1, 0] and value == 3


def host_read_body(rank, world, store, what):
    from pyring.testing import sim

    a = sim.SimArray(1024, torch.float32, 0)
    a.fill_(3.0)
    through_view = a.to_host()[0].item()  # the streams' view: readable
    if what == "view":
        return through_view
    return (ctypes.c_float * 1).from_address(a.ptr)[0]  # the device address itself: faults


def test_host_code_reading_device_memory_faults():
    assert run_ranks(1, host_read_body, "view", timeout=60) == [3.0]
    assert run_ranks(1, host_read_body, "address", allow_failures=True, timeout=60) == [None]


def flag_body(rank, world, store):
    import pyring
    import pyring._C as C

    word = np.zeros(1, np.uint64)
    with pytest.raises(pyring.CudaError, match="not in mapped pinned memory"):
        C.sim_write_flag(0, 0, word.ctypes.data, 1)
    return True


def test_a_flag_outside_mapped_pinned_memory_is_refused():
    assert run_ranks(1, flag_body, timeout=60) == [True]


def pageable_body(rank, world, store):
    import pyring._C as C
    from pyring.testing import sim

    s = sim.SimStream(0)
    a = sim.SimArray(1024, torch.float32, 0)
    other = sim.SimArray(1024, torch.float32, 0)
    host = np.zeros(1024, np.float32)
    took = {}
    for name, dst in (("device", other.ptr), ("pageable", host.ctypes.data)):
        s.launch(lambda: time.sleep(0.3))
        start = time.monotonic()
        C.sim_copy(0, dst, a.ptr, a.nbytes, s.id)
        took[name] = time.monotonic() - start
        s.synchronize()
    s.close()
    return took


def test_a_copy_to_pageable_memory_holds_the_host_until_it_is_done():
    took = run_ranks(1, pageable_body, timeout=60)[0]
    assert took["device"] < 0.15 and took["pageable"] >= 0.25, took


def legacy_body(rank, world, store):
    from pyring.testing import sim

    order = {}
    legacy = sim.SimStream(0, id=0)
    for kind in ("blocking", "non-blocking"):
        s = sim.SimStream(0, blocking=kind == "blocking")
        seen = []
        s.launch(lambda seen=seen: (time.sleep(0.3), seen.append("stream")))
        legacy.launch(lambda seen=seen: seen.append("legacy"))
        s.launch(lambda seen=seen: seen.append("stream after"))
        legacy.synchronize()
        s.synchronize()
        s.close()
        order[kind] = seen
    return order


def test_the_legacy_default_stream_waits_for_and_is_waited_on_by_blocking_streams():
    order = run_ranks(1, legacy_body, timeout=60)[0]
    assert order["blocking"] == ["stream", "legacy", "stream after"], order
    assert order["non-blocking"][0] == "legacy", order
