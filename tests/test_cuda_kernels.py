"""The CUDA kernels (csrc/kernels/*.cu) against torch on the device. They share their element
arithmetic with the CPU kernels (kernels/elementwise.h), which the CPU tests cover; these run
only where a GPU is at hand."""

from __future__ import annotations

import pytest
import torch

import pyring
from pyring import _C

DTYPES = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3,
          torch.int8: 4, torch.uint8: 5, torch.int32: 6, torch.int64: 7}
OPS = {"sum": 0, "avg": 1, "max": 2, "min": 3, "prod": 4}
have_gpu = _C.built_with_cuda() and _C.cuda_device_count() > 0 and torch.cuda.is_available()
gpu = pytest.mark.skipif(not have_gpu, reason="needs a CUDA device and pyring built with CUDA")


def test_without_a_device_the_kernels_raise_cuda_error_naming_the_call():
    if have_gpu:
        pytest.skip("a CUDA device is present")
    with pytest.raises(pyring.CudaError, match="cuda"):
        _C.cuda_reduce_accumulate(DTYPES[torch.float32], OPS["sum"], 0, 0, 0, 10)
    with pytest.raises(ValueError, match="no cast from float32 to int8"):
        _C.cuda_cast(DTYPES[torch.float32], DTYPES[torch.int8], 0, 0, 10)


def _acc_dtype(t):
    return torch.float32 if t in (torch.float16, torch.bfloat16) else t


def _values(dtype, n, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(n, generator=g).to(dtype)
    return torch.randint(-3 if dtype != torch.uint8 else 0, 4, (n,), generator=g).to(dtype)


def _apply(op, x, y):
    return {"sum": torch.add, "avg": torch.add, "prod": torch.mul, "max": torch.maximum,
            "min": torch.minimum}[op](x, y)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("offset", [0, 1])  # 1: misaligned, the scalar path
def test_reduce_matches_torch(dtype, op, offset):
    n, world = 100_003, 3
    a = _values(dtype, n + offset, 1).cuda()[offset:]
    b = _values(_acc_dtype(dtype), n + offset, 2).cuda()[offset:]
    acc = torch.empty_like(b)
    stream = torch.cuda.current_stream().cuda_stream
    _C.cuda_reduce_accumulate(DTYPES[dtype], OPS[op], a.data_ptr(), b.data_ptr(),
                              acc.data_ptr(), n, stream)
    out = torch.empty_like(a)
    _C.cuda_reduce_finish(DTYPES[dtype], OPS[op], a.data_ptr(), b.data_ptr(), out.data_ptr(), n,
                          world, stream)
    torch.cuda.synchronize()
    want_acc = _apply(op, a.to(b.dtype), b)
    assert torch.equal(acc, want_acc)
    want = want_acc.cpu()
    if op == "avg":  # a true division: torch's `tensor / scalar` multiplies by the reciprocal
        div = torch.full_like(want, world)
        want = (torch.div(want, div) if dtype.is_floating_point
                else torch.div(want, div, rounding_mode="trunc"))
    assert torch.equal(out.cpu(), want.to(dtype))


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_wire_casts_match_torch(half):
    x = torch.randn(1_000_001, device="cuda") * 1000
    h = torch.empty(x.numel(), dtype=half, device="cuda")
    _C.cuda_cast(DTYPES[torch.float32], DTYPES[half], x.data_ptr(), h.data_ptr(), x.numel())
    back = torch.empty_like(x)
    _C.cuda_cast(DTYPES[half], DTYPES[torch.float32], h.data_ptr(), back.data_ptr(), x.numel())
    torch.cuda.synchronize()
    assert torch.equal(h, x.to(half)) and torch.equal(back, h.float())


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 31, 33, 4096, 1_000_003])
@pytest.mark.parametrize("offset", [0, 3])  # 3: misaligned buffers (the kernel's scalar path)
def test_onebit_matches_the_cpu_kernel(n, offset):
    x = torch.randn(n)
    x[::5] = 0.0
    res = (torch.randn(n) * 0.1).to(torch.bfloat16)  # a kept residual
    res[::5] = 0.0
    pending = 0.25
    cpu_out = torch.empty(_C.onebit_max_bytes(n), dtype=torch.uint8)
    cpu_res, cpu_pending = res.clone(), torch.full((1,), pending)
    cpu_bytes = _C.onebit_encode_deferred(x.data_ptr(), cpu_res.data_ptr(), cpu_pending.data_ptr(),
                                          n, cpu_out.data_ptr())
    dx = torch.full((n + offset,), float("nan"), device="cuda")[offset:]
    dres = torch.zeros(n + offset, dtype=torch.bfloat16, device="cuda")[offset:]
    dx.copy_(x)
    dres.copy_(res)
    # The segment starts 2 * offset bytes in: its header may sit at any even offset.
    out = torch.full((_C.onebit_max_bytes(n) + 2 * offset,), 0xA5, dtype=torch.uint8,
                     device="cuda")[2 * offset:]
    ws = torch.empty(_C.cuda_onebit_workspace_bytes(), dtype=torch.uint8, device="cuda")
    nbytes, scale, zeros, count = _C.cuda_onebit_encode(dx.data_ptr(), dres.data_ptr(), pending,
                                                        n, out.data_ptr(), ws.data_ptr())
    assert nbytes == cpu_bytes and count == n and zeros == 1
    # The header, signs, mask and the kept residual bit for bit; the scale to rounding (another
    # summation order).
    head = out[:16].cpu()
    assert head[4:16].tolist() == cpu_out[4:16].tolist()
    assert head[:4].view(torch.float32).item() == scale
    assert torch.equal(out[16:nbytes].cpu(), cpu_out[16:nbytes])
    assert torch.equal(dres.cpu().view(torch.int16), cpu_res.view(torch.int16))
    assert abs(scale - cpu_pending.item()) <= 1e-5 * scale
    dec = torch.full((n + offset,), 1.0, device="cuda")[offset:]
    _C.cuda_onebit_decode(scale, zeros, count, out.data_ptr(), n, 0.5, True, dec.data_ptr())
    want = torch.full((n,), 1.0)
    _C.onebit_decode(cpu_out.data_ptr(), n, 0.5, True, want.data_ptr())
    torch.testing.assert_close(dec.cpu(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(pyring.CommError, match="mask caches are host-only"):
        _C.cuda_onebit_decode(scale, 2, count, out.data_ptr(), n, 1.0, False, dec.data_ptr())
