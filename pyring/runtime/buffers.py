"""Turns torch tensors and numpy arrays into the core's (address, count, dtype) views.

Every check happens here, before any byte is sent: the kind of object, its device, dtype,
layout and (for outputs) writability.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

try:
    import torch
except ImportError:  # pragma: no cover - torch is always present in practice
    torch = None

from .. import _C
from ..ops import _FAST as _OP_CODE_OF_NAME
from . import devices as _devices

# Names and sizes come from the core (csrc/core/types.h), in code order.
DTYPE_NAMES: tuple[str, ...] = tuple(_C.DTYPE_NAMES)
_SIZES: tuple[int, ...] = tuple(_C.DTYPE_SIZES)
_NUMPY_CODES = {np.dtype(n): c for c, n in enumerate(DTYPE_NAMES) if n != "bfloat16"}
_TORCH_CODES = {}
if torch is not None:
    _TORCH_CODES = {getattr(torch, n): c for c, n in enumerate(DTYPE_NAMES)}
_VALID = ", ".join(DTYPE_NAMES)
# Communicator.fast_all_reduce's arguments: the exact tensor types, dtypes and ops its short
# path takes (anything else goes through view_of); None without torch.
fast_call_args: tuple | None = None
if torch is not None:
    fast_call_args = (
        (torch.Tensor, torch.nn.Parameter),
        _TORCH_CODES,
        torch.strided,
        _OP_CODE_OF_NAME,
    )


class View(NamedTuple):
    ptr: int
    count: int
    dtype: int
    nbytes: int
    # (kind code, index, stream) of a device buffer (pyring/runtime/devices.py); None on the host.
    device: tuple | None = None


_STRIDED = torch.strided if torch is not None else None
_Tensor = torch.Tensor if torch is not None else ()
_new_view = tuple.__new__


def first_tensor(obj: Any) -> Any:
    """The first torch tensor in ``obj`` (a tensor, or nested lists and tuples of them), else
    None."""
    if isinstance(obj, _Tensor):
        return obj
    if isinstance(obj, (list, tuple)):
        for item in obj:
            found = first_tensor(item)
            if found is not None:
                return found
    return None


def view_of(obj: Any, op: str, name: str, writable: bool = False,
            devices: bool = False) -> View:
    """Validates ``obj`` as argument ``name`` of ``op`` and returns its view. With
    ``devices``, device buffers are taken too (pyring/runtime/devices.py); else they are refused."""
    if isinstance(obj, _Tensor):
        code = _TORCH_CODES.get(obj.dtype)
        if code is None or obj.layout is not _STRIDED or not obj.is_cpu or not obj.is_contiguous():
            if devices and code is not None and _devices.is_torch_device(obj) \
                    and obj.layout is _STRIDED and obj.is_contiguous():
                return _devices.torch_device_view(obj, code, View)
            _reject_torch(obj, op, name, code, devices)
        n = obj.numel()
        return _new_view(View, (obj.data_ptr(), n, code, n * _SIZES[code], None))
    if isinstance(obj, np.ndarray):
        return _numpy_view(obj, op, name, writable)
    if _devices.is_device_object(obj):
        if not devices:
            raise ValueError(f"{op}: {name} is device memory ({type(obj).__name__}); {op} "
                             f"takes host buffers only")
        if type(obj).__name__ == "PyCapsule":  # DLPack: taken as the torch tensor it holds
            import torch.utils.dlpack

            return view_of(torch.utils.dlpack.from_dlpack(obj), op, name, writable, devices)
        return _devices.interface_view(obj, op, name, writable, View)
    raise TypeError(
        f"{op}: {name} must be a torch.Tensor or numpy.ndarray, or device memory (an object "
        f"with __cuda_array_interface__, a DLPack capsule), got {type(obj).__name__}"
    )


def _reject_torch(t: Any, op: str, name: str, code: int | None, devices: bool = False) -> None:
    if code is None:
        raise TypeError(f"{op}: {name} has unsupported dtype {t.dtype} (supported: {_VALID})")
    if t.layout != torch.strided:
        raise TypeError(f"{op}: {name} has layout {t.layout}; only dense (strided) tensors work")
    if t.device.type != "cpu" and (not devices or not _devices.is_torch_device(t)):
        takes = "CPU and CUDA tensors" if devices else "CPU tensors only"
        raise ValueError(f"{op}: {name} is on device {t.device}; {op} takes {takes}")
    raise ValueError(
        f"{op}: {name} is not contiguous (shape {tuple(t.shape)}, stride {t.stride()}); "
        "call .contiguous() first"
    )


def _numpy_view(a: np.ndarray, op: str, name: str, writable: bool,
                any_dtype: bool = False) -> View:
    code = _NUMPY_CODES.get(a.dtype, -1 if any_dtype else None)
    if code is None:
        raise TypeError(f"{op}: {name} has unsupported dtype {a.dtype} (supported: {_VALID})")
    if not a.flags.c_contiguous:
        raise ValueError(f"{op}: {name} is not C-contiguous (shape {a.shape}, strides {a.strides})")
    if writable and not a.flags.writeable:
        raise ValueError(f"{op}: {name} is read-only")
    return View(a.ctypes.data, a.size, code, a.nbytes, None)


def check_same_dtype(op: str, a: View, b: View, a_name: str, b_name: str) -> None:
    if a.dtype != b.dtype:
        raise TypeError(
            f"{op}: {a_name} is {DTYPE_NAMES[a.dtype]} but {b_name} is {DTYPE_NAMES[b.dtype]}"
        )


def overlaps(a: View, b: View) -> bool:
    return a.nbytes > 0 and b.nbytes > 0 and a.ptr < b.ptr + b.nbytes and b.ptr < a.ptr + a.nbytes


def bytes_of(obj: Any, op: str, name: str, writable: bool = False,
             devices: bool = False) -> View:
    """Like view_of, for ops that only move bytes: any element type (complex and bool too).
    The view's dtype is that of the element type when pyring has it, else -1."""
    if isinstance(obj, _Tensor):
        if obj.layout is not _STRIDED or not obj.is_cpu or not obj.is_contiguous():
            if devices and _devices.is_torch_device(obj) and obj.layout is _STRIDED \
                    and obj.is_contiguous():
                v = _devices.torch_device_view(obj, 0, View)
                return v._replace(dtype=_TORCH_CODES.get(obj.dtype, -1),
                                  nbytes=obj.numel() * obj.element_size())
            _reject_torch(obj, op, name, 0, devices)
        n = obj.numel()
        return _new_view(View, (obj.data_ptr(), n, _TORCH_CODES.get(obj.dtype, -1),
                                n * obj.element_size(), None))
    if isinstance(obj, np.ndarray):
        return _numpy_view(obj, op, name, writable, any_dtype=True)
    if _devices.is_device_object(obj):
        if devices and type(obj).__name__ == "PyCapsule":  # DLPack: the torch tensor it holds
            import torch.utils.dlpack

            return bytes_of(torch.utils.dlpack.from_dlpack(obj), op, name, writable, devices)
        if devices:
            return _devices.interface_view(obj, op, name, writable, View)
        raise ValueError(f"{op}: {name} is device memory ({type(obj).__name__}); {op} takes "
                         f"host buffers only")
    raise TypeError(
        f"{op}: {name} must be a torch.Tensor or numpy.ndarray, got {type(obj).__name__}"
    )

