"""The host's float32 <-> float16 wire casts (csrc/kernels/wire_cast.cc: eight lanes at a time
with AVX2 where the CPU has it, the scalar form of kernels/half.h otherwise and for the last
lanes) against torch's conversions: every float16, and a dense sample of float32 with every
boundary of the rounding (subnormal halves, ties, overflow to infinity, NaN)."""

from __future__ import annotations

import pytest
import torch

from pyring import _C

CODE = {d: _C.DTYPE_NAMES.index(str(d).removeprefix("torch.")) for d in
        (torch.float32, torch.float16)}
SUM = _C.OP_NAMES.index("sum")


def _cast(x: torch.Tensor, to: torch.dtype) -> torch.Tensor:
    out = torch.empty(x.numel(), dtype=to)
    _C.run_kernel("cast", None, CODE[x.dtype], SUM, x.data_ptr(), x.data_ptr(), out.data_ptr(),
                  x.numel(), 1, CODE[to])
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32).to(torch.int64) & (
        (1 << (8 * t.element_size())) - 1)


@pytest.mark.parametrize("start", [0, 1, 3])  # aligned and not; tails of 0, 7 and 5 lanes
def test_every_float16_widens_as_torch(start):
    h = torch.arange(0, 1 << 16, dtype=torch.int64).to(torch.int16).view(torch.float16)[start:]
    got = _cast(h, torch.float32)
    nan = torch.isnan(h)
    assert torch.equal(_bits(got[~nan]), _bits(h[~nan].float()))
    # NaN keeps its sign and payload, moved up by 13 bits, not quieted.
    b = _bits(h)
    want = ((b & 0x8000) << 16) | 0x7f800000 | ((b & 0x3ff) << 13)
    assert torch.equal(_bits(got)[nan], want[nan])


def _float32_sample() -> torch.Tensor:
    parts = [torch.arange(0, 1 << 32, 251, dtype=torch.int64)]
    for edge in (0x38800000, 0x477ff000, 0x7f800000, 0x33000000, 0x33800000, 0):
        parts.append(torch.arange(max(0, edge - 8192), edge + 8192, dtype=torch.int64))
    u = torch.cat(parts)
    u = torch.cat([u, u | (1 << 31)])  # both signs
    f = u.to(torch.int32).view(torch.float32)
    ties = (torch.arange(0, 4096, dtype=torch.float32) + 0.5) * 2.0 ** -24  # subnormal ties
    return torch.cat([f, ties, -ties])


@pytest.mark.parametrize("start", [0, 5])
def test_float32_narrows_as_torch(start):
    f = _float32_sample()[start:]
    got = _cast(f, torch.float16)
    nan = torch.isnan(f)
    assert torch.equal(_bits(got[~nan]), _bits(f[~nan].to(torch.float16)))
    # NaN becomes the quiet NaN 0x7e00 with the input's sign.
    want = ((_bits(f) >> 16) & 0x8000) | 0x7e00
    assert torch.equal(_bits(got)[nan], want[nan])


def test_the_scalar_forms_pass_the_same_checks(tmp_path):
    # PYRING_SIMD=sse: every lane through kernels/half.h's scalar conversions, which the CUDA
    # kernels share. Out of the source tree, as the package is installed.
    import os
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.abspath(__file__),
         "-k", "not scalar_forms"],
        env={**os.environ, "PYRING_SIMD": "sse"}, capture_output=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stdout.decode()[-3000:] + out.stderr.decode()[-2000:]
    assert b"5 passed" in out.stdout, out.stdout.decode()[-1000:]
