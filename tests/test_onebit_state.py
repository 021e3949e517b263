"""OneBitState's kept residuals (bfloat16, deferred) through checkpoints: a resumed state goes
on bit for bit, a state saved in the float32 format loads rounded, a state that does not fit
its own shape is refused."""

from __future__ import annotations

import pytest
import torch

import pyring
from pyring.launch import run_ranks

N = 2 * (1 << 20) + 6  # two segments per chunk on 2 ranks


def _x(rank: int, step: int) -> torch.Tensor:
    x = torch.randn(N, generator=torch.Generator().manual_seed(100 * step + rank))
    x[::9] = 0.0
    return x


def _formats(rank, world, store):
    comm = pyring.init(rank=rank, world_size=world, store=store, set_default=False)
    a = pyring.OneBitState()
    for step in range(3):
        comm.all_reduce(_x(rank, step), op="avg", wire="onebit", state=a)
    sd = a.state_dict()
    kinds = {k: (v.dtype, tuple(v.shape)) for k, v in sd.items()}
    settled = a.worker.clone()
    # Resumed: a fresh state from the checkpoint, beside the one that goes on.
    b = pyring.OneBitState()
    b.load_state_dict({k: v.clone() for k, v in sd.items()})
    same_after = []
    for step in range(3, 5):
        xa, xb = _x(rank, step), _x(rank, step)
        comm.all_reduce(xa, op="avg", wire="onebit", state=a)
        comm.all_reduce(xb, op="avg", wire="onebit", state=b)
        same_after.append(torch.equal(xa, xb))
    sa, sb = a.state_dict(), b.state_dict()
    same_state = all(torch.equal(sa[k], sb[k]) for k in sa)
    # The float32 format of earlier versions: settled residuals, no scales.
    c = pyring.OneBitState()
    c.load_state_dict({"worker": settled, "server": torch.zeros(sd["server"].numel()),
                       "masks": sd["masks"]})
    rounded = torch.equal(c.worker, settled.to(torch.bfloat16).float())
    # A shape that its vectors do not fit.
    bad = dict(sd, shape=torch.tensor([N + 1, world, rank]))
    with pytest.raises(ValueError, match="restored for") as e:
        pyring.OneBitState().load_state_dict(bad)
    comm.close()
    return kinds, same_after, same_state, rounded, str(e.value)


def test_kept_residuals_resume_bit_for_bit_and_load_the_float32_format():
    for kinds, same_after, same_state, rounded, error in run_ranks(2, _formats, timeout=300):
        own = N // 2
        assert kinds["worker"] == (torch.bfloat16, (N,))
        assert kinds["server"] == (torch.bfloat16, (own,))
        assert kinds["scales"] == (torch.float32, (3 * 2,))  # (P + 1) x segments
        assert kinds["shape"] == (torch.int64, (3,))
        assert same_after == [True, True] and same_state
        assert rounded
        assert f"needs {N + 1} worker residuals" in error and f"it holds {N}" in error, error


def _reshaped(rank, world, store):
    # A state saved with the other rank's shape (same sizes; with even chunks the same layout
    # of scales): binding it to this rank's shape settles it in the saved layout, keeps it
    # rounded and starts with no scale, which is what loading its settled float32 residuals
    # gives.
    comm = pyring.init(rank=rank, world_size=world, store=store, set_default=False)
    x = torch.randn(N, generator=torch.Generator().manual_seed(rank)) + 3.0  # no exact zero
    a = pyring.OneBitState()
    comm.all_reduce(x.clone(), op="avg", wire="onebit", state=a)
    sd = a.state_dict()
    b, c = pyring.OneBitState(), pyring.OneBitState()
    b.load_state_dict(dict(sd, shape=torch.tensor([N, world, 1 - rank])))
    c.load_state_dict({"worker": a.worker, "server": a.server, "masks": sd["masks"]})
    yb, yc = x.clone(), x.clone()
    comm.all_reduce(yb, op="avg", wire="onebit", state=b)
    comm.all_reduce(yc, op="avg", wire="onebit", state=c)
    sb, sc = b.state_dict(), c.state_dict()
    comm.close()
    return (sb["shape"].tolist(), bool(torch.equal(yb, yc)),
            all(torch.equal(sb[k], sc[k]) for k in sb), bool(sd["scales"].any()))


def test_a_state_bound_to_another_shape_settles_in_the_saved_one():
    for rank, (shape, same_out, same_state, had_scales) in enumerate(
            run_ranks(2, _reshaped, timeout=300)):
        assert shape == [N, 2, rank] and had_scales
        assert same_out and same_state
