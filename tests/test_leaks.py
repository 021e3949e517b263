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
