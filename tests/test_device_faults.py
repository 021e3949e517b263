"""A device that faults (CUDA's sticky errors) fails the collectives waiting on it at once, on
every rank, naming the fault: not a timeout at the deadline. Run on the sim device, whose
errors are sticky as CUDA's."""

from __future__ import annotations

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
    from pyring import _C, _devices
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
