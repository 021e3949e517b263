"""The collectives' kernel interface (csrc/kernels/dispatch.h) on the sim device against the
host: every kernel, dtype and op gives the same bits when queued on a delayed sim stream as
when run on the host. On a GPU the same comparison runs against the CUDA kernels."""

from __future__ import annotations

import pytest
import torch
from cases import DTYPES, OPS

from pyring import _C
from pyring.testing import sim

CODE = {d: _C.DTYPE_NAMES.index(str(d).removeprefix("torch.")) for d in DTYPES}
OP = {o: _C.OP_NAMES.index(o) for o in OPS}
SIM = _C.DEVICE_KIND_NAMES.index("sim")
N = 1000


def _acc(dtype):
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _values(dtype, seed, n=N):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return (torch.randn(n, generator=g) * 4).round().to(dtype)
    lo = 0 if dtype == torch.uint8 else -3
    return torch.randint(lo, 4, (n,), generator=g).to(dtype)


def _host(name, dtype, op, a, b, out_dtype, world=3, to=0):
    out = torch.zeros(N, dtype=out_dtype)
    _C.run_kernel(name, None, CODE[dtype], OP[op], a.data_ptr(), b.data_ptr(), out.data_ptr(), N,
                  world, to)
    return out


def _on_sim(name, dtype, op, a, b, out_dtype, world=3, to=0):
    s = sim.current_stream(0)
    da, db = sim.SimArray.from_tensor(a), sim.SimArray.from_tensor(b)
    out = sim.SimArray(N, out_dtype).fill_(0)
    _C.run_kernel(name, (SIM, 0, s.id), CODE[dtype], OP[op], da.ptr, db.ptr, out.ptr, N, world,
                  to)
    return out.to_host()


@pytest.fixture(autouse=True)
def _delayed():
    sim.set_delay_us(50)
    yield
    sim.set_delay_us(0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reduce_kernels_match_the_host(dtype):
    a, b = _values(dtype, 1), _values(_acc(dtype), 2)
    for op in OPS:
        for name, out_dtype in (("accumulate", _acc(dtype)), ("finish", dtype)):
            want = _host(name, dtype, op, a, b, out_dtype)
            assert torch.equal(_on_sim(name, dtype, op, a, b, out_dtype), want), (name, op)
        want = _host("finish_wide", dtype, op, b, b, dtype)
        assert torch.equal(_on_sim("finish_wide", dtype, op, b, b, dtype), want), op
    want = _host("widen", dtype, "sum", a, a, _acc(dtype))
    assert torch.equal(_on_sim("widen", dtype, "sum", a, a, _acc(dtype)), want)
    assert torch.equal(_on_sim("finish_single", dtype, "avg", a, a, dtype), a)


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16], ids=str)
def test_wire_casts_match_the_host(half):
    x = torch.randn(N) * 1000
    down = _host("cast", torch.float32, "sum", x, x, half, to=CODE[half])
    assert torch.equal(down, x.to(half))  # round to nearest even, as torch
    assert torch.equal(_on_sim("cast", torch.float32, "sum", x, x, half, to=CODE[half]), down)
    up = _on_sim("cast", half, "sum", down, down, torch.float32, to=CODE[torch.float32])
    assert torch.equal(up, down.to(torch.float32))


def test_unknown_kernel_is_refused():
    x = torch.zeros(N)
    with pytest.raises(ValueError, match="unknown kernel 'nope'"):
        _C.run_kernel("nope", None, 0, 0, x.data_ptr(), x.data_ptr(), x.data_ptr(), N)


have_gpu = _C.built_with_cuda() and _C.cuda_device_count() > 0 and torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not have_gpu, reason="needs a CUDA device and pyring built with CUDA")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_kernels_through_the_interface_match_the_host(dtype):
    cuda = (_C.DEVICE_KIND_NAMES.index("cuda"), 0, torch.cuda.current_stream().cuda_stream)
    a, b = _values(dtype, 1), _values(_acc(dtype), 2)
    for op in OPS:
        for name, x, out_dtype in (("accumulate", a, _acc(dtype)), ("finish", a, dtype),
                                   ("finish_wide", b, dtype)):
            want = _host(name, dtype, op, x, b, out_dtype)
            dx, db = x.cuda(), b.cuda()
            out = torch.zeros(N, dtype=out_dtype, device="cuda")
            _C.run_kernel(name, cuda, CODE[dtype], OP[op], dx.data_ptr(), db.data_ptr(),
                          out.data_ptr(), N, 3)
            assert torch.equal(out.cpu(), want), (name, op)
