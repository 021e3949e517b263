"""Device buffers at the Python edge: torch CUDA tensors, ``__cuda_array_interface__`` objects
(CuPy, Numba; their ``stream`` honoured), DLPack capsules, and the test-only sim arrays
(``__sim_array_interface__``, pyring.testing).

A device view is the host view's four fields plus ``device``: (kind code, index, stream), the
stream being the caller's current one (torch's, the interface's, or the sim's), on which the
collective is ordered. Every check happens here, before any byte moves.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

from .. import _C

KIND_NAMES: tuple[str, ...] = tuple(_C.DEVICE_KIND_NAMES)
CPU, CUDA, SIM = (KIND_NAMES.index(n) for n in ("cpu", "cuda", "sim"))
_SIZES: tuple[int, ...] = tuple(_C.DTYPE_SIZES)
_DTYPE_NAMES: tuple[str, ...] = tuple(_C.DTYPE_NAMES)
# Array-interface type strings ('<f4') of the dtypes pyring has, by code; bfloat16 has none.
_TYPESTR_CODES = {np.dtype(n).str: c for c, n in enumerate(_DTYPE_NAMES) if n != "bfloat16"}
# The sim interface (pyring.testing.sim) also names bfloat16.
_TYPESTR_CODES["bfloat16"] = _DTYPE_NAMES.index("bfloat16")


def device_name(device: tuple | None) -> str:
    """'cpu', 'cuda:0', 'sim:1'."""
    if device is None:
        return "cpu"
    return f"{KIND_NAMES[device[0]]}:{device[1]}"


def device_name_of(device: Any) -> str | None:
    """init(device=...) as a name: 'cuda:1', 'sim:0', or None (bound at the first call on
    device buffers). Takes a torch.device or a 'KIND:INDEX' string; ValueError otherwise."""
    if device is None:
        return None
    if device == "cuda":  # PYRING_DEVICE=cuda: the current CUDA device (torch.cuda.set_device)
        import torch

        if not torch.cuda.is_available():
            raise ValueError("init: device='cuda' but torch sees no CUDA device")
        return f"cuda:{torch.cuda.current_device()}"
    kind, index = getattr(device, "type", None), getattr(device, "index", None)
    if kind is None and isinstance(device, str):
        kind, _, idx = device.partition(":")
        index = int(idx) if idx.isdigit() else None
    if kind not in KIND_NAMES[1:] or not isinstance(index, int):
        raise ValueError(f"init: device={device!r} is not valid (valid: 'cuda:N', 'cuda' "
                         f"(the current CUDA device), a torch.device with an index, or None)")
    return f"{kind}:{index}"


def is_device_object(obj: Any) -> bool:
    """An object the device edge takes (not a torch tensor: those say so by their device)."""
    return (hasattr(obj, "__cuda_array_interface__") or hasattr(obj, "__sim_array_interface__")
            or type(obj).__name__ == "PyCapsule")


_TORCH_DEVICE_TYPES = (KIND_NAMES[CUDA], KIND_NAMES[SIM])


def is_torch_device(t: Any) -> bool:
    """A torch tensor on a device pyring takes: CUDA, or the test-only sim device
    (pyring.testing.sim_torch registers it with torch as "sim")."""
    return t.device.type in _TORCH_DEVICE_TYPES


def torch_device_view(t: Any, code: int, view: Any) -> Any:
    """The device view of a contiguous CUDA (or sim) tensor of dtype code ``code``, ordered on
    the caller's current stream of its device."""
    import torch

    if t.device.type == KIND_NAMES[SIM]:
        index = t.device.index or 0
        kind, stream = SIM, current_stream((SIM, index))
    else:
        index = t.device.index if t.device.index is not None else torch.cuda.current_device()
        kind, stream = CUDA, torch.cuda.current_stream(index).cuda_stream
    n = t.numel()
    return view(t.data_ptr(), n, code, n * _SIZES[code], (kind, index, stream))


def interface_view(obj: Any, op: str, name: str, writable: bool, view: Any) -> Any:
    """The device view of an array-interface object (CUDA or sim)."""
    if hasattr(obj, "__sim_array_interface__"):
        iface, kind = obj.__sim_array_interface__, SIM
        index = int(iface["device"])
    else:
        iface, kind = obj.__cuda_array_interface__, CUDA
        index = _cuda_index_of(obj)
    shape = tuple(iface["shape"])
    code = _TYPESTR_CODES.get(iface["typestr"])
    if code is None:
        raise TypeError(f"{op}: {name} has unsupported type {iface['typestr']!r} "
                        f"(supported: {', '.join(n for n in _DTYPE_NAMES if n != 'bfloat16')})")
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    size = _SIZES[code]
    strides = iface.get("strides")
    if strides is not None and n > 1:
        expect, contiguous = size, True
        for dim, stride in zip(reversed(shape), reversed(strides)):
            if dim != 1 and stride != expect:
                contiguous = False
            expect *= dim
        if not contiguous:
            raise ValueError(f"{op}: {name} is not C-contiguous (shape {shape}, strides "
                             f"{tuple(strides)})")
    ptr, readonly = iface["data"]
    if writable and readonly:
        raise ValueError(f"{op}: {name} is read-only")
    # CUDA array interface v3: None asks for no ordering (the legacy default stream orders it
    # with every blocking stream); 1 and 2 are the legacy and per-thread default streams.
    stream = iface.get("stream")
    return view(int(ptr), n, code, n * size, (kind, index, 0 if stream is None else int(stream)))


def _cuda_index_of(obj: Any) -> int:
    dev = getattr(obj, "device", None)
    for attr in ("id", "index"):
        if isinstance(getattr(dev, attr, None), int):
            return getattr(dev, attr)
    import torch

    if not torch.cuda.is_available():
        raise ValueError("a __cuda_array_interface__ object that names no device: CUDA is not "
                         f"available to this torch ({torch.__version__}"
                         f"{', a CPU build' if torch.version.cuda is None else ''}), which "
                         "pyring asks for the array's device; give the object a `device` "
                         "attribute, or use a torch built with CUDA on a machine with a GPU")
    return torch.as_tensor(obj, device="cuda").device.index


def _cuda_current_stream(index: int) -> int:
    import torch

    return torch.cuda.current_stream(index).cuda_stream


# The caller's current stream of a device kind, by kind code: CUDA's is torch's; the test-only
# sim device adds its own when pyring.testing.sim is imported (register_stream_source), which
# every sim buffer's maker does first.
_STREAM_SOURCES: dict[int, Callable[[int], int]] = {CUDA: _cuda_current_stream}


def register_stream_source(kind: int, source: Callable[[int], int]) -> None:
    """Makes ``source(index)`` the caller's current stream of devices of kind ``kind``."""
    _STREAM_SOURCES[kind] = source


def current_stream(device: tuple) -> int:
    """The caller's current stream on ``device`` now (for work.wait())."""
    source = _STREAM_SOURCES.get(device[0])
    if source is None:
        raise ValueError(f"no current stream is known for device {device_name(device)}: "
                         f"import pyring.testing.sim before using sim device buffers")
    return source(device[1])


def waiting_stream(result: Any, device: tuple) -> Callable[[], int]:
    """The stream a device work's wait() orders after its results: for an array-interface
    object (CuPy, Numba), the stream its interface named at the call, which the call was
    ordered on (that library's current stream, not torch's); else the caller's current stream
    at the wait, as for NCCL's works."""
    if is_device_object(result):
        named = device[2]
        return lambda: named
    return functools.partial(current_stream, device)


def common_device(comm: Any, op: str, views: list, names: list[str]) -> tuple | None:
    """The one device of ``views`` (None: the host), which must be this rank's. Raises
    ValueError naming both devices when the buffers of one call are on different devices, or
    on a device other than the one this rank's communicator uses."""
    first = views[0].device
    for v, n in zip(views[1:], names[1:]):
        if (v.device is None) != (first is None) or (
                first is not None and v.device[:2] != first[:2]):
            raise ValueError(f"{op}: {names[0]} is on {device_name(first)} but {n} is on "
                             f"{device_name(v.device)}; every buffer of one call must be on "
                             f"one device")
    if first is None:
        return None
    bound = comm.device
    if bound is None:
        comm.device = device_name(first)
    elif bound != device_name(first):
        raise ValueError(f"{op}: {names[0]} is on {device_name(first)} but rank {comm.rank} "
                         f"uses {bound}; move it there, or init pyring with that device")
    return first


def release_cached_memory(device: str) -> None:
    """pyring's cached-memory releaser (``_C.set_cached_memory_releaser``): when a device
    allocation of pyring's own fails for want of memory, torch's caching allocator gives its
    cached, unused blocks back (``torch.cuda.empty_cache``) and pyring tries once more."""
    if device.startswith(KIND_NAMES[CUDA] + ":"):
        import torch

        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()


_C.set_cached_memory_releaser(release_cached_memory)
