"""The sim device's kernels are the CUDA kernels' own bodies (kernels/reduce_functors.h,
kernels/onebit_functors.h) run over an emulated grid (kernels/host_grid.cc): the same grid,
stride and vector-or-scalar choice as the CUDA launch. Here they run over aligned and
misaligned buffers, counts with and without a tail, every dtype and op the CUDA kernels take,
and give the host kernels' bits (the one-bit encoder's scale to its rounding: see the last
test), leaving the bytes around each buffer untouched. A wrong index,
stride or vector layout in a kernel body (cuda_cast once read and wrote past the buffer's end
with vectors padded to 16 bytes) fails here, without a GPU."""

from __future__ import annotations

import pytest
import torch
from cases import DTYPES, OPS

import pyring
from pyring import _C
from pyring.launch import run_ranks
from pyring.optim.compression import all_reduce_wire
from pyring.testing import sim

CODE = {d: _C.DTYPE_NAMES.index(str(d).removeprefix("torch.")) for d in DTYPES}
OP = {o: _C.OP_NAMES.index(o) for o in OPS}
SIM = _C.DEVICE_KIND_NAMES.index("sim")
GUARD = 64  # bytes of canary before and after every buffer
CANARY = 0xA5
COUNTS = (0, 1, 7, 33, 1001, 70_001)  # 70_001: many blocks, and a tail after the vectors
CASTS = ((torch.float32, torch.float16), (torch.float32, torch.bfloat16),
         (torch.float16, torch.float32), (torch.bfloat16, torch.float32))


def _size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _offsets(*dtypes: torch.dtype) -> list[tuple[int, ...]]:
    """Byte offsets of a kernel's buffers from 16-byte boundaries: all aligned (the vector
    path), all aligned past the first vector, one element each, and only the last one."""
    one = tuple(_size(d) for d in dtypes)
    last = (0,) * (len(dtypes) - 1) + (one[-1],)
    return [(0,) * len(dtypes), (16,) * len(dtypes), one, last]


def _values(dtype: torch.dtype, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        x = torch.randn(n, generator=g) * 100
        x[::13] = 0.0
        return x.to(dtype)
    lo = 0 if dtype == torch.uint8 else -3
    return torch.randint(lo, 4, (n,), generator=g).to(dtype)


class Placed:
    """n values of `dtype` in sim device memory, `offset` bytes past a 16-byte boundary, with
    GUARD canary bytes on each side; its operations queue on the current stream."""

    def __init__(self, n: int, dtype: torch.dtype, offset: int, values: torch.Tensor | None = None):
        self.n, self.dtype, self.offset = n, dtype, offset
        self.nbytes = n * _size(dtype)
        self.start = GUARD + offset
        self.mem = sim.SimArray(self.start + self.nbytes + GUARD, torch.uint8)
        assert self.mem.ptr % 16 == 0
        self.ptr = self.mem.ptr + self.start
        self.mem.fill_(CANARY)
        if values is not None:
            self.write(values)

    def write(self, values: torch.Tensor) -> None:
        raw = values.contiguous().view(torch.uint8).clone()
        start = self.start
        self.mem.apply_(lambda m: m[start:start + raw.numel()].copy_(raw))

    def raw(self, what: object = "") -> torch.Tensor:
        """The value bytes, after checking that the guards still hold the canary (`what` names
        the case in the failure)."""
        mem = self.mem.to_host()
        before, after = mem[:self.start], mem[self.start + self.nbytes:]
        assert bool((before == CANARY).all()), f"{what}: a kernel wrote before its buffer"
        assert bool((after == CANARY).all()), f"{what}: a kernel wrote past its buffer's end"
        return mem[self.start:self.start + self.nbytes]

    @property
    def __sim_array_interface__(self) -> dict:
        typestr = torch.empty((), dtype=self.dtype).numpy().dtype.str
        return {"shape": (self.n,), "typestr": typestr, "data": (self.ptr, False),
                "strides": None, "version": 3, "device": self.mem.device,
                "stream": sim.current_stream(self.mem.device).id}


def _host(name: str, dtype, op: str, a, b, out_dtype, n: int, world: int = 3, to: int = 0):
    out = torch.zeros(n, dtype=out_dtype)
    _C.run_kernel(name, None, CODE[dtype], OP[op], a.data_ptr(), b.data_ptr(), out.data_ptr(), n,
                  world, to)
    return out.view(torch.uint8)


def _run_on_sim(name: str, dtype, op: str, a: Placed, b: Placed, out: Placed, n: int,
                world: int = 3, to: int = 0) -> torch.Tensor:
    s = sim.current_stream(0)
    _C.run_kernel(name, (SIM, 0, s.id), CODE[dtype], OP[op], a.ptr, b.ptr, out.ptr, n, world, to)
    return out.raw((name, str(dtype), op, n, (a.offset, b.offset, out.offset)))


def _check_counts(name, dtype, op, a, b, out_dtype, offsets, to=0):
    """`name` over every count of COUNTS at `offsets`, against the host on the same inputs."""
    top = max(COUNTS)
    pa = Placed(top, a.dtype, offsets[0], a)
    pb = Placed(top, b.dtype, offsets[1], b)
    want = _host(name, dtype, op, a, b, out_dtype, top, to=to)
    for n in COUNTS:
        out = Placed(n, out_dtype, offsets[2])
        got = _run_on_sim(name, dtype, op, pa, pb, out, n, to=to)
        assert torch.equal(got, want[:n * _size(out_dtype)]), (name, str(dtype), op, n, offsets)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reduce_kernels_give_the_host_bits(dtype):
    a, b = _values(dtype, max(COUNTS), 1), _values(_acc(dtype), max(COUNTS), 2)
    for op in OPS:
        for offsets in _offsets(dtype, _acc(dtype), _acc(dtype)):
            _check_counts("accumulate", dtype, op, a, b, _acc(dtype), offsets)
        for offsets in _offsets(dtype, _acc(dtype), dtype):
            _check_counts("finish", dtype, op, a, b, dtype, offsets)
        for offsets in _offsets(_acc(dtype), _acc(dtype), dtype):
            _check_counts("finish_wide", dtype, op, b, b, dtype, offsets)


@pytest.mark.parametrize("pair", CASTS, ids=lambda p: f"{p[0]}->{p[1]}")
def test_wire_casts_give_the_host_bits(pair):
    src, dst = pair
    x = torch.randn(max(COUNTS)) * 1000
    x[:8] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-8, -6e-5,
                          65520.0, 3e38])  # NaN, infinities, signed zero, subnormals, overflow
    x = x.to(src)
    for offsets in _offsets(src, src, dst):
        _check_counts("cast", src, "sum", x, x, dst, offsets, to=CODE[dst])


def test_a_second_lap_of_the_grid_stride_loop():
    # More elements than threads in the largest grid (65535 blocks of 256), misaligned: every
    # thread takes a second element.
    n = 65535 * 256 + 1001
    a, b = _values(torch.int8, n, 3), _values(torch.int8, n, 4)
    pa, pb = Placed(n, torch.int8, 1, a), Placed(n, torch.int8, 1, b)
    out = Placed(n, torch.int8, 1)
    got = _run_on_sim("accumulate", torch.int8, "sum", pa, pb, out, n)
    assert torch.equal(got, _host("accumulate", torch.int8, "sum", a, b, torch.int8, n))


def _onebit_inputs(rank: int, n: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(n, generator=g)
    x[::97] = 0.0  # exact zeros: the segments carry their masks
    return x


def _close(host: torch.Tensor, dev: torch.Tensor, rtol: float) -> bool:
    """Whether dev is host to `rtol` of host's largest magnitude."""
    return bool(((dev - host).abs() <= rtol * host.abs().max()).all())


def _states_agree(host: dict, dev: dict) -> bool:
    """One-bit states to the scale's rounding: masks exact, scales to 1e-5, and each kept
    residual (bfloat16) to one rounding of a value that moved with the scale."""
    for key, a in host.items():
        b = dev[key]
        if a is None or b is None or a.numel() == 0:
            if not (a is b or a.shape == b.shape):
                return False
        elif a.dtype == torch.bfloat16:
            a, b = a.float(), b.float()
            if not torch.allclose(a, b, rtol=2**-7, atol=1e-5 * float(a.abs().max())):
                return False
        elif a.is_floating_point():
            if not torch.allclose(a, b, rtol=1e-5, atol=0):
                return False
        elif not torch.equal(a, b):
            return False
    return True


def _onebit_on_both(rank, world, store):
    """The one-bit all_reduce (the sim's onebit_encode and onebit_decode, and finish_wide) on
    host tensors and on sim buffers at each float offset from a 16-byte boundary, each step from
    the host's state (the same residuals and pending scales: the kept residual's paths run, and
    the scales' rounding does not compound); returns the cases whose results or states
    differ."""
    comm = pyring.init(rank=rank, world_size=world, store=store, set_default=False)
    wrong = []
    for n in (1, 7, 1001, 50_003):
        for offset in (0, 1, 2, 3):
            for op in ("sum", "avg"):
                host_state = pyring.OneBitState()
                for step in range(3):
                    sim_state = pyring.OneBitState()
                    if step:
                        sim_state.load_state_dict(host_state.state_dict())
                    x = _onebit_inputs(rank, n, step)
                    host = x.clone()
                    all_reduce_wire(comm, host, op, "onebit", host_state)
                    dev = Placed(n, torch.float32, 4 * offset, x)
                    all_reduce_wire(comm, dev, op, "onebit", sim_state)
                    got = dev.raw((n, offset, op, step)).view(torch.float32)
                    if not _close(host, got, 1e-5):
                        wrong.append((n, offset, op, step))
                    if not _states_agree(host_state.state_dict(), sim_state.state_dict()):
                        wrong.append((n, offset, op, step, "state"))
    comm.close()
    return wrong


def test_onebit_kernels_agree_with_the_host_at_every_offset():
    # The CUDA encoder sums the squares in float64 per thread, then per warp and per block
    # (kernels/onebit_functors.h); the host's in float32 lanes per block. So the scales agree to
    # rounding, not bit for bit, and the values decoded with them to 1e-5 of the largest; a
    # wrong index, stride or vector access is off by the scale itself.
    for world in (2, 3):
        assert run_ranks(world, _onebit_on_both, timeout=300) == [[]] * world
