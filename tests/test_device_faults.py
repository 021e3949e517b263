"""A device that faults (CUDA's sticky errors) fails the collectives waiting on it at once, on
every rank, naming the fault: not a timeout at the deadline; what the device path refuses (no
stream memory operations, graph capture) it refuses at once with a message saying what to do.
Run on the sim device, whose errors are sticky as CUDA's."""

from __future__ import annotations

import time

import pytest
import torch

from pyring.launch import run_ranks
from pyring.testing import faults

TIMEOUT_S = 30.0  # the deadline; the fault must be reported long before it
LIMIT_S = 2.0


@pytest.mark.parametrize("late_s", [0.0, 0.3], ids=["faulted-before", "faults-while-waiting"])
def test_planted_fault_raises_on_both_ranks_within_two_seconds(late_s):
    results = run_ranks(2, faults.device_fault, "sim", TIMEOUT_S, late_s, timeout=120)
    bad = faults.check_device_fault(results, LIMIT_S)
    assert not bad, "\n".join(bad)
    assert "sim:0" in results[0]["error"][1]


def sticky_body(rank, world, store):
    import pyring
    from pyring import _C
    from pyring.runtime import devices as _devices
    from pyring.testing import sim

    a, b = sim.SimStream(1), sim.SimStream(1)
    ran = []
    a.launch(lambda: ran.append("before"))
    a.synchronize()
    _C.launch_out_of_bounds(_devices.SIM, 1, a.id)
    errors = []
    for s in (a, b):
        try:
            s.synchronize()
        except pyring.CudaError as e:
            errors.append(str(e))
    try:
        b.launch(lambda: ran.append("after"))
    except pyring.CudaError as e:
        errors.append(str(e))
    return ran, errors


def test_sim_errors_are_sticky():
    """After a fault every stream of the device stops and reports it, and queueing more work
    raises CudaError naming it, as CUDA's calls return a sticky error."""
    ran, errors = run_ranks(1, sticky_body, timeout=60)[0]
    assert ran == ["before"]
    assert len(errors) == 3 and all("cudaErrorIllegalAddress" in e for e in errors), errors


@pytest.mark.gpu
@pytest.mark.parametrize("late_s", [0.0, 0.3], ids=["faulted-before", "faults-while-waiting"])
def test_planted_fault_on_a_gpu(late_s):
    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        pytest.skip("needs a CUDA device")
    results = run_ranks(2, faults.device_fault, "cuda", TIMEOUT_S, late_s, timeout=120)
    bad = faults.check_device_fault(results, LIMIT_S)
    assert not bad, "\n".join(bad)


def no_memops_body(rank, world, store):
    import pyring
    from pyring.testing import sim

    out = {}
    try:
        comm = pyring.init(rank, world, store, set_default=False, timeout=30)
    except pyring.CudaError as e:
        return {"init": str(e)}
    with comm:
        t = torch.full((1000,), float(rank))
        comm.all_reduce(t)
        out["host"] = t[0].item()
        x = sim.SimArray(1000, torch.float32, 0)
        start = time.monotonic()
        try:
            comm.all_reduce(x)
        except pyring.CudaError as e:
            out["device"] = (str(e), time.monotonic() - start)
    return out


def test_a_device_without_stream_memory_operations_is_refused_with_advice():
    """A driver that disables stream memory operations (PYRING_SIM_STREAM_MEMOPS=off) fails
    the first device collective at once with a message saying what to do; host tensors work."""
    results = run_ranks(2, no_memops_body, env={"PYRING_SIM_STREAM_MEMOPS": "off"}, timeout=120)
    for rank, r in enumerate(results):
        assert r.get("host") == 1.0, (rank, r)
        message, waited = r["device"]
        assert "NVreg_EnableStreamMemOPs=1" in message and "sim:0" in message, message
        assert waited < LIMIT_S, (rank, waited)


def capture_body(rank, world, store):
    import pyring
    from pyring import _C
    from pyring.testing import sim

    with pyring.init(rank, world, store, set_default=False, timeout=30) as comm:
        s = sim.SimStream(0)
        x = sim.SimArray(1000, torch.float32, 0)
        x.fill_(1.0)
        _C.sim_set_capturing(0, s.id, True)
        error = None
        with sim.stream(s):
            try:
                comm.all_reduce(x)
            except pyring.Error as e:
                error = (type(e).__name__, str(e))
            _C.sim_set_capturing(0, s.id, False)
            comm.all_reduce(x)  # outside the capture the communicator still works
        s.synchronize()  # the collective ran on s: read its result once s has finished
        got = x.to_host()[0].item()
        s.close()
    return error, got


def test_a_collective_on_a_capturing_stream_is_refused_naming_the_stream():
    for error, got in run_ranks(2, capture_body, timeout=120):
        assert error is not None and error[0] == "Error", error
        assert "is capturing a graph" in error[1] and "sim:0" in error[1], error
        assert got == 2.0
