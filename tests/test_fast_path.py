"""The short call path of in-place all_reduce (csrc/bindings/fast_call.cc) and the two-rank
direct allreduce: the same bits as the general path on every rank, what it declines, and its
errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pyring
from pyring.launch import run_ranks
from pyring.runtime.buffers import fast_call_args


def _declined(*args, **kwargs):
    return "declined"


def short_path(comm):
    """The C all_reduce of `comm`, with a general path that only says it was called: the call
    returns None where the short path ran it, "declined" where it passed it on."""
    return comm._c.fast_all_reduce(*fast_call_args, comm._inflight, lambda: _declined)

# Values whose reduction depends on operand order where an implementation can get it wrong:
# NaN against numbers, -0.0 against +0.0, and sums that round.
SPECIAL = {
    0: [float("nan"), -0.0, 1.0, 1e30, 3.0, -float("inf"), 0.1, 5.0],
    1: [2.0, 0.0, float("nan"), -1e30, float("inf"), 3.0, 0.2, -5.0],
    2: [1.0, 0.0, -0.0, 7.0, 2.0, 1.0, 0.3, 1.0],
}


def _bits(t: torch.Tensor) -> list[int]:
    return t.view(torch.int32 if t.element_size() == 4 else torch.int64).tolist()


def _same_bits_as_general_path(rank, world, store):
    comm = pyring.init(rank, world, store)
    fast_call = short_path(comm)
    found = {}
    for dtype in (torch.float32, torch.float64):
        for op in ("sum", "avg", "max", "min", "prod"):
            x = torch.tensor(SPECIAL[rank], dtype=dtype)
            fast = x.clone()
            before = comm.stats()["calls"]
            assert fast_call(fast, op) is None
            assert sum(comm.stats()["calls"].values()) == sum(before.values()) + 1
            general = torch.empty_like(x)
            comm.all_reduce(x, op=op, out=general)  # out= always takes the general path
            found[f"{dtype} {op}"] = (_bits(fast), _bits(general))
    comm.close()
    return found


@pytest.mark.parametrize("world", [2, 3])
def test_fast_path_matches_general_path_bit_for_bit(world):
    results = run_ranks(world, _same_bits_as_general_path)
    for case, (fast, general) in results[0].items():
        assert fast == general, f"rank 0 {case}: fast path differs from the general path"
        for r in range(1, world):
            assert results[r][case] == results[0][case], f"rank {r} {case} differs from rank 0"


class _Sub(torch.Tensor):
    pass


def _declines(rank, world, store):
    comm = pyring.init(rank, world, store)
    x = torch.arange(8, dtype=torch.float32)
    declined = {
        "subclass": x.clone().as_subclass(_Sub),
        "non-contiguous": torch.arange(16, dtype=torch.float32)[::2],
        "bool": torch.ones(8, dtype=torch.bool),
        "numpy": np.arange(8, dtype=np.float32),
        "list": [1.0, 2.0],
    }
    fast_call = short_path(comm)
    sent = comm.stats()["bytes_sent"]
    taken = {name: fast_call(obj) for name, obj in declined.items()}
    taken["ReduceOp"] = fast_call(x.clone(), pyring.ReduceOp.SUM)
    taken["unknown op"] = fast_call(x.clone(), "median")
    taken["unhashable op"] = fast_call(x.clone(), ["sum"])
    taken["async"] = fast_call(x.clone(), "sum", True)
    taken["async keyword"] = fast_call(x.clone(), async_op=True)
    taken["out"] = fast_call(x.clone(), "sum", False, x.clone())
    taken["algo"] = fast_call(x.clone(), algo="ring")
    taken["wire"] = fast_call(x.clone(), wire="fp16")
    taken["state"] = fast_call(x.clone(), state=object())
    taken["no tensor"] = fast_call(op="sum")
    taken["unknown keyword"] = fast_call(x.clone(), bogus=1)
    taken["op twice"] = fast_call(x.clone(), "sum", op="sum")
    taken["too many"] = fast_call(x.clone(), "sum", False, None, None, "fp32", None, 1)
    assert comm.stats()["bytes_sent"] == sent, "a declined call sent bytes"
    work = comm.all_reduce(x.clone(), async_op=True)
    taken["async work queued"] = fast_call(x.clone())
    work.wait()
    comm.all_reduce(x.clone(), out=x.clone())  # the general path drops the completed work
    assert fast_call(x.clone()) is None
    kw = {"op": "sum", "async_op": False, "out": None, "algo": None, "wire": "fp32",
          "state": None}
    assert fast_call(x.clone(), **kw) is None, "explicit defaults by keyword"
    assert fast_call(tensor=x.clone(), **{"o" + "p": "max"}) is None, "keywords not interned"
    errors = {}
    for name in ("non-contiguous", "bool", "list"):
        try:
            comm.all_reduce(declined[name])
        except (TypeError, ValueError) as e:
            errors[name] = type(e).__name__
    y = torch.arange(16, dtype=torch.float32)[::2]
    try:
        comm.all_reduce(y.contiguous(), op="median")
    except ValueError as e:
        errors["unknown op"] = str(e)
    try:
        comm.all_reduce(y.contiguous(), op=["sum"])
    except (TypeError, ValueError) as e:
        errors["unhashable op"] = str(e)
    z = x.clone()
    comm.all_reduce(z, op=pyring.ReduceOp.SUM)  # declined by the short path, run by the general
    comm.close()
    return taken, errors, z.tolist()


def test_fast_path_declines_and_general_path_reports():
    for taken, errors, z in run_ranks(2, _declines):
        assert all(v == "declined" for v in taken.values()), taken
        assert errors["non-contiguous"] == "ValueError"
        assert errors["bool"] == "TypeError"
        assert errors["list"] == "TypeError"
        assert "median" in errors["unknown op"]
        assert "op must be a str" in errors["unhashable op"], errors["unhashable op"]
        assert z == [2.0 * i for i in range(8)]


def _mismatch(rank, world, store):
    comm = pyring.init(rank, world, store, timeout=20)
    x = torch.ones(64 if rank == 0 else 65)
    try:
        comm.all_reduce(x)
    except pyring.CommError as e:
        return type(e).__name__, str(e)
    finally:
        comm.close()
    return None


def test_fast_path_raises_pyring_errors():
    for result in run_ranks(2, _mismatch):
        assert result is not None, "a mismatched all_reduce on the short path did not raise"
        name, message = result
        assert name == "CommError"
        assert "count=64" in message and "count=65" in message, message


def _direct_large(rank, world, store, transport):
    import os

    os.environ["PYRING_TRANSPORT"] = transport
    comm = pyring.init(rank, world, store)
    gen = [torch.Generator().manual_seed(r) for r in range(world)]
    inputs = [torch.randn(1 << 22, generator=g) for g in gen]
    want = inputs[1] + inputs[0]
    x = inputs[rank].clone()
    comm.all_reduce(x, algo="direct")  # in place: pieces land while x is still being sent
    out = torch.empty_like(x)
    comm.all_reduce(inputs[rank], out=out, algo="direct")
    comm.close()
    return torch.equal(x, want), torch.equal(out, want)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_two_rank_direct_in_place_while_sending(transport):
    for in_place, out_of_place in run_ranks(2, _direct_large, transport):
        assert in_place, "in-place two-rank direct allreduce of 16 MiB is wrong"
        assert out_of_place, "out-of-place two-rank direct allreduce of 16 MiB is wrong"


class _Overrides(pyring.Communicator):
    def all_reduce(self, *args, **kwargs):
        return "overridden"


def _installed(rank, world, store):
    import gc
    import inspect
    import weakref

    def params(fn):
        return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]

    comm = pyring.init(rank, world, store, set_default=False)
    found = {
        "builtin": type(comm.all_reduce).__name__,
        "signature": params(comm.all_reduce),
        "method signature": params(pyring.Communicator.all_reduce)[1:],
    }
    sub = _Overrides(comm._c, rank=rank, world_size=world, local_rank=comm.local_rank,
                     local_world_size=comm.local_world_size, store=store,
                     transports=comm.transports, topology=comm.topology)
    found["subclass"] = sub.all_reduce(torch.ones(4))
    x = torch.ones(1024)
    calls = sum(comm.stats()["calls"].values())
    comm.all_reduce(x)
    pyring.Communicator.all_reduce(comm, x)  # the Python method: the general path
    found["sums"] = (x[0].item(), sum(comm.stats()["calls"].values()) - calls)
    alone = comm.all_reduce
    gone = weakref.ref(comm)
    comm.close()
    del comm, sub
    gc.collect()
    found["collected"] = gone() is None
    try:
        alone(x, out=torch.empty_like(x))  # the general path, of a collected communicator
    except ReferenceError as e:
        found["after"] = str(e)
    return found


def test_installed_all_reduce_is_the_short_path_and_lets_the_communicator_go():
    for found in run_ranks(2, _installed):
        assert found["builtin"] == "builtin_function_or_method"
        assert found["signature"] == found["method signature"], found
        assert found["subclass"] == "overridden", "the C all_reduce shadowed a subclass's"
        assert found["sums"] == (4.0, 2)
        assert found["collected"], "the C all_reduce keeps its Communicator alive"
        assert "no longer exists" in found["after"]


class _ShortNumel(torch.Tensor):
    def numel(self):
        return 2


def _overridden_attribute(rank, world, store):
    comm = pyring.init(rank, world, store, set_default=False)
    # A type that overrides numel: the short path must call the override, not torch's.
    _, *rest = fast_call_args
    fast_call = comm._c.fast_all_reduce((torch.Tensor, _ShortNumel), *rest, comm._inflight,
                                        lambda: _declined)
    x = torch.ones(8).as_subclass(_ShortNumel)
    ran = fast_call(x)
    comm.close()
    return ran, torch.Tensor(x).tolist()


def test_short_path_reads_overridden_tensor_attributes_generically():
    for ran, values in run_ranks(2, _overridden_attribute):
        assert ran is None
        assert values == [2.0, 2.0] + [1.0] * 6, values
