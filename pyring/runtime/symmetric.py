"""Symmetric memory: tensors that every rank of a host maps (csrc/core/symmetric.h).

A collective on such tensors takes the zero-copy path when every rank of the communicator
shares one host: ranks read each other's tensors straight from their mappings
(csrc/collectives/zero_copy.h), with no slot copies in between.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Devices pyring.empty allocates on.
DEVICES = ("cpu",)


def _shape(size: tuple) -> tuple[int, ...]:
    if len(size) == 1 and isinstance(size[0], Sequence):
        size = tuple(size[0])
    out = []
    for s in size:
        if isinstance(s, bool) or not hasattr(s, "__index__"):
            raise TypeError(f"pyring.empty: size must be ints, got {s!r} "
                            f"({type(s).__name__})")
        n = s.__index__()
        if n < 0:
            raise ValueError(f"pyring.empty: negative dimension {n} in size {tuple(size)}")
        out.append(n)
    return tuple(out)


def empty(comm: Any, *size: Any, dtype: Any = None, device: Any = None) -> Any:
    """See :func:`pyring.empty`."""
    import torch

    shape = _shape(size)
    dtype = torch.float32 if dtype is None else dtype
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"pyring.empty: dtype must be a torch.dtype, got {dtype!r}")
    dev = torch.device("cpu" if device is None else device)
    if dev.type not in DEVICES:
        raise ValueError(f"pyring.empty: device {str(dev)!r}: symmetric memory is allocated on "
                         f"{', '.join(DEVICES)} only; tensors on other devices take the "
                         f"slot path")
    numel = 1
    for n in shape:
        numel *= n
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = numel * itemsize
    what = f"empty({', '.join(map(str, shape))}, dtype={str(dtype).removeprefix('torch.')})"
    block = comm._c.symmetric_empty(nbytes, what)
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    # The tensor's storage holds the block, and so the mapping, for as long as it lives.
    flat = torch.frombuffer(block, dtype=torch.uint8)
    return flat.view(dtype).view(shape)

