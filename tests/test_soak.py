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


def _chaos():
    import importlib.util

    spec = importlib.util.spec_from_file_location("_chaos", os.path.join(ROOT, "bench",
                                                                         "_chaos.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _ev(t, rank, event, restart=0, **kw):
    return {"t": t, "rank": rank, "restart": restart, "event": event, **kw}


def _recovered(t, kind="CommTimeout", skip=(), untyped=()):
    """Every rank raises at t and runs again after it, but those in skip."""
    out = []
    for r in range(4):
        if r in skip:
            continue
        extra = {"untyped": True} if r in untyped else {}
        out += [_ev(t, r, "error", gen=0, type=kind, msg="x", **extra),
                _ev(t + 1, r, "progress", gen=1, calls=20)]
    return out


def test_the_chaos_judge_fails_each_kind_of_bad_ending():
    """bench/_chaos.py's judge, on planted event logs: a fault passes only when every rank
    raised a typed error within its bound and ran again, or the group restarted."""
    chaos = _chaos()
    fault = {"id": 0, "kind": "stop", "rank": 1, "restart": 0, "t": 100.0}

    def judged(events, faults=(fault,)):
        return chaos.judge(list(faults), sorted(events, key=lambda e: e["t"]), 4, 2.0, 90.0)

    good = judged(_recovered(102.0))
    assert good["ok"] and good["faults_ok"] == 1 and good["rows"][0]["outcome"] == "typed"
    assert not judged(_recovered(102.0, skip=(2,)))["ok"]  # rank 2 never raised
    assert not judged(_recovered(102.0, untyped=(3,)))["ok"]  # a RuntimeError is no answer
    assert not judged(_recovered(100.0 + 2 * 2.0 + 5))["ok"]  # past the bound
    assert not judged(_recovered(102.0) + [_ev(103, 0, "wrong", call=5, elements=1)])["ok"]
    kill = dict(fault, kind="kill")
    restarted = [_ev(104, r, "progress", restart=1, gen=0, calls=20) for r in range(4)]
    assert judged(restarted, [kill])["ok"]
    assert not judged(restarted[:3], [kill])["ok"]  # the restart did not come back whole
    close = dict(fault, kind="close")
    assert judged(_recovered(102.0) + [_ev(101, 1, "closed", during_callback=True)],
                  [close])["ok"]
    assert not judged(_recovered(102.0) + [_ev(101, 1, "closed", during_callback=False)],
                      [close])["ok"]
    leak = [_ev(95 + g, 0, "gen", gen=g, fds=6 + (g == 3), rss=1000, shm=0) for g in range(4)]
    assert not judged(_recovered(102.0) + leak)["ok"]  # an fd more after 3 communicators
