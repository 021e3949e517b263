"""One-bit kernel micro-benchmarks with pytest-benchmark, beside memcpy, on one core.

    pip install pytest-benchmark
    pytest bench/test_kernels_bench.py --benchmark-json bench/results/kernels_pytest_vm.json

Each case processes 4 MiB (cache-resident) and 64 MiB (memory-bound) of float32 in segments of
256 KiB (one scale per segment, as on
the wire) and records its rate in ``extra_info["gbps"]`` (GB/s of float32 input). Not part
of the test suite (pyproject's testpaths is tests/).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from pyring import _C

pytest.importorskip("pytest_benchmark")

SEG = (256 << 10) // 4


@pytest.fixture(scope="module", autouse=True)
def one_core():
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {sorted(before)[0]})
    yield
    os.sched_setaffinity(0, before)


@pytest.fixture(scope="module", params=[4, 64], ids=lambda m: f"{m}MiB")
def data(request):
    n = (request.param << 20) // 4
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n).astype(np.float32)
    enc = np.empty(n // SEG * _C.onebit_max_bytes(SEG), dtype=np.uint8)
    return x, np.zeros(n, dtype=np.float32), enc, np.empty_like(x)


def _rate(benchmark, fn, x):
    benchmark.pedantic(fn, rounds=15, warmup_rounds=2)
    benchmark.extra_info["gbps"] = x.nbytes / benchmark.stats.stats.min / 1e9


def _encode(x, residual, enc):
    step = _C.onebit_max_bytes(SEG)
    for s in range(x.size // SEG):
        r = residual.ctypes.data + s * SEG * 4 if residual is not None else 0
        _C.onebit_encode(x.ctypes.data + s * SEG * 4, r, SEG, enc.ctypes.data + s * step)


def test_memcpy(benchmark, data):
    x, _, _, out = data
    _rate(benchmark, lambda: np.copyto(out, x), x)


def test_pack(benchmark, data):
    """Scale and sign pack, no error feedback."""
    x, _, enc, _ = data
    _rate(benchmark, lambda: _encode(x, None, enc), x)


def test_fused_residual(benchmark, data):
    """Residual add, scale, sign pack and new residual in one pass per block."""
    x, residual, enc, _ = data
    _rate(benchmark, lambda: _encode(x, residual, enc), x)


def test_unpack(benchmark, data):
    """Decode with accumulate (the owner's sum)."""
    x, _, enc, out = data
    _encode(x, None, enc)
    step = _C.onebit_max_bytes(SEG)

    def decode():
        for s in range(x.size // SEG):
            _C.onebit_decode(enc.ctypes.data + s * step, SEG, 0.5, True,
                             out.ctypes.data + s * SEG * 4)

    _rate(benchmark, decode, x)
