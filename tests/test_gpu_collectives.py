"""The CUDA path on a real GPU: collectives on CUDA tensors (several ranks on one GPU), stream
semantics, the array-interface and DLPack edges, the torch backend with DDP, the drop-in
optimizer, the hooks and OneBitAdam against their CPU results. Skipped without a GPU; the sim
device runs the same code paths in CI (tests/test_sim_*.py)."""

from __future__ import annotations

import pytest
import torch
from device_training import training_body

from pyring import _C
from pyring.launch import run_ranks

have_gpu = _C.built_with_cuda() and _C.cuda_device_count() > 0 and torch.cuda.is_available()
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not have_gpu, reason="needs a CUDA device and pyring built "
                                 "with CUDA")]


def collectives_body(rank, world, store, bound):
    """bound: the rank is bound to cuda:0 at init, so the ring runs on the device over cuda_ipc;
    else device buffers are staged through pinned host memory."""
    import pyring

    dev = torch.device("cuda", 0)
    bad = []
    # A stuck collective raises in 60 s, naming itself, before the ranks' 120 s run out.
    with pyring.init(rank, world, store, set_default=False, timeout=60,
                     device="cuda:0" if bound else None) as comm:
        if comm._c.device_transport != ("cuda_ipc" if bound else None):
            bad.append(f"device transport {comm._c.device_transport}")
        s = torch.cuda.Stream(dev)
        with torch.cuda.stream(s):
            for n in (0, 1, 1001, (1 << 20) + 3):
                x = torch.full((n,), float(rank + 1), device=dev)
                torch.cuda._sleep(1_000_000)  # the fill is late: the collective must wait
                x.add_(1)
                comm.all_reduce(x)
                y = x * 1  # queued after: must see the result
                want = float(sum(r + 2 for r in range(world)))
                if n and not bool((y == want).all()):
                    bad.append(f"sync n={n}: {y[:3].tolist()}")
                w = comm.all_reduce(x, async_op=True)
                w.wait()
                if n and not bool((x == want * world).all()):
                    bad.append(f"async n={n}: {x[:3].tolist()}")
            out = torch.empty(world * 5, device=dev)
            comm.all_gather_into_tensor(out, torch.full((5,), float(rank), device=dev))
            if out.cpu().tolist() != [float(r) for r in range(world) for _ in range(5)]:
                bad.append(f"all_gather: {out.tolist()}")
            b = torch.full((7,), float(rank), device=dev)
            comm.broadcast(b, src=world - 1)
            if b.cpu().tolist() != [float(world - 1)] * 7:
                bad.append(f"broadcast: {b.tolist()}")
            for dt in (torch.float32, torch.bfloat16):
                rs = torch.empty(1000, device=dev, dtype=dt)
                src = (torch.arange(world * 1000, device=dev) % 7 + rank).to(dt)
                comm.reduce_scatter_tensor(rs, src)
                want = (torch.arange(rank * 1000, (rank + 1) * 1000) % 7 * world
                        + sum(range(world))).to(dt)
                if not torch.equal(rs.cpu(), want):
                    bad.append(f"reduce_scatter {dt}: {rs[:3].tolist()}")
            try:
                comm.all_reduce(torch.zeros(3, device=dev), out=torch.zeros(3))
                bad.append("mixed devices accepted")
            except ValueError as e:
                if "cuda:0" not in str(e) or "cpu" not in str(e):
                    bad.append(f"mixed devices message: {e}")
            dl = torch.full((9,), 1.0, device=dev)
            comm.all_reduce(torch.utils.dlpack.to_dlpack(dl))
            if dl.cpu().tolist() != [float(world)] * 9:
                bad.append(f"dlpack: {dl.tolist()}")
        s.synchronize()
        moved = sum(v["bytes_sent"] for v in comm.stats()["device_links"].values())
        if bound and moved == 0:
            bad.append("no byte went over the device links")
    return bad


@pytest.mark.parametrize("bound", [True, False], ids=["cuda_ipc", "staged"])
@pytest.mark.parametrize("world", [2, 4])
def test_collectives_on_one_gpu(world, bound):
    for rank, bad in enumerate(run_ranks(world, collectives_body, bound, timeout=120)):
        assert not bad, f"rank {rank}: {bad}"


def growth_body(rank, world, store, bound):
    """Collectives of growing sizes, each awaited with work.wait() before it has run, then the
    device synchronized (as DDP's copies to the host do), so that pyring outgrows its staging
    memory (staged) or its device scratch (bfloat16 on the device ring) and launches its
    kernels for the first time around a waiting stream. On an H200 a stream made to wait for
    results not yet queued hung the first collective on the device ring (cuda_ipc), and
    freeing outgrown staging hung DDP (cudaFreeHost synchronizes the device); the sim runs the
    same test (tests/test_sim_streams.py)."""
    import pyring

    dev = torch.device("cuda", 0)
    bad = []
    with pyring.init(rank, world, store, set_default=False, timeout=30,
                     device="cuda:0" if bound else None) as comm:
        for k in range(6):
            for dtype in (torch.float32, torch.bfloat16):
                x = torch.full((1000 * 4**k + k,), float(rank + k), device=dev, dtype=dtype)
                comm.all_reduce(x, async_op=True).wait()
                torch.cuda.synchronize(dev)
                want = float(sum(r + k for r in range(world)))
                if not bool((x.float() == want).all()):
                    bad.append(f"size #{k} {dtype}: {x[:3].tolist()} want {want}")
    return bad


@pytest.mark.parametrize("bound", [True, False], ids=["cuda_ipc", "staged"])
def test_growing_collectives_under_a_waiting_stream(bound):
    assert run_ranks(2, growth_body, bound, timeout=60) == [[], []]


def capture_elsewhere_body(rank, world, store):
    """Collectives of growing sizes (pyring's threads allocate staging and scratch, launch
    kernels for the first time and query the caller's stream) while another thread holds a
    graph capture open in torch's default, global mode, which forbids those calls on every
    thread not relaxed: the collectives are right, and the capture succeeds."""
    import threading

    import pyring

    dev = torch.device("cuda", 0)
    mine, side = torch.cuda.Stream(dev), torch.cuda.Stream(dev)
    # Everything this thread allocates or reads on the host is done outside the capture.
    xs = [torch.full((1000 * 4**k + k,), float(rank + k), device=dev, dtype=dt)
          for k in range(6) for dt in (torch.float32, torch.bfloat16)]
    static = torch.ones(1024, device=dev)
    torch.cuda.synchronize(dev)
    bad = []
    with pyring.init(rank, world, store, set_default=False, timeout=30,
                     device="cuda:0") as comm:
        comm.all_reduce(torch.ones(1, device=dev))
        torch.cuda.synchronize(dev)
        opened, done, outcome = threading.Event(), threading.Event(), []

        def capture() -> None:
            g = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(g, stream=side):
                    out = static * 2
                    opened.set()
                    done.wait(20)  # open while the collectives run
                g.replay()
                torch.cuda.synchronize(dev)
                outcome.append(float(out.sum()))
            except Exception as e:  # noqa: BLE001 (the outcome is the result)
                opened.set()
                outcome.append(repr(e))

        t = threading.Thread(target=capture)
        t.start()
        opened.wait(20)
        try:
            with torch.cuda.stream(mine):
                for w in [comm.all_reduce(x, async_op=True) for x in xs]:
                    w.wait()
        except Exception as e:  # noqa: BLE001
            bad.append(f"collectives: {e!r}")
        done.set()
        t.join()
        torch.cuda.synchronize(dev)
        if outcome != [2048.0]:
            bad.append(f"the capture: {outcome}")
        for i, x in enumerate(xs):
            k = i // 2
            want = float(sum(r + k for r in range(world)))
            if not bool((x.float() == want).all()):
                bad.append(f"size #{k} {x.dtype}: {x[:3].tolist()} want {want}")
    return bad


def test_collectives_while_another_thread_captures_a_graph():
    assert run_ranks(2, capture_elsewhere_body, timeout=90) == [[], []]


def cupy_body(rank, world, store):
    cupy = pytest.importorskip("cupy")
    import pyring

    with pyring.init(rank, world, store, set_default=False) as comm:
        s = cupy.cuda.Stream(non_blocking=True)
        with s:
            a = cupy.full(1000, rank + 1, dtype=cupy.float32)
            comm.all_reduce(a)
            got = float(a[0])
        s.synchronize()
    return got


def test_cuda_array_interface_objects():
    assert run_ranks(2, cupy_body, timeout=120) == [3.0, 3.0]


def test_ddp_optimizer_hooks_and_onebit_adam_match_cpu():
    """tests/device_training.py on the GPU against the CPU (the sim device runs it bit for bit
    in CI: tests/test_sim_torch.py). The GPU's kernels sum in another order: the full-precision
    runs agree to 1e-5, the compressed ones to 1e-2, except that a one-bit value within
    rounding of zero may take the other sign on the GPU, so one element in a thousand may
    differ more."""
    cpu = run_ranks(2, training_body, "cpu", timeout=120)
    gpu = run_ranks(2, training_body, "cuda", timeout=120)
    for c, g in zip(cpu, gpu):
        assert c.keys() == g.keys()
        c.pop("how"), g.pop("how")
        for name in c:
            exact = name in ("ddp", "distributed_optimizer")
            tol = 1e-5 if exact else 1e-2
            for a, b in zip(c[name], g[name]):
                far = int((abs(a - b) > tol + tol * abs(a)).sum())
                allowed = 0 if exact or "onebit" not in name else max(1, a.size // 1000)
                assert far <= allowed, (name, far, a.size, float(abs(a - b).max()))


def wire_crossing_limit(wire: str, n: int, tail: int, first: bool) -> int:
    """The most bytes a 2-rank all_reduce_wire of n float32 values on the GPU may move between
    device and host: its encoded bytes, each way (fp16 and bf16: 2 per value; one-bit: a sign
    bit and, in a chunk that holds an exact zero, a mask bit per value, with 16-byte headers),
    the exact tail at full width each way, and on a bucket's first call the one-bit state's
    residuals (bfloat16, n worker values and a chunk of server values) moved to the device
    once. A float32 crossing would be 8 n."""
    tail_bytes = 2 * 4 * tail
    if wire != "onebit":
        return 2 * 2 * (n - tail) + tail_bytes
    residuals = 2 * (n + (n + 1) // 2) if first else 0
    return 2 * (n // 4 + 16 * 16) + tail_bytes + residuals


def wire_body(rank, world, store):
    """The compressed wires on CUDA tensors: the codec runs on the GPU (onebit.cu, the casts),
    only encoded bytes cross to the host, and the results are the host's."""
    import pyring
    from pyring.optim.compression import all_reduce_wire

    dev = torch.device("cuda", 0)
    bad = []
    with pyring.init(rank, world, store, set_default=False) as comm:
        for wire in ("fp16", "bf16", "onebit"):
            states = [pyring.OneBitState(), pyring.OneBitState()] if wire == "onebit" else [
                None, None]
            for step in range(3):
                g = torch.Generator().manual_seed(100 * step + rank)
                x = torch.randn((1 << 20) + 5, generator=g)
                x[::97] = 0.0
                host = x.clone()
                all_reduce_wire(comm, host, "avg", wire, states[0], exact_tail=5)
                comm.reset_stats()
                gpu = x.to(dev)
                all_reduce_wire(comm, gpu, "avg", wire, states[1], exact_tail=5)
                crossed = comm.stats()["device_host_bytes"]
                diff = (gpu.cpu() - host).abs()
                if wire != "onebit" and diff.max().item() > 2e-2:
                    bad.append(f"{wire} step {step}: max difference {diff.max().item()}")
                # The GPU sums a segment's squares in another order: its scales differ in the
                # last bits, and a value within that of zero may take the other sign.
                far = int((diff > 1e-3).sum())
                if wire == "onebit" and far > x.numel() // 10_000:
                    bad.append(f"onebit step {step}: {far} values differ")
                if not torch.equal(gpu[-5:].cpu(), host[-5:]):
                    bad.append(f"{wire} step {step}: exact tail {gpu[-5:].tolist()}")
                limit = wire_crossing_limit(wire, x.numel(), tail=5, first=step == 0)
                if crossed > limit:
                    bad.append(f"{wire}: {crossed} bytes crossed to the host (limit {limit})")
    return bad


def test_wires_encode_on_the_gpu():
    assert run_ranks(2, wire_body, timeout=120) == [[], []]


def nccl_beside_pyring_body(rank, world, store):
    """"cpu:pyring,cuda:nccl" on one rank (NCCL takes one rank per GPU): CUDA tensors go to
    NCCL, CPU tensors to pyring."""
    import torch.distributed as dist

    from pyring.c10d.backend import ProcessGroupPyring

    reached = []  # the devices of the tensors that reach pyring's own allreduce
    own = ProcessGroupPyring.allreduce

    def spy(self, tensors, opts=None):
        reached.append(tensors[0].device.type)
        return own(self, tensors, opts)

    ProcessGroupPyring.allreduce = spy
    dist.init_process_group("cpu:pyring,cuda:nccl", store=store, rank=rank, world_size=world)
    pg = dist.group.WORLD
    g = torch.full((7,), 2.0, device="cuda:0")
    dist.all_reduce(g)
    c = torch.full((7,), 3.0)
    dist.all_reduce(c)
    got = {"cuda": type(pg._get_backend(torch.device("cuda"))).__name__,
           "values": [g.cpu().tolist(), c.tolist()], "reached_pyring": reached}
    dist.destroy_process_group()
    return got


def test_mixed_string_gives_cuda_tensors_to_nccl():
    if not torch.distributed.is_nccl_available():
        pytest.skip("torch without NCCL")
    got = run_ranks(1, nccl_beside_pyring_body, timeout=120)[0]
    assert got["cuda"] == "ProcessGroupNCCL", got
    assert got["values"] == [[2.0] * 7, [3.0] * 7], got
    assert got["reached_pyring"] == ["cpu"], got


def symmetric_body(rank, world, store):
    """The zero-copy collectives on pyring.empty tensors on cuda:0 (the ranks share the GPU),
    each input written late on the caller's stream and each result read by work queued after."""
    import pyring

    dev = torch.device("cuda", 0)
    bad = []
    with pyring.init(rank, world, store, set_default=False, timeout=60) as comm:
        s = torch.cuda.Stream(dev)
        calls = 0
        with torch.cuda.stream(s):
            for n in (1, 1001, (1 << 22) + 3):
                for dt in (torch.float32, torch.bfloat16):
                    x = comm.empty(n, dtype=dt, device=dev)
                    torch.cuda._sleep(1_000_000)  # the fill is late: the collective must wait
                    x.fill_(float(rank + 1))
                    comm.all_reduce(x)
                    y = x * 1
                    x.fill_(-1.0)  # a peer must not see this
                    if not bool((y == float(sum(r + 1 for r in range(world)))).all()):
                        bad.append(f"all_reduce {dt} n={n}: {y[:3].tolist()}")
                    x.fill_(float(rank + 1))
                    out = torch.empty(n, dtype=dt, device=dev)
                    comm.all_reduce(x, op="avg", out=out)
                    if not bool((out == (world + 1) / 2).all()):
                        bad.append(f"avg into private {dt} n={n}: {out[:3].tolist()}")
                    calls += 2
                src = comm.empty(world * n, device=dev)
                src.copy_(torch.arange(world * n, device=dev) % 7 + rank)
                rs = torch.empty(n, device=dev)
                comm.reduce_scatter_tensor(rs, src)
                want = (torch.arange(rank * n, (rank + 1) * n, device=dev) % 7 * world
                        + sum(range(world)))
                if not torch.equal(rs, want.float()):
                    bad.append(f"reduce_scatter n={n}: {rs[:3].tolist()}")
                g = comm.empty(world * n, device=dev)
                g[rank * n:(rank + 1) * n].fill_(float(rank))
                comm.all_gather_into_tensor(g, g[rank * n:(rank + 1) * n])
                want = torch.arange(world, device=dev).repeat_interleave(n).float()
                if not torch.equal(g, want):
                    bad.append(f"all_gather n={n}")
                b = comm.empty(n, device=dev).fill_(float(rank))
                comm.broadcast(b, src=world - 1)
                if not bool((b == world - 1).all()):
                    bad.append(f"broadcast n={n}: {b[:3].tolist()}")
                calls += 3
        s.synchronize()
        zc = comm.stats()["zero_copy"]
        if zc["calls"] != calls:
            bad.append(f"zero-copy calls {zc} of {calls}")
    return bad


@pytest.mark.parametrize("world", [2, 4])
def test_zero_copy_on_symmetric_gpu_tensors(world):
    for rank, bad in enumerate(run_ranks(world, symmetric_body, timeout=180)):
        assert not bad, f"rank {rank}: {bad}"
