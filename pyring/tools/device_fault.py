"""The device-fault scenario, shared by the self-check and tests/test_device_faults.py: each rank
runs it under pyring.launch.run_ranks, and check_device_fault says what its results got wrong.
Devices: "cuda" here; pyring.testing.faults adds the test-only "sim" device
(register_device)."""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

import pyring
from pyring import _C
from pyring.runtime import devices as _devices


def _cuda_buffer(rank: int) -> tuple[Any, tuple[int, int, int]]:
    index = rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    x = torch.ones(1 << 16, device=f"cuda:{index}")
    return x, (_devices.CUDA, index, torch.cuda.current_stream(index).cuda_stream)


def _cuda_stall(seconds: float) -> None:
    torch.cuda._sleep(int(seconds * 2e9))  # cycles, at about 2 GHz


# device -> (buffer(rank): a buffer of 64 Ki float32 ones and the planting arguments (kind
# code, index, current stream) of launch_out_of_bounds for it; stall(seconds): queues on the
# current stream work that takes about that long on the device).
_DEVICES: dict[str, tuple[Callable[[int], Any], Callable[[float], None]]] = {
    "cuda": (_cuda_buffer, _cuda_stall)}


def register_device(name: str, buffer: Callable[[int], Any],
                    stall: Callable[[float], None]) -> None:
    """Makes device_fault run on device ``name`` (see _DEVICES for the two callables)."""
    _DEVICES[name] = (buffer, stall)


def device_fault(rank: int, world: int, store, device: str, timeout_s: float,
                 late_s: float = 0.0) -> dict:
    """After one good all_reduce of a device buffer, rank 0 plants an illegal-address fault on
    its current stream (a kernel that writes out of bounds) and every rank calls all_reduce
    again. With late_s, the fault runs that long after the call has queued its work (the host
    waits on a flag when it lands), else at once (the call meets a device already faulted).
    Returns this rank's error (kind, message, seconds in the failing call). The device of rank 0
    is unusable in its process afterwards."""
    if device not in _DEVICES:
        raise ValueError(f"device_fault: device {device!r} is not one of {sorted(_DEVICES)}")
    buffer, stall = _DEVICES[device]
    comm = pyring.init(rank=rank, world_size=world, store=store, set_default=False,
                       timeout=timeout_s)
    x, (kind, index, stream) = buffer(rank)
    comm.all_reduce(x)
    store.set(f"warm/{rank}", "1")
    store.wait([f"warm/{r}" for r in range(world)])
    if rank == 0:
        if late_s > 0:
            stall(late_s)
        _C.launch_out_of_bounds(kind, index, stream)
    error = None
    for _ in range(2):  # a fault that lands after the first call fails the next one
        start = time.monotonic()
        try:
            comm.all_reduce(x)
        except pyring.CommError as e:
            error = (type(e).__name__, str(e), time.monotonic() - start)
            break
    store.set(f"out/{rank}", "1")
    store.wait([f"out/{r}" for r in range(world)])
    try:
        comm.close()
    except pyring.Error:
        pass  # closing over a faulted device may report the fault again
    return {"error": error}


def check_device_fault(results: list[dict], limit_s: float) -> list[str]:
    """What device_fault's results got wrong: every rank raises a CommError (not a timeout)
    naming the illegal address within limit_s."""
    bad = []
    for rank, r in enumerate(results):
        if r["error"] is None:
            bad.append(f"rank {rank}: no error")
            continue
        kind, message, waited = r["error"]
        if kind != "CommError":
            bad.append(f"rank {rank}: {kind}, not CommError: {message}")
        if "cudaErrorIllegalAddress" not in message:
            bad.append(f"rank {rank}: the fault is not named: {message}")
        if waited > limit_s:
            bad.append(f"rank {rank}: raised after {waited:.2f} s (limit {limit_s} s)")
    return bad
