"""Stream semantics on the sim device, under random delays: a collective sees the work queued
on the caller's stream before it, work queued after it sees the result, work.wait() orders the
stream after the collective's host part without waiting for device work (an array-interface
object's: the stream it named), and failures release the streams that wait. Also the refusals
at the edge and the sim's IPC handles."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from pyring.launch import run_ranks

ITERS = 40


def order_body(rank, world, store):
    import pyring
    from pyring.testing import sim

    bad = []
    want = lambda i: float(sum(r + i for r in range(world)))  # noqa: E731
    with pyring.init(rank, world, store, set_default=False) as comm:
        s = sim.SimStream(0)
        with sim.stream(s):
            x = sim.SimArray(4096, torch.float32, 0)
            y = sim.SimArray(4096, torch.float32, 0)
            for i in range(ITERS):
                x.fill_(float(rank + i))           # before: the collective must see it
                comm.all_reduce(x)
                y.copy_(x)                         # after: must see the result
                got = y.to_host()
                if not bool((got == want(i)).all()):
                    bad.append(f"sync #{i}: {got[:3].tolist()} want {want(i)}")
            for i in range(ITERS):
                x.fill_(float(rank + i))
                w = comm.all_reduce(x, async_op=True)
                w.wait()
                y.copy_(x)
                got = y.to_host()
                if not bool((got == want(i)).all()):
                    bad.append(f"async #{i}: {got[:3].tolist()} want {want(i)}")
        # An array-interface object names its stream (a CuPy array names CuPy's current
        # stream, not torch's): wait() orders that stream, wherever it is called.
        for i in range(ITERS):
            with sim.stream(s):
                x = sim.SimArray(4096 if i % 2 else (1 << 18) + 3, torch.float32, 0)
                w = comm.all_reduce(x.fill_(float(rank + i)), async_op=True)
            w.wait()  # the current stream here is the default one
            with sim.stream(s):
                got = x.to_host()
            if not bool((got == want(i)).all()):
                bad.append(f"named stream #{i}: {got[:3].tolist()} want {want(i)}")
        s.synchronize()
        s.close()
    return bad


def test_stream_order_with_delays():
    results = run_ranks(2, order_body, env={"PYRING_SIM_DELAY_US": "300"}, timeout=300)
    for rank, bad in enumerate(results):
        assert not bad, f"rank {rank}: {len(bad)} of {3 * ITERS} wrong:\n" + "\n".join(bad[:10])


def one_rank_body(rank, world, store):
    """One-rank collectives of device buffers stay on the device, in stream order: all_reduce,
    reduce_scatter_tensor and all_gather_into_tensor in place change nothing and out of place
    are a copy, broadcast does nothing, and no byte crosses to the host."""
    import pyring
    from pyring.testing import sim

    bad = []
    with pyring.init(rank, world, store, set_default=False) as comm:
        s = sim.SimStream(0)
        calls = {
            "all_reduce": lambda x, y, a: comm.all_reduce(x, out=y, async_op=a),
            "reduce_scatter_tensor": lambda x, y, a: comm.reduce_scatter_tensor(
                y, x, op="avg", async_op=a),
            "all_gather_into_tensor": lambda x, y, a: comm.all_gather_into_tensor(
                y, x, async_op=a),
        }
        with sim.stream(s):
            x = sim.SimArray(4099, torch.float32, 0)
            y = sim.SimArray(4099, torch.float32, 0)
            for i in range(ITERS):
                name, call = list(calls.items())[i % len(calls)]
                x.fill_(float(i))
                y.fill_(-1.0)
                comm.all_reduce(x, op="avg" if i % 2 else "sum")
                comm.broadcast(x, src=0, async_op=bool(i % 2))
                w = call(x, y, bool(i % 3))
                if w is not None:
                    w.wait()
                x.fill_(-2.0)  # after: must not reach y
                got = y.to_host()
                if not bool((got == float(i)).all()):
                    bad.append(f"{name} #{i}: {got[:3].tolist()} want {float(i)}")
        s.synchronize()
        s.close()
        crossed = comm.stats()["device_host_bytes"]
    return bad, crossed


def test_one_rank_stays_on_the_device():
    (bad, crossed), = run_ranks(1, one_rank_body, env={"PYRING_SIM_DELAY_US": "300"},
                                timeout=120)
    assert not bad, "\n".join(bad[:10])
    assert crossed == 0, f"{crossed} bytes crossed to the host"


def growth_body(rank, world, store, device):
    """Collectives of growing sizes and two dtypes, each awaited with work.wait(), and the
    device synchronized by the caller's thread right after it (as DDP does between its
    collectives: a copy to pageable memory, an allocation, a kernel's first launch). A stream
    made to wait for results not yet queued deadlocks against that call, and so does freeing
    or allocating staging or scratch memory while a stream waits (the sim aborts, naming the
    call; on a GPU it hangs). `device`: the rank's bound device (the ring on the device
    buffers over sim IPC), or None (staged through the host)."""
    import pyring
    from pyring import _C
    from pyring.testing import sim

    bad = []
    with pyring.init(rank, world, store, set_default=False, device=device) as comm:
        for k in range(6):
            for dtype in (torch.float32, torch.bfloat16):
                x = sim.SimArray(1000 * 4**k + k, dtype, 0).fill_(float(rank + k))
                comm.all_reduce(x, async_op=True).wait()
                _C.sim_synchronize_device(0)
                got = x.to_host()
                if not bool((got.float() == float(2 * k + 1)).all()):
                    bad.append(f"size #{k} {dtype}: {got[:3].tolist()}")
    return bad


@pytest.mark.parametrize("device", [None, "sim:0"], ids=["staged", "resident"])
def test_growing_collectives_with_the_device_synchronized_after_each_wait(device):
    assert run_ranks(2, growth_body, device, env={"PYRING_SIM_DELAY_US": "200"},
                     timeout=120) == [[], []]


def nonblocking_body(rank, world, store):
    import pyring
    from pyring.testing import sim

    with pyring.init(rank, world, store, set_default=False) as comm:
        x = sim.SimArray(1000, torch.float32, 0).fill_(rank + 1)
        comm.all_reduce(x)  # the staging memory, allocated before the stream is held up
        x.fill_(rank + 1)
        stream = sim.current_stream(0)
        w = comm.all_reduce(x, async_op=True)
        gate = threading.Event()
        stream.launch(lambda: gate.wait(30))  # work after the collective, busy until set
        t0 = time.monotonic()
        w.wait()
        waited = time.monotonic() - t0
        gate.set()
        got = x.to_host()
        w.synchronize()
        return waited, float(got[0]), w.is_completed()


def test_wait_does_not_wait_for_device_work():
    """work.wait() waits for the collective's host part, not for the caller's stream: it
    returns while work queued after the collective still runs."""
    for waited, value, completed in run_ranks(2, nonblocking_body, timeout=120):
        assert waited < 5, "work.wait() waited for the caller's stream"
        assert value == 3.0 and completed


def timeout_body(rank, world, store):
    import pyring
    from pyring.testing import sim

    comm = pyring.init(rank, world, store, timeout=2, set_default=False)
    gate = threading.Event()
    x = sim.SimArray(10, torch.float32, 0)
    # The device queue and its staging first: allocating them would wait for the held stream
    # (allocating pinned memory may synchronize the device).
    comm.all_reduce(x)
    sim.current_stream(0).launch(lambda: gate.wait(60))
    try:
        comm.all_reduce(x)
        return "no error"
    except pyring.CommTimeout as e:
        return str(e)
    finally:
        gate.set()
        x.to_host()  # the stream is not left waiting for the failed collective
        comm.close()


def test_caller_stream_never_ready_times_out():
    for msg in run_ranks(2, timeout_body, timeout=120):
        assert "caller's stream" in msg, msg


def killed_body(rank, world, store):
    import os

    import pyring
    from pyring.testing import sim

    comm = pyring.init(rank, world, store, timeout=20, set_default=False)
    if rank == 1:
        os._exit(7)
    x = sim.SimArray(1 << 16, torch.float32, 0).fill_(1.0)
    y = sim.SimArray(1 << 16, torch.float32, 0)
    try:
        comm.all_reduce(x)
        err = "no error"
    except pyring.CommError as e:
        err = str(e)
    w_err = None
    try:
        comm.all_reduce(x, async_op=True).synchronize()
    except pyring.CommError as e:
        w_err = str(e)
    y.copy_(x)
    y.to_host()  # returns: no stream waits forever for the failed collectives
    comm.close()
    return err, w_err


def test_killed_rank_releases_streams():
    results = run_ranks(2, killed_body, allow_failures=True, timeout=120)
    err, w_err = results[0]
    assert "rank 1" in err, err
    assert w_err and "unusable" in w_err, w_err


def refusals_body(rank, world, store):
    import numpy as np

    import pyring
    from pyring.testing import sim

    out = {}

    def catch(name, fn):
        try:
            fn()
            out[name] = "no error"
        except Exception as e:  # the type and text are checked by the test
            out[name] = f"{type(e).__name__}: {e}"

    with pyring.init(rank, world, store, set_default=False) as comm:
        a0 = sim.SimArray(8, torch.float32, 0)
        a1 = sim.SimArray(8, torch.float32, 1)
        catch("mixed", lambda: comm.all_reduce(a0, out=a1))
        catch("host_and_device", lambda: comm.all_reduce(torch.zeros(8), out=a0))
        catch("numpy_and_device", lambda: comm.all_gather_into_tensor(a0, np.zeros(4, "f4")))
        comm.all_reduce(a0)
        catch("other_device", lambda: comm.all_reduce(a1))
        catch("p2p", lambda: comm.send(a1, (rank + 1) % world))
        catch("wire", lambda: comm.all_reduce(a1, wire="fp16"))  # a wire checks devices too
        catch("sim_bad_index", lambda: sim.SimArray(8, torch.float32, 99))

        class FakeCuda:
            __cuda_array_interface__ = {"shape": (8,), "typestr": "<f4", "data": (4096, False),
                                        "version": 3, "strides": None, "stream": None}
            device = type("Dev", (), {"id": 0})()

        with pyring.init(rank, world, store, set_default=False) as fresh:
            catch("cuda_without_cuda", lambda: fresh.all_reduce(FakeCuda()))
            fresh.barrier()
        comm.barrier()
    return out


def bound_body(rank, world, store):
    import pyring
    from pyring.testing import sim

    with pyring.init(rank, world, store, set_default=False, device="sim:1") as comm:
        assert comm.device == "sim:1"
        try:
            comm.all_reduce(sim.SimArray(4, torch.float32, 0))
            return "no error"
        except ValueError as e:
            return str(e)


def test_init_binds_the_rank_to_its_device():
    for msg in run_ranks(2, bound_body, timeout=60):
        assert "sim:0" in msg and "uses sim:1" in msg, msg
    with pytest.raises(ValueError, match="device='gpu0' is not valid"):
        from pyring.runtime.devices import device_name_of

        device_name_of("gpu0")


def test_refusals_name_both_devices():
    out = run_ranks(2, refusals_body, timeout=120)[0]
    assert out["mixed"].startswith("ValueError") and "sim:0" in out["mixed"] \
        and "sim:1" in out["mixed"], out["mixed"]
    assert "cpu" in out["host_and_device"] and "sim:0" in out["host_and_device"]
    assert "cpu" in out["numpy_and_device"] and "sim:0" in out["numpy_and_device"]
    assert out["other_device"].startswith("ValueError") and "sim:1" in out["other_device"] \
        and "uses sim:0" in out["other_device"], out["other_device"]
    assert out["p2p"].startswith("ValueError") and "uses sim:0" in out["p2p"], out["p2p"]
    assert out["wire"].startswith("ValueError") and "uses sim:0" in out["wire"], out["wire"]
    assert out["sim_bad_index"].startswith("ValueError") and "99" in out["sim_bad_index"]
    assert "CudaError" in out["cuda_without_cuda"] or "CUDA" in out["cuda_without_cuda"], \
        out["cuda_without_cuda"]


def ipc_body(rank, world, store):
    import pyring._C as C
    from pyring.testing import sim

    if rank == 0:
        a = sim.SimArray(256, torch.int32, 0)
        a.copy_(torch.arange(256, dtype=torch.int32)).to_host()
        store.set("h", C.sim_ipc_handle(0, a.ptr + 64 * 4))
        store.wait(["read"])
        return None
    p = C.sim_ipc_open(0, store.get("h"))
    import ctypes

    view = (ctypes.c_int32 * 192).from_address(C.sim_host_view(p))
    got = torch.frombuffer(view, dtype=torch.int32).clone()
    C.sim_ipc_close(0, p)
    store.set("read", b"1")
    return got.tolist()


def test_sim_ipc_handle_opens_in_another_process():
    assert run_ranks(2, ipc_body, timeout=60)[1] == list(range(64, 256))


def refused_ipc_body(rank, world, store):
    import pyring
    import pyring._C as C
    from pyring.testing import sim

    a = sim.SimArray(4, torch.float32, 0)
    with pytest.raises(pyring.CudaError, match="IPC refused"):
        C.sim_ipc_handle(0, a.ptr)
    return True


def test_sim_ipc_refusal_is_a_cuda_error():
    assert run_ranks(1, refused_ipc_body, env={"PYRING_SIM_IPC": "refuse"}, timeout=60) == [True]


def p2p_body(rank, world, store):
    import pyring
    from pyring.testing import sim

    bad = []
    with pyring.init(rank, world, store, set_default=False) as comm:
        peer = 1 - rank
        for i in range(10):
            x = sim.SimArray(1000 + i, torch.int32, 0)
            if rank == 0:
                x.fill_(i + 1)  # queued before the send: the send must carry it
                comm.send(x, peer)
                y = sim.SimArray(7, torch.float64, 0).fill_(-1)
                w = comm.irecv(y, peer, tag=5)
                w.wait()
                if not bool((y.to_host() == 2.5 * i).all()):
                    bad.append(f"irecv #{i}: {y.to_host()[:3].tolist()}")
            else:
                x.fill_(-1)
                assert comm.recv(x, peer) == peer
                got = x.to_host()
                if not bool((got == i + 1).all()):
                    bad.append(f"recv #{i}: {got[:3].tolist()}")
                z = sim.SimArray(7, torch.float64, 0).fill_(2.5 * i)
                comm.isend(z, peer, tag=5).wait()
    return bad


def test_point_to_point_on_device_buffers():
    results = run_ranks(2, p2p_body, env={"PYRING_SIM_DELAY_US": "300"}, timeout=120)
    for rank, bad in enumerate(results):
        assert not bad, f"rank {rank}: {bad}"


def dropped_buffer_body(rank, world, store):
    """A synchronous call's buffer dropped at once, and memory of its size allocated and filled
    on another stream: pyring's stream, still copying the results back, must not land in it."""
    import pyring
    from pyring.testing import sim

    bad = []
    with pyring.init(rank, world, store, set_default=False) as comm:
        other = sim.SimStream(0)
        for i in range(5):
            x = sim.SimArray(1 << 16, torch.float32, 0)
            x.fill_(1.0)
            sim.set_delay_us(3000)  # pyring's copies back run late
            comm.all_reduce(x)
            address = x.ptr
            del x
            y = sim.SimArray(1 << 16, torch.float32, 0)
            reused = y.ptr == address
            with sim.stream(other):
                y.fill_(7.0)
                other.synchronize()
            sim.set_delay_us(0)
            sim.current_stream(0).synchronize()  # the collective's copies back have run
            if reused or not bool((y.to_host() == 7.0).all()):
                bad.append(f"#{i}: memory reused {reused}, values {y.to_host()[:2].tolist()}")
        other.synchronize()
        other.close()
    return bad


def test_synchronous_calls_keep_their_buffers_until_the_device_is_done():
    for rank, bad in enumerate(run_ranks(2, dropped_buffer_body, timeout=300)):
        assert not bad, f"rank {rank}: " + "; ".join(bad)


def current_device_body(rank, world, store):
    """Calls for sim:0 from a thread whose current device is sim:1 leave it sim:1, as torch's
    current device must stay across a collective on another device."""
    import pyring
    from pyring import _C
    from pyring.testing import sim

    seen = []
    with pyring.init(rank, world, store, set_default=False) as comm:
        x = sim.SimArray(4096, torch.float32, 0)
        x.fill_(1.0)
        _C.sim_set_device(1)
        comm.all_reduce(x)
        seen.append(_C.sim_current_device())
        comm.all_reduce(x, async_op=True).wait()
        seen.append(_C.sim_current_device())
        seen.append(x.to_host()[0].item())
    return seen


def test_calls_restore_the_callers_current_device():
    for seen in run_ranks(2, current_device_body, env={"PYRING_SIM_DEVICES": "2"}, timeout=120):
        assert seen == [1, 1, 4.0], seen
