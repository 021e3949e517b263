"""The compressed allreduce is one asynchronous collective of the core: an async call returns
before its peers have even arrived, one call makes one collective (one flight-recorder entry,
exact tail included), the DDP hooks hand back pending futures, several buckets can be in
flight at once, and CUDA-free device buffers (the sim device) take the same path."""

from __future__ import annotations

import time

import pytest
import torch

import pyring
from pyring.launch import run_ranks
from pyring.optim.compression import GradientExchange, all_reduce_wire


def _pending(rank, world, store):
    comm = pyring.init(rank=rank, world_size=world, store=store, set_default=False)
    out = {}
    for wire in ("bf16", "onebit"):
        state = pyring.OneBitState() if wire == "onebit" else None
        comm.barrier()
        x = torch.full((100_003,), float(rank + 1))
        before = len(comm.debug_dump())
        if rank == 1:
            time.sleep(0.5)  # rank 0's call must return without waiting for this rank
        t0 = time.perf_counter()
        w = all_reduce_wire(comm, x, "sum", wire, state, async_op=True)
        returned = time.perf_counter() - t0
        pending = not w.is_completed()
        assert w.wait()
        fut_value = w.get_future().wait()
        entries = comm.debug_dump()[before:]
        out[wire] = (returned, pending, float(x[0]), fut_value is x,
                     [(e["kind"], e["state"]) for e in entries])
    # Several buckets in flight at once, each with an exact tail, completing in order.
    ex = GradientExchange("onebit")
    bufs = [torch.full((5000 + k,), float(rank + k)) for k in range(4)]
    for b in bufs:
        b[-2:] = torch.tensor([float(rank), 1.0])
    works = [ex.average(comm, b, k, exact_tail=2) for k, b in enumerate(bufs)]
    for w in works:
        w.wait()
    out["tails"] = [b[-2:].tolist() for b in bufs]
    # out= of another shape with the same count, as the fp32 allreduce takes it.
    shaped = []
    for shape, out_shape in (((2, 3), (6,)), ((0, 0), (0,))):
        t = torch.full(shape, float(rank + 1))
        o = torch.empty(out_shape)
        comm.all_reduce(t, op="sum", out=o, wire="fp16")
        shaped.append((o.tolist(), t.reshape(-1).tolist()))
    out["shaped"] = shaped
    comm.close()
    return out


def test_async_wire_is_one_pending_collective():
    results = run_ranks(2, _pending, timeout=120)
    for rank, res in enumerate(results):
        assert res["shaped"] == [([3.0] * 6, [rank + 1.0] * 6), ([], [])], res["shaped"]
    for wire in ("bf16", "onebit"):
        returned, pending, value, same, entries = results[0][wire]
        assert returned < 0.25 and pending, (wire, returned, pending)
        assert value == 3.0 or wire == "onebit", (wire, value)
        assert same
        assert entries == [("all_reduce", "completed")], entries
    for rank in range(2):
        assert results[rank]["tails"] == [[0.5, 1.0]] * 4, results[rank]["tails"]


def _hook_futures(rank, world, store):
    from pyring import hooks

    comm = pyring.init(rank=rank, world_size=world, store=store, set_default=False)

    class Bucket:
        def __init__(self, buf, index):
            self._buf, self._index = buf, index

        def buffer(self):
            return self._buf

        def index(self):
            return self._index

    state = hooks.OneBitHookState(comm)
    out = []
    for k, hook in enumerate((hooks.fp16_compress_hook, hooks.bf16_compress_hook)):
        comm.barrier()
        if rank == 1:
            time.sleep(0.3)
        fut = hook(comm, Bucket(torch.full((4096,), float(rank + 1)), k))
        out.append((hook.__name__, fut.done(), fut.wait().tolist()[:2]))
    comm.barrier()
    if rank == 1:
        time.sleep(0.3)
    fut = hooks.onebit_hook(state, Bucket(torch.full((4096,), float(rank + 1)), 7))
    out.append(("onebit", fut.done(), fut.wait().tolist()[:2]))
    comm.close()
    return out


def test_hooks_return_pending_futures():
    for name, done, value in run_ranks(2, _hook_futures, timeout=120)[0]:
        assert not done, f"{name} returned a completed future: it blocked backward"
        assert value == [1.5, 1.5], (name, value)


def _sim(rank, world, store):
    from pyring.testing.sim import SimArray

    comm = pyring.init(rank=rank, world_size=world, store=store, set_default=False)
    x = SimArray.from_tensor(torch.full((3001,), float(rank + 1)), 0)
    w = comm.all_reduce(x, op="sum", wire="bf16", async_op=True)
    w.wait()  # orders the current stream; the host goes on
    got = x.to_host()[:3].tolist()
    comm.close()
    return got


def test_device_buffers_take_the_same_collective():
    for got in run_ranks(2, _sim, env={"PYRING_SIM_DELAY_US": "200"}, timeout=120):
        assert got == [3.0, 3.0, 3.0], got


def _segments(rank, world, store):
    comm = pyring.init(rank=rank, world_size=world, store=store, set_default=False)
    n = world * 1_200_001  # chunks of two segments (codec_flat.h), the last one short
    base = torch.arange(n) % 7
    out = {}
    for wire in ("bf16", "fp16"):
        x = (base + rank).to(torch.float32)
        comm.all_reduce(x, op="sum", wire=wire)
        want = (base * world + sum(range(world))).to(torch.float32)
        out[wire] = int((x != want).sum())
    comm.close()
    return out


def test_half_wires_pipelined_by_segment_are_exact():
    for got in run_ranks(3, _segments, timeout=300):
        assert got == {"bf16": 0, "fp16": 0}, got


def _segments_tcp(rank, world, store):
    from half_sums import half_sum_errors

    comm = pyring.init(rank=rank, world_size=world, store=store, set_default=False)
    links = {comm.transport(p) for p in range(world) if p != rank}
    assert links == {"tcp"}, links
    # Chunks of 4 fine segments (the last one short), of one, and uneven chunks of 40 segments
    # capped at 16; with a short final call.
    out = half_sum_errors(comm, (world * 100_003 + 2, world * 1000 + 1, world * 1_310_720 + 5, 7))
    comm.close()
    return out


def test_half_wires_over_the_network_are_pipelined_finely_and_exact():
    from pyring import _C

    shm = 4.9e9
    tcp = 1e9
    # A 1 MiB DDP bucket at 2 ranks: one segment per chunk over shared memory, 5 over tcp.
    assert _C._codec_segments(131_584, shm) == 1
    assert _C._codec_segments(131_584, tcp) == 5
    assert _C._codec_segments(3 << 20, shm) == 3
    assert _C._codec_segments(3 << 20, tcp) == 16  # capped
    assert _C._codec_segments(1, tcp) == 1 and _C._codec_segments(0, tcp) == 1
    for got in run_ranks(3, _segments_tcp, env={"PYRING_TRANSPORT": "tcp"}, timeout=300):
        assert set(got.values()) == {0}, got


def _split(n: int, parts: int) -> list[tuple[int, int]]:
    base, extra = divmod(n, parts)
    out, off = [], 0
    for j in range(parts):
        size = base + (1 if j < extra else 0)
        out.append((off, size))
        off += size
    return out


def _onebit_reference(inputs: list, world: int):
    """The first call's result, segment by segment, from the host kernels (zero kept
    residuals, no exact zeros: no masks): chunk j's owner starts from its own values exact,
    divided by the world, and adds the others' decoded copies in rank order."""
    import numpy as np

    from pyring import _C

    def code(v):
        buf = np.zeros(_C.onebit_max_bytes(v.size), np.uint8)
        kept, pending = np.zeros(v.size, np.uint16), np.zeros(1, np.float32)
        _C.onebit_encode_deferred(v.ctypes.data, kept.ctypes.data, pending.ctypes.data, v.size,
                                  buf.ctypes.data, 0)
        return buf

    def into(buf, out, alpha, acc):
        _C.onebit_decode(buf.ctypes.data, out.size, alpha, acc, out.ctypes.data, 0)

    n = inputs[0].size
    chunks = _split(n, world)
    segments = max(1, -(-chunks[0][1] // (1 << 20)))
    out = np.zeros(n, np.float32)
    for owner, (off, size) in enumerate(chunks):
        for soff, ssize in _split(size, segments):
            lo = off + soff
            acc = inputs[owner][lo:lo + ssize] / np.float32(world)
            for i, x in enumerate(inputs):
                if i != owner:
                    into(code(np.ascontiguousarray(x[lo:lo + ssize])), acc, 1.0 / world, True)
            part = np.zeros(ssize, np.float32)
            into(code(acc), part, 1.0, False)
            out[lo:lo + ssize] = part
    return out


def _onebit_segments(rank, world, store):
    comm = pyring.init(rank=rank, world_size=world, store=store, set_default=False)
    n = world * 1_200_001 + 1  # two segments per chunk, uneven chunks and segments
    inputs = [torch.randn(n, generator=torch.Generator().manual_seed(r)).numpy()
              for r in range(world)]
    x = torch.from_numpy(inputs[rank].copy())
    comm.all_reduce(x, op="avg", wire="onebit", state=pyring.OneBitState())
    comm.close()
    return int((x.numpy() != _onebit_reference(inputs, world)).sum())


@pytest.mark.parametrize("simd", ["avx2", "sse"])
def test_onebit_pipelined_by_segment_matches_the_kernels(simd):
    # avx2: the owner's sum in registers where the CPU has AVX2; sse: through a block buffer.
    assert run_ranks(3, _onebit_segments, env={"PYRING_SIMD": simd},
                     timeout=300) == [0, 0, 0]


def _read_between_calls(rank, world, store):
    # The host keeps onebit residuals deferred (kernels/onebit.h): reading the state gives them
    # settled, and changes nothing of the calls that follow.
    comm = pyring.init(rank=rank, world_size=world, store=store, set_default=False)
    n = world * 1_100_000 + 3  # two segments per chunk
    read, quiet = pyring.OneBitState(), pyring.OneBitState()
    diffs, settled = [], []
    for step in range(4):
        x = torch.randn(n, generator=torch.Generator().manual_seed(10 * step + rank))
        x[::7] = 0.0
        a, b = x.clone(), x.clone()
        comm.all_reduce(a, op="avg", wire="onebit", state=read)
        first = read.state_dict()
        again = read.state_dict()
        settled.append(all(torch.equal(first[k], again[k]) for k in first))
        comm.all_reduce(b, op="avg", wire="onebit", state=quiet)
        diffs.append(int((a != b).sum()))
    comm.close()
    return diffs, settled


def test_reading_a_onebit_state_changes_no_later_call():
    for diffs, settled in run_ranks(2, _read_between_calls, timeout=300):
        assert diffs == [0, 0, 0, 0] and all(settled), (diffs, settled)


def _half_reference(inputs: list, world: int, dtype, avg: bool):
    """The 16-bit wires' result: chunk j's owner adds, in float32, its own values exact and the
    others' rounded copies in rank order, divides once for avg, and rounds the sum."""
    out = torch.empty_like(inputs[0])
    for owner, (off, size) in enumerate(_split(inputs[0].numel(), world)):
        s = inputs[owner][off:off + size].clone()
        for i, x in enumerate(inputs):
            if i != owner:
                s = x[off:off + size].to(dtype).float() + s
        if avg:
            s = s / world
        out[off:off + size] = s.to(dtype).float()
    return out


def _half_wires(rank, world, store):
    comm = pyring.init(rank=rank, world_size=world, store=store, set_default=False)
    n = world * 100_001 + 2  # uneven chunks
    inputs = [torch.randn(n, generator=torch.Generator().manual_seed(r)) for r in range(world)]
    wrong = {}
    for wire, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        for op in ("sum", "avg"):
            x = inputs[rank].clone()
            comm.all_reduce(x, op=op, wire=wire)
            want = _half_reference(inputs, world, dtype, op == "avg")
            wrong[f"{wire}/{op}"] = int((x != want).sum())
    comm.close()
    return wrong


def test_half_wires_add_the_owners_chunk_exact():
    for got in run_ranks(3, _half_wires, timeout=300):
        assert set(got.values()) == {0}, got
