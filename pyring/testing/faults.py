"""Fault scenarios shared by tests/ and bench/faults.py: each runs on every rank under
pyring.launch.run_ranks, and a checker says what its results got wrong."""

from __future__ import annotations

import os
import tempfile
import time

import torch

import pyring
from pyring.runtime import devices as _devices
from pyring.tools import device_fault as _device_fault


def stuck_rank(rank: int, world: int, store, transport: str, timeout_s: float,
               sleep_s: float) -> dict:
    """Collectives #1 (40 B) and #2 (4 MiB) together, then the last rank sleeps `sleep_s` in
    user code before #3 while the others wait out their deadline. Returns this rank's error
    (kind, message, seconds waited in the failing call) and its stderr."""
    log = tempfile.TemporaryFile(mode="w+")
    os.dup2(log.fileno(), 2)
    comm = pyring.init(rank=rank, world_size=world, store=store, set_default=False,
                       timeout=timeout_s, transport=transport)
    comm.all_reduce(torch.ones(10))  # #1
    comm.all_reduce(torch.ones(1 << 20))  # #2: 4 MiB
    if rank == world - 1:
        time.sleep(sleep_s)
    error = None
    # The sleeper may still complete #3 over tcp, whose small exchange found the others' data in
    # its sockets before they gave up; then its next call fails with their cause.
    for _ in range(2):
        start = time.monotonic()
        try:
            comm.all_reduce(torch.ones(10))
        except pyring.CommError as e:
            error = (type(e).__name__, str(e), time.monotonic() - start)
            break
    store.set(f"out/{rank}", "1")
    store.wait([f"out/{r}" for r in range(world)])  # no rank's links close before all have seen
    comm.close()
    log.seek(0)
    return {"error": error, "stderr": log.read()}


def check_stuck_rank(results: list[dict], timeout_s: float, slack_s: float) -> list[str]:
    """What stuck_rank's results got wrong: every rank must name the sleeper as never having
    entered #3 with #2 (4 MiB) its last completed, and no other rank; the waiting ranks must
    raise CommTimeout within timeout_s + slack_s and warn at half the deadline."""
    world = len(results)
    last = world - 1
    want = (f"rank {last} never entered all_reduce #3; its last completed collective is #2 "
            "(all_reduce, 4.0 MiB)")
    bad = []
    for rank, r in enumerate(results):
        if r["error"] is None:
            bad.append(f"rank {rank}: no error")
            continue
        kind, message, waited = r["error"]
        if want not in message:
            bad.append(f"rank {rank}: account missing: {message}")
        if any(f"rank {o} never" in message for o in range(last)):
            bad.append(f"rank {rank}: names a rank that arrived: {message}")
        if rank != last:
            if kind != "CommTimeout":
                bad.append(f"rank {rank}: {kind}, not CommTimeout: {message}")
            if waited > timeout_s + slack_s:
                bad.append(f"rank {rank}: raised after {waited:.2f} s")
            if "half of the deadline" not in r["stderr"]:
                bad.append(f"rank {rank}: no warning at half the deadline")
    return bad


def _sim_buffer(rank: int):
    from pyring.testing import sim

    x = sim.SimArray(1 << 16, torch.float32, 0)
    x.fill_(1.0)
    return x, (_devices.SIM, 0, sim.current_stream(0).id)


def _sim_stall(seconds: float) -> None:
    from pyring.testing import sim

    sim.current_stream(0).launch(lambda: time.sleep(seconds))


_device_fault.register_device("sim", _sim_buffer, _sim_stall)


def device_fault(rank: int, world: int, store, device: str, timeout_s: float,
                 late_s: float = 0.0) -> dict:
    """pyring.tools.device_fault.device_fault, on the sim device too."""
    return _device_fault.device_fault(rank, world, store, device, timeout_s, late_s)


check_device_fault = _device_fault.check_device_fault


_STORE_SERVER = """
import datetime, sys, time
import torch.distributed as dist
s = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False,
                  timeout=datetime.timedelta(seconds=600))
print(s.port, flush=True)
while not s.check(["kill"]):
    time.sleep(0.005)
sys.stdout.flush()
import os, signal
os.kill(os.getpid(), signal.SIGKILL)
"""


class DoomedStore:
    """A TCPStore hosted by a process of its own, which SIGKILLs itself once any client sets
    the key 'kill' (within 5 ms): the store of a rank 0 that dies."""

    def __init__(self) -> None:
        import subprocess
        import sys

        self.proc = subprocess.Popen([sys.executable, "-c", _STORE_SERVER],
                                     stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()


def _await_death(store, deadline_s: float = 10.0) -> float:
    """Sets 'kill' and returns the monotonic time once the store no longer answers."""
    store.set("kill", "1")
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            store.check(["kill"])
        except Exception:
            return time.monotonic()
        time.sleep(0.005)
    raise AssertionError("the store outlived its kill")


def store_dies(rank: int, world: int, store, phase: str, timeout_s: float) -> dict:
    """Run with run_ranks(store=("127.0.0.1", DoomedStore().port, "")). phase 'init': the
    last rank kills the store once the others have entered pyring.init, then calls it itself;
    'new_group': every rank joins torch.distributed with backend 'pyring', and the store dies
    once the others have entered new_group. Returns this rank's error (kind, message) and the
    seconds from the store's death (or, on the other ranks, from the call) to the raise."""
    import datetime

    import torch.distributed as dist

    if phase == "new_group":
        dist.init_process_group("pyring", store=store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
    start = time.monotonic()
    try:
        if rank == world - 1:
            store.wait([f"entering/{r}" for r in range(world - 1)])
            time.sleep(0.3)  # the others are inside the call
            start = _await_death(store)
        else:
            store.set(f"entering/{rank}", "1")
        if phase == "init":
            pyring.init(rank=rank, world_size=world, store=store, set_default=False,
                        timeout=timeout_s)
        else:
            dist.new_group(list(range(world)))
        error = None
    except Exception as e:
        error = (type(e).__name__, str(e))
    return {"error": error, "raised_after_s": time.monotonic() - start}


def check_store_dies(results: list[dict], port: int, timeout_s: float) -> list[str]:
    """Every rank must raise a pyring CommError naming the store's address, within timeout_s."""
    bad = []
    for rank, r in enumerate(results):
        if r["error"] is None:
            bad.append(f"rank {rank}: no error")
            continue
        kind, message = r["error"]
        if kind not in ("CommError", "CommTimeout") or f"127.0.0.1:{port}" not in message:
            bad.append(f"rank {rank}: {kind}: {message}")
        if r["raised_after_s"] > timeout_s:
            bad.append(f"rank {rank}: raised after {r['raised_after_s']:.2f} s")
    return bad
