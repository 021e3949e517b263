"""The planner (csrc/collectives/placement.h) decides where a collective's device buffers are
worked on, and says why at PYRING_DEBUG=INFO: on the buffers themselves over cuda_ipc links
(resident), or staged through pinned host memory where no device link carries the device or
the algorithm runs on the host. The bindings hold no such decision (checked by reading them)."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import torch
from test_sim_matrix import _dev

from pyring.launch import run_ranks

BINDINGS = Path(__file__).resolve().parents[1] / "csrc" / "bindings"
# A branch on where device buffers go, or a place named at all: the device's kind, the device
# links, a placement helper, a placement or a body for one (collectives/call_bodies.h holds
# them; the bindings hand them to run_plan whole).
PLACEMENT_BRANCH = re.compile(r"if \(!?\w+\.device\.is_cpu\(\)|resident_on\(|stays_on_device"
                              r"|Placement::|[Rr]esident|[Ss]taged")


def placement_body(rank, world, store, refuse):
    import pyring
    from pyring.testing.sim import SimArray

    if refuse and rank == 1:
        os.environ["PYRING_SIM_IPC"] = "refuse"
    dev = _dev(rank)
    with tempfile.TemporaryFile() as f:  # the core logs to stderr
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        try:
            with pyring.init(rank, world, store, set_default=False, device=f"sim:{dev}") as comm:
                x = SimArray.from_tensor(torch.ones(1024), dev)
                comm.all_reduce(x)
                comm.all_reduce(x, algo="direct")
                out = SimArray.from_tensor(torch.zeros(1024 * world), dev)
                comm.all_gather_into_tensor(out, x)
                part = SimArray.from_tensor(torch.zeros(1024 // world), dev)
                comm.reduce_scatter_tensor(part, x)
                comm.broadcast(x, src=0)
                ok = torch.equal(x.to_host(), torch.full((1024,), float(world * world)))
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        log = f.read().decode()
    return ok, [m for m in log.splitlines() if ": resident (" in m or ": staged (" in m]


def _lines(refuse):
    results = run_ranks(2, placement_body, refuse, env={"PYRING_DEBUG": "INFO"}, timeout=120)
    assert all(ok for ok, _ in results), "a collective got a wrong result"
    return results[0][1]


def test_device_links_place_the_ring_on_the_device_and_the_host_algorithms_staged():
    lines = _lines(refuse=False)
    for name in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
        assert any(m.endswith(f"{name}: resident (sim:0: the device ring)") for m in lines), lines
    assert any(m.endswith("all_reduce: staged (sim:0: the direct algorithm runs on the host)")
               for m in lines), lines


def test_without_device_links_every_collective_is_staged_saying_why():
    lines = _lines(refuse=True)
    why = "no device link of this communicator carries the device"
    for name in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
        assert any(m.endswith(f"{name}: staged (sim:0: {why})") for m in lines), lines
    assert not any(": resident (" in m for m in lines), lines


def test_the_bindings_hold_no_placement_branch():
    sources = sorted(BINDINGS.glob("*.cc"))
    assert len(sources) > 5
    found = [f"{p.name}: {m.group(0)}" for p in sources
             for m in PLACEMENT_BRANCH.finditer(p.read_text())]
    assert found == []
    assert PLACEMENT_BRANCH.search("if (!da.device.is_cpu()) {")  # the pattern finds one
    assert PLACEMENT_BRANCH.search("if (where == Placement::kStaged) {")
