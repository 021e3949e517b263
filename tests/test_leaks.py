"""A short run of bench/leaks.py: 200 communicators created and destroyed in each of 2 ranks,
over shm and over tcp, leave memory, descriptors, threads and /dev/shm where they were after
the warm-up (its targets; the 1000-communicator figures are in bench/results/leaks_*.json)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_communicators_created_and_destroyed_leave_nothing(transport, tmp_path):
    out = tmp_path / "leaks.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "leaks.py"), "--count", "200",
                           "--warmup", "20", "--transport", transport, "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["passed"] and doc["shm_left_after_job"] == 0
    for rank in doc["ranks"]:
        assert rank["results_right"]
        # No growth; the warm-up's count may still hold a thread that was ending.
        assert rank["end"]["threads"] <= rank["after_warmup"]["threads"]
        assert rank["end"]["fds"] == rank["after_warmup"]["fds"]


def init_massacre_body(rank, world, store, device):
    import os
    import signal
    import threading
    import time

    import pyring

    store.set(f"init-massacre-pid{rank}", str(os.getpid()))
    if rank == 0:
        pids = [int(store.get(f"init-massacre-pid{r}")) for r in range(world)]

        def kill_all() -> None:
            time.sleep(1.5)
            for pid in pids[1:] + pids[:1]:  # this rank last
                os.kill(pid, signal.SIGKILL)

        threading.Thread(target=kill_all, daemon=True).start()
    while True:  # most of the time inside init, between making the segments and releasing them
        pyring.init(rank, world, store, set_default=False, timeout=60, device=device).close()


@pytest.mark.parametrize("device", [None, "sim:0"])
def test_every_rank_killed_inside_init_leaves_nothing_in_dev_shm(device):
    """No survivor cleans up here: the shm transport's segments and the device links' control
    pages must never have had a name. (Named ones, unlinked once every peer had attached, left
    the names of the init in flight.)"""
    import os

    from pyring.launch import run_ranks

    before = set(os.listdir("/dev/shm"))
    results = run_ranks(3, init_massacre_body, device, timeout=60, allow_failures=True)
    assert results == [None] * 3, results  # every rank died by the signal
    left = {n for n in set(os.listdir("/dev/shm")) - before if n.startswith("pyring-")}
    assert not left, sorted(left)
