"""A bounded libFuzzer run over the native parsers (tests/fuzz/fuzz_parsers.cc) under
AddressSanitizer and UndefinedBehaviorSanitizer: 0 crashes and 0 hangs.

PYRING_FUZZ_RUNS sets the number of inputs (default 100,000; bench/soak.py's figures use
more). Skips where clang++ with libFuzzer is absent (.ci/run installs it)."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ["tests/fuzz/fuzz_parsers.cc", "csrc/collectives/header.cc", "csrc/core/types.cc",
           "csrc/core/errors.cc", "csrc/core/topology.cc", "csrc/kernels/onebit.cc",
           "csrc/kernels/onebit_avx2.cc",
           "csrc/transport/tcp/tcp_handshake.cc", "csrc/transport/tcp/hmac_sha256.cc"]
FLAGS = ["-std=c++17", "-O1", "-g", "-fsanitize=fuzzer,address,undefined",
         "-fno-sanitize-recover=undefined", "-I", os.path.join(ROOT, "csrc")]


def build(out_dir: str) -> str:
    clang = shutil.which("clang++")
    if clang is None:
        pytest.skip("clang++ not found: the native fuzzer needs clang with libFuzzer")
    exe = os.path.join(out_dir, "fuzz_parsers")
    proc = subprocess.run([clang, *FLAGS, *(os.path.join(ROOT, s) for s in SOURCES), "-o", exe],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 and "fuzzer" in proc.stderr and "cannot find" in proc.stderr:
        pytest.skip("clang++ has no libFuzzer runtime")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return exe


def seeds() -> dict[str, bytes]:
    """One well-formed input per parser (the first byte picks it), for the fuzzer to mutate."""
    mask = bytes([0xA5]) * 8
    return {
        "header": b"\0" + struct.pack("<IIQQBBHi", 0x50524831, 0, 7, 64, 0, 0, 0, -1),
        "challenge": b"\1" + struct.pack("<II32s", 0x50524743, 2, bytes(32)),
        "hello": b"\1" + struct.pack("<IiiI32s32s", 0x50524748, 0, 1, 0, bytes(32), bytes(32)),
        "topology": b"\2" + bytes([4, 2, 2, 2, 0, 1, 2, 2, 3, 1, 1, 4, 0, 1, 2, 3]),
        "onebit": b"\3" + struct.pack("<HfIII", 64, 1.0, 1, 0, 64) + mask + mask,
    }


def test_native_parsers_survive_fuzzing(tmp_path):
    exe = build(str(tmp_path))
    runs = int(os.environ.get("PYRING_FUZZ_RUNS", "100000"))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name, data in seeds().items():
        (corpus / name).write_bytes(data)
    proc = subprocess.run([exe, f"-runs={runs}", "-timeout=5", "-rss_limit_mb=2048", "-seed=1",
                           str(corpus)], capture_output=True, text=True, timeout=900,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-6000:]
    done = re.search(r"Done (\d+) runs", proc.stderr)
    assert done and int(done.group(1)) >= runs, proc.stderr[-2000:]
