"""A short run of bench/soak.py: 4 ranks of random verified collectives for 15 s, the API
fuzz, and kill trials in which every survivor must raise in time and leave nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_short_soak_and_kill_trials(tmp_path):
    out = tmp_path / "soak.json"
    cmd = [sys.executable, os.path.join(ROOT, "bench", "soak.py"), "--minutes", "0.25",
           "--trials", "6", "--fuzz-calls", "100", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["soak"]["calls"] > 100 and res["soak"]["wrong_elements"] == 0
    assert res["kill_trials"]["passed"] == 6
    assert res["fuzz"]["calls"] == 100 and not res["fuzz"]["failures"]
