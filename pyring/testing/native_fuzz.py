"""The native fuzzer over the parsers (tests/fuzz/fuzz_parsers.cc, in a source tree) under
AddressSanitizer and UndefinedBehaviorSanitizer: its build and seed inputs, shared by
tests/test_fuzz_native.py and bench/soak.py."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess

SOURCES = ["tests/fuzz/fuzz_parsers.cc", "csrc/collectives/header.cc", "csrc/core/types.cc",
           "csrc/core/errors.cc", "csrc/core/topology.cc", "csrc/kernels/onebit.cc",
           "csrc/kernels/onebit_avx2.cc", "csrc/kernels/onebit_blocks.cc", "csrc/kernels/simd.cc",
           "csrc/transport/tcp/tcp_handshake.cc", "csrc/transport/tcp/hmac_sha256.cc"]
FLAGS = ["-std=c++17", "-O1", "-g", "-fsanitize=fuzzer,address,undefined",
         "-fno-sanitize-recover=undefined"]


class Unavailable(RuntimeError):
    """This machine cannot build the fuzzer (no clang++, or no libFuzzer runtime)."""


def build(out_dir: str, root: str) -> str:
    """The fuzzer built from the source tree at `root` into out_dir; raises Unavailable where
    it cannot be built here, RuntimeError when the build fails."""
    clang = shutil.which("clang++")
    if clang is None:
        raise Unavailable("clang++ not found: the native fuzzer needs clang with libFuzzer")
    exe = os.path.join(out_dir, "fuzz_parsers")
    proc = subprocess.run([clang, *FLAGS, "-I", os.path.join(root, "csrc"),
                           *(os.path.join(root, s) for s in SOURCES), "-o", exe],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 and "fuzzer" in proc.stderr and "cannot find" in proc.stderr:
        raise Unavailable("clang++ has no libFuzzer runtime")
    if proc.returncode != 0:
        raise RuntimeError(f"the native fuzzer did not build:\n{proc.stderr[-4000:]}")
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
