"""The sim device from Python, for tests: arrays in sim device memory and sim streams.

A :class:`SimArray` goes wherever a user hands pyring a CUDA tensor: it exposes
``__sim_array_interface__`` (the CUDA array interface's fields plus ``device``), whose
``stream`` is the current sim stream of its device. Its operations (``fill_``, ``apply_``,
``copy_``) are kernels queued on the current stream; ``to_host()`` synchronizes that stream
and returns a copy. ``PYRING_SIM_DELAY_US`` (or :func:`set_delay_us`) delays every queued
operation by a random amount, so that a missing wait shows as a wrong result.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Iterator
from typing import Any, Callable

import torch

from .. import _C
from ..runtime import devices as _devices

_BF16 = "bfloat16"


class SimStream:
    """A sim stream: a worker thread that runs its queue in order. ``SimStream(d, id=0)`` is
    device d's default stream."""

    def __init__(self, device: int = 0, id: int | None = None, blocking: bool = False) -> None:
        """A new stream of sim device ``device`` (non-blocking, as torch's; ``blocking``: one
        that synchronizes with the legacy default stream), or the existing stream ``id``."""
        self.device = device
        self._owned = id is None
        self.closed = False  # close() drained and destroyed it
        self.id = _C.sim_create_stream(device, blocking) if id is None else id

    def launch(self, fn: Callable[[], Any]) -> None:
        """Queues fn() (it runs on the stream's thread, holding the GIL)."""
        _C.sim_launch(self.device, self.id, fn)

    def synchronize(self) -> None:
        _C.sim_synchronize(self.device, self.id)

    def close(self) -> None:
        if self._owned:
            self._owned = False
            _C.sim_destroy_stream(self.device, self.id)
            self.closed = True

    def __repr__(self) -> str:
        return f"<SimStream sim:{self.device} #{self.id}>"


_local = threading.local()


def current_stream(device: int = 0) -> SimStream:
    """This thread's current stream on sim device ``device`` (its default stream unless
    :func:`stream` says otherwise)."""
    current = getattr(_local, "streams", None)
    if current is None:
        current = _local.streams = {}
    if device not in current:
        current[device] = SimStream(device, id=0)
    return current[device]


# Buffers on sim devices are ordered on this thread's current sim stream.
_devices.register_stream_source(_devices.SIM, lambda index: current_stream(index).id)


@contextlib.contextmanager
def stream(s: SimStream) -> Iterator[SimStream]:
    """Makes ``s`` the current stream of its device inside the block."""
    current_stream(s.device)
    saved = _local.streams[s.device]
    _local.streams[s.device] = s
    try:
        yield s
    finally:
        _local.streams[s.device] = saved


def set_delay_us(us: int) -> None:
    """Every operation queued from now on waits a random 0..us microseconds first."""
    _C.sim_set_delay_us(int(us))


def device_count() -> int:
    return _C.sim_device_count()


class SimArray:
    """A contiguous array in sim device memory."""

    def __init__(self, shape: Any, dtype: torch.dtype = torch.float32, device: int = 0) -> None:
        self.shape = tuple(shape) if isinstance(shape, (tuple, list)) else (int(shape),)
        self.dtype = dtype
        self.device = device
        n = 1
        for d in self.shape:
            n *= d
        self.numel = n
        self.nbytes = n * torch.empty((), dtype=dtype).element_size()
        self.ptr = _C.sim_alloc(device, self.nbytes)
        buf = (ctypes.c_uint8 * max(self.nbytes, 1)).from_address(_C.sim_host_view(self.ptr))
        # The device memory as the streams reach it: touched only by queued operations (self.ptr
        # itself faults on the host, as a GPU's address does).
        self._mem = torch.frombuffer(buf, dtype=torch.uint8)[: self.nbytes].view(dtype).view(
            self.shape)

    @classmethod
    def from_tensor(cls, t: torch.Tensor, device: int = 0) -> SimArray:
        """A new array holding ``t``'s values, copied by an operation on the current stream."""
        a = cls(t.shape, t.dtype, device)
        a.copy_(t)
        return a

    def new_empty(self, shape: Any) -> SimArray:
        """An uninitialised array of ``shape`` with this one's dtype and device."""
        return SimArray(shape, self.dtype, self.device)

    @property
    def __sim_array_interface__(self) -> dict:
        name = str(self.dtype).removeprefix("torch.")
        typestr = _BF16 if name == _BF16 else torch.empty((), dtype=self.dtype).numpy().dtype.str
        return {"shape": self.shape, "typestr": typestr, "data": (self.ptr, False),
                "strides": None, "version": 3, "device": self.device,
                "stream": current_stream(self.device).id}

    def _queue(self, fn: Callable[[], Any]) -> SimArray:
        current_stream(self.device).launch(fn)
        return self

    def fill_(self, value: Any) -> SimArray:
        return self._queue(lambda: self._mem.fill_(value))

    def apply_(self, fn: Callable[[torch.Tensor], Any]) -> SimArray:
        """Queues fn(view of the memory) on the current stream: a kernel of the test's own."""
        return self._queue(lambda: fn(self._mem))

    def copy_(self, src: Any) -> SimArray:
        """Queues a copy from a host tensor or another SimArray of the same size."""
        if isinstance(src, SimArray):
            if src.nbytes != self.nbytes:
                raise ValueError(f"copy_: {src.nbytes} bytes into {self.nbytes}")
            _C.sim_copy(self.device, self.ptr, src.ptr, self.nbytes,
                        current_stream(self.device).id)
            return self
        host = src.detach().to(self.dtype).reshape(self.shape).clone()
        return self._queue(lambda: self._mem.copy_(host))

    def to_host(self) -> torch.Tensor:
        """Synchronizes the current stream and returns a copy of the values."""
        current_stream(self.device).synchronize()
        return self._mem.clone()

    def free(self) -> None:
        """Returns the memory to the sim device (copies queued before keep it addressable)."""
        if self.ptr:
            self._mem = None
            _C.sim_free(self.device, self.ptr)
            self.ptr = 0

    def __del__(self) -> None:
        try:
            self.free()
        except Exception:  # interpreter shutdown: _C may be gone
            pass

    def __repr__(self) -> str:
        return f"<SimArray sim:{self.device} {self.dtype} {self.shape}>"
