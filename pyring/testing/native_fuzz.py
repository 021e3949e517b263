"""The native fuzzer over the parsers (tests/fuzz/fuzz_parsers.cc, in a source tree) under
AddressSanitizer and UndefinedBehaviorSanitizer: its build and seed inputs, shared by
tests/test_fuzz_native.py and bench/soak.py; and the compile step of the sanitized native
programs (compile_sources, also used by tests/test_native_lifetimes.py)."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess

SOURCES = ["tests/fuzz/fuzz_parsers.cc", "csrc/collectives/header.cc", "csrc/core/types.cc",
           "csrc/core/errors.cc", "csrc/core/topology.cc", "csrc/kernels/onebit.cc",
           "csrc/kernels/onebit_avx2.cc", "csrc/kernels/onebit_blocks.cc", "csrc/kernels/simd.cc",
           "csrc/transport/tcp/tcp_handshake.cc", "csrc/transport/tcp/hmac_sha256.cc",
           # A header names its wire from the codec registry, whose codecs carry their kernels
           # (on the host, and on devices through the device layer: the sim and the CUDA stub).
           "csrc/codecs/registry.cc", "csrc/codecs/builtin.cc", "csrc/codecs/int8/int8.cc",
           "csrc/kernels/wire_cast.cc", "csrc/kernels/dispatch.cc", "csrc/kernels/reduce.cc",
           "csrc/kernels/host_grid.cc", "csrc/device/device.cc",
           "csrc/device/cuda/cuda_runtime_stub.cc", "csrc/device/sim/sim_arena.cc",
           "csrc/device/sim/sim_runtime.cc", "csrc/device/sim/sim_stream.cc"]
FLAGS = ["-std=c++17", "-O1", "-g", "-fsanitize=fuzzer,address,undefined",
         "-fno-sanitize-recover=undefined"]


class Unavailable(RuntimeError):
    """This machine cannot build a sanitized native program (no compiler, or no runtime)."""


def compile_sources(out: str, root: str, sources: list[str], flags: list[str],
                    compilers: tuple[str, ...], runtime: str) -> str:
    """`sources` (paths in the tree at `root`) compiled with `flags` by the first of
    `compilers` on PATH into the program `out`; returns `out`. Raises Unavailable where none
    is found, or where the linker cannot find the `runtime` library the flags ask for; else
    RuntimeError when the build fails."""
    cxx = next((path for c in compilers if c and (path := shutil.which(c))), None)
    if cxx is None:
        raise Unavailable(f"no {' or '.join(c for c in compilers if c)} found")
    proc = subprocess.run([cxx, *flags, "-I", os.path.join(root, "csrc"),
                           *(os.path.join(root, s) for s in sources), "-o", out],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 and runtime in proc.stderr and "cannot find" in proc.stderr:
        raise Unavailable(f"{cxx} has no {runtime} runtime: {proc.stderr[-300:]}")
    if proc.returncode != 0:
        raise RuntimeError(f"{out} did not build:\n{proc.stderr[-4000:]}")
    return out


def build(out_dir: str, root: str) -> str:
    """The fuzzer built from the source tree at `root` into out_dir; raises Unavailable where
    it cannot be built here (no clang++, or no libFuzzer runtime), RuntimeError when the build
    fails."""
    return compile_sources(os.path.join(out_dir, "fuzz_parsers"), root, SOURCES, FLAGS,
                           ("clang++",), "fuzzer")


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
