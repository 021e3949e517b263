"""Symmetric memory: tensors that every rank of a host maps (csrc/core/symmetric.h).

A collective on such tensors takes the zero-copy path when every rank of the communicator
shares one host: ranks read each other's tensors straight from their mappings
(csrc/collectives/zero_copy.h), with no slot copies in between. Host tensors live in shared
memory; CUDA (and the test-only sim device's) tensors in device memory that every local rank
opened once through its IPC handle.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Devices pyring.empty allocates on.
DEVICES = ("cpu", "cuda", "sim")
# Device type -> fn(address, nbytes, index, owner) making a uint8 tensor over memory that owner
# holds, for devices whose tensors torch cannot make from an address itself (the test-only sim
# device registers its own when it is enabled).
_ADOPTERS: dict[str, Any] = {}


def register_adopter(device_type: str, fn: Any) -> None:
    """Lets pyring.empty make tensors of ``device_type`` with ``fn`` (see _ADOPTERS)."""
    _ADOPTERS[device_type] = fn


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
    from . import devices

    if dev.type == "cpu":
        kind, index = devices.CPU, -1
    elif dev.type == "cuda":
        kind = devices.CUDA
        index = torch.cuda.current_device() if dev.index is None else dev.index
    else:
        kind, index = devices.SIM, 0 if dev.index is None else dev.index
    dev = torch.device(dev.type, index) if index >= 0 else dev
    numel = 1
    for n in shape:
        numel *= n
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = numel * itemsize
    what = f"empty({', '.join(map(str, shape))}, dtype={str(dtype).removeprefix('torch.')})"
    block = comm._c.symmetric_empty(nbytes, what, kind, index)
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype, device=dev)
    # The tensor's storage holds the block, and so the mapping, for as long as it lives.
    if dev.type == "cpu":
        flat = torch.frombuffer(block, dtype=torch.uint8)
    elif dev.type == "cuda":
        flat = torch.as_tensor(_CudaBlock(block), device=dev)
    else:
        adopt = _ADOPTERS.get(dev.type)
        if adopt is None:
            raise RuntimeError(f"pyring.empty: {dev.type} tensors need the {dev.type} device "
                               f"registered with torch first (pyring.testing.sim_torch.enable())")
        flat = adopt(block.data_ptr, nbytes, index, block)
    if dev.type != "cpu":
        flat.zero_()  # as the host's fresh shared memory is (on the current stream)
    return flat.view(dtype).view(shape)


class _CudaBlock:
    """A symmetric block of CUDA memory as torch takes it (``__cuda_array_interface__``): the
    tensor made from it holds this object, and so the block."""

    def __init__(self, block: Any) -> None:
        self.block = block
        self.__cuda_array_interface__ = {
            "shape": (block.nbytes,), "typestr": "|u1", "data": (block.data_ptr, False),
            "version": 3, "strides": None, "stream": None,
        }



def zeros(comm: Any, n: int, dtype: Any, device: Any) -> Any:
    """A zeroed flat buffer of ``n`` elements for exchanges over ``comm``: symmetric
    (pyring.empty, collective: every rank calls it alike) where they can run zero-copy, that is
    on a pyring communicator whose ranks have local peers, on a device pyring.empty allocates on,
    every rank on this host (host memory: or on hosts of as many ranks each, where all_reduce
    runs zero-copy within each host); a private tensor otherwise."""
    import torch

    dev = torch.device(device)
    local = getattr(comm, "local_world_size", 1)  # pyring's Communicator; torch's groups: 1
    if (hasattr(comm, "empty") and local > 1 and dev.type in DEVICES
            and (local == comm.world_size or dev.type == "cpu")):
        return empty(comm, n, dtype=dtype, device=device)
    return torch.zeros(n, dtype=dtype, device=device)
