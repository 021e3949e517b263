"""examples/train.py --mode ps: the main job on a parameter server (1 server, 2 workers), end
to end: it finishes, the workers pushed every step, and the training loss fell, with each pull
waited for and with each overlapped."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("overlap_pull", [False, True])
def test_the_main_job_runs_on_a_parameter_server(tmp_path, overlap_pull):
    out = tmp_path / "ps.json"
    res = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train.py"), "--mode", "ps", "--servers", "1",
         "--ranks", "3", "--steps", "30", "--dim", "64", "--layers", "2", "--data-mb", "1",
         "--val-batches", "4", "--device", "cpu", "--wire", "bf16", "--json", str(out),
         "--time-limit", "200"] + (["--overlap-pull"] if overlap_pull else []),
        capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "'pushes_sent': 30" in res.stdout, res.stdout[-2000:]
    summary = json.loads(out.read_text())
    assert summary["mode"] == "ps" and summary["world"] == 3
    assert summary["overlap_pull"] is overlap_pull
    assert summary["train_loss_last"] < summary["train_loss_first"], summary
