"""A bounded libFuzzer run over the native parsers (tests/fuzz/fuzz_parsers.cc) under
AddressSanitizer, LeakSanitizer and UndefinedBehaviorSanitizer: 0 crashes, 0 hangs, 0 leaks.

PYRING_FUZZ_RUNS sets the number of inputs (default 100,000; bench/soak.py's figures use
more). Skips where clang++ with libFuzzer is absent (.ci/run installs it)."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from pyring.testing.native_fuzz import Unavailable, build, seeds

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_native_parsers_survive_fuzzing(tmp_path):
    try:
        exe = build(str(tmp_path), ROOT)
    except Unavailable as e:
        pytest.skip(str(e))
    runs = int(os.environ.get("PYRING_FUZZ_RUNS", "100000"))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name, data in seeds().items():
        (corpus / name).write_bytes(data)
    proc = subprocess.run([exe, f"-runs={runs}", "-timeout=5", "-rss_limit_mb=2048", "-seed=1",
                           "-detect_leaks=1", str(corpus)], capture_output=True, text=True,
                          timeout=900, cwd=tmp_path,
                          env=dict(os.environ, ASAN_OPTIONS="detect_leaks=1"))
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert "LeakSanitizer" not in proc.stderr, proc.stderr[-6000:]
    done = re.search(r"Done (\d+) runs", proc.stderr)
    assert done and int(done.group(1)) >= runs, proc.stderr[-2000:]
