"""Starting every rank from one rank's state: parameters and buffers, and optimizer state."""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

from ..api import default
from ..runtime.agree import check_same_on_all_ranks, describe


def _tensors(obj: Any) -> list[tuple[str, Any]]:
    import torch

    if isinstance(obj, torch.nn.Module):
        return list(obj.state_dict().items())
    if isinstance(obj, Mapping):
        return list(obj.items())
    out = []
    for i, item in enumerate(obj):
        out.append((str(i), item) if isinstance(item, torch.Tensor) else tuple(item))
    return out


def broadcast_parameters(params: Any, src: int = 0, comm: Any = None) -> None:
    """Copies rank ``src``'s tensors into every rank's, in place. ``params`` is a module (its
    ``state_dict()``: parameters and buffers), a state dict, an iterable of (name, tensor)
    pairs such as ``model.named_parameters()``, or of tensors. Every rank must pass the same
    names, shapes and dtypes (else pyring.Error naming the first difference, on every rank).
    One broadcast of all the bytes; any dtype."""
    import torch

    comm = comm if comm is not None else default()
    items = _tensors(params)
    for name, t in items:
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
            raise TypeError(f"broadcast_parameters: {name!r} is not a dense tensor")
    check_same_on_all_ranks(comm, "broadcast_parameters",
                            [(repr(n), describe(t)) for n, t in items])
    if comm.world_size == 1 or not items:
        return
    offsets, total = [], 0
    for _, t in items:
        offsets.append(total)
        total += -(-t.numel() * t.element_size() // 16) * 16  # 16-byte aligned views
    flat = torch.zeros(total, dtype=torch.uint8)
    with torch.no_grad():
        if comm.rank == src:
            for (_, t), off in zip(items, offsets):
                nb = t.numel() * t.element_size()
                flat[off:off + nb].copy_(t.detach().reshape(-1).view(torch.uint8))
        comm.broadcast(flat, src=src)
        if comm.rank != src:
            for (_, t), off in zip(items, offsets):
                nb = t.numel() * t.element_size()
                t.copy_(flat[off:off + nb].view(t.dtype).view(t.shape))


def broadcast_optimizer_state(optimizer: Any, src: int = 0, comm: Any = None) -> None:
    """Loads rank ``src``'s ``optimizer.state_dict()`` (state and hyper-parameters) on every
    rank, including ranks whose state is still empty (or where ``src``'s is): the state dict
    travels as ``torch.save`` bytes after a broadcast of its length, and is read back with
    ``torch.load(weights_only=True)``."""
    import torch

    comm = comm if comm is not None else default()
    if comm.world_size == 1:
        return
    data = b""
    if comm.rank == src:
        out = io.BytesIO()
        torch.save(optimizer.state_dict(), out)
        data = out.getvalue()
    length = torch.tensor([len(data)], dtype=torch.int64)
    comm.broadcast(length, src=src)
    buf = (torch.frombuffer(bytearray(data), dtype=torch.uint8) if comm.rank == src
           else torch.empty(int(length), dtype=torch.uint8))
    comm.broadcast(buf, src=src)
    if comm.rank != src:
        state = torch.load(io.BytesIO(buf.numpy().tobytes()), weights_only=True)
        optimizer.load_state_dict(state)
