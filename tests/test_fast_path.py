"""The short call path of in-place all_reduce (csrc/bindings/fast_call.cc) and the two-rank
direct allreduce: the same bits as the general path on every rank, what it declines, and its
errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from multiproc import run_ranks

import pyring

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
    found = {}
    for dtype in (torch.float32, torch.float64):
        for op in ("sum", "avg", "max", "min", "prod"):
            x = torch.tensor(SPECIAL[rank], dtype=dtype)
            fast = x.clone()
            before = comm.stats()["calls"]
            assert comm._fast(fast, op, False, None, None, "fp32") is True
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
    sent = comm.stats()["bytes_sent"]
    taken = {name: comm._fast(obj, "sum", False, None, None, "fp32")
             for name, obj in declined.items()}
    taken["ReduceOp"] = comm._fast(x.clone(), pyring.ReduceOp.SUM, False, None, None, "fp32")
    taken["unknown op"] = comm._fast(x.clone(), "median", False, None, None, "fp32")
    taken["unhashable op"] = comm._fast(x.clone(), ["sum"], False, None, None, "fp32")
    taken["async"] = comm._fast(x.clone(), "sum", True, None, None, "fp32")
    taken["out"] = comm._fast(x.clone(), "sum", False, x.clone(), None, "fp32")
    taken["algo"] = comm._fast(x.clone(), "sum", False, None, "ring", "fp32")
    taken["wire"] = comm._fast(x.clone(), "sum", False, None, None, "fp16")
    assert comm.stats()["bytes_sent"] == sent, "a declined call sent bytes"
    work = comm.all_reduce(x.clone(), async_op=True)
    taken["async work queued"] = comm._fast(x.clone(), "sum", False, None, None, "fp32")
    work.wait()
    comm.all_reduce(x.clone())  # the general path drops the completed work
    assert comm._fast(x.clone(), "sum", False, None, None, "fp32") is True
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
        assert not any(taken.values()), taken
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
