"""DDP communication hooks that average gradient buckets with pyring.

    ddp = DistributedDataParallel(model)                          # any process group (gloo)
    ddp.register_comm_hook(None, pyring.hooks.allreduce_hook)     # the default communicator
    ddp.register_comm_hook(comm, pyring.hooks.allreduce_hook)     # or a given Communicator
"""

from __future__ import annotations

import threading
from typing import Any

from . import api
from .communicator import Communicator

_init_lock = threading.Lock()


def _communicator(state: Any) -> Communicator:
    if isinstance(state, Communicator):
        return state
    if state is not None:
        raise TypeError(f"pyring.hooks: state must be None or a pyring.Communicator, got "
                        f"{type(state).__name__}")
    with _init_lock:
        if not api.is_initialized():
            # Reuses the default process group's store: every rank reaches its first bucket.
            api.init()
        return api.default()


# ``bucket`` and the result stay unannotated: DDP rejects annotations other than the objects
# dist.GradBucket and torch.futures.Future[torch.Tensor], and importing those here would make
# ``import pyring`` load torch.distributed.
def allreduce_hook(state: Any, bucket):
    """DDP comm hook: averages ``bucket.buffer()`` in place across the communicator's ranks
    (op "avg") and returns a ``torch.futures.Future`` whose value is that buffer. The future is
    completed on a pyring callback thread; the autograd thread only queues the collective.

    ``state`` is a :class:`pyring.Communicator`, or None for the default communicator, created
    on first use from the default torch.distributed group's store if ``pyring.init`` has not
    been called. The communicator's ranks must be the DDP process group's, in the same order.
    """
    comm = _communicator(state)
    return comm.all_reduce(bucket.buffer(), op="avg", async_op=True).get_future()


def _compress_hook(state: Any, bucket, dtype_name: str):
    import torch

    comm = _communicator(state)
    buf = bucket.buffer()
    wire = getattr(torch, dtype_name)
    if buf.dtype == wire:
        return allreduce_hook(comm, bucket)
    half = buf.to(wire)
    fut = comm.all_reduce(half, op="avg", async_op=True).get_future()

    def back(f: Any) -> Any:
        buf.copy_(f.value())
        return buf

    return fut.then(back)


def fp16_compress_hook(state: Any, bucket):
    """DDP comm hook with torch's name: the bucket travels as float16 (half the bytes). Each
    rank adds in float32 and rounds once per hop (torch's hook over gloo adds in float16); the
    average is copied back into the bucket, whose future carries it. ``state`` as for
    :func:`allreduce_hook`; works whatever DDP's own process group is."""
    return _compress_hook(state, bucket, "float16")


def bf16_compress_hook(state: Any, bucket):
    """As :func:`fp16_compress_hook`, on the bfloat16 wire (float32's range, 8 bits of
    mantissa)."""
    return _compress_hook(state, bucket, "bfloat16")


# DDP refuses a hook whose __name__ is torch's "bf16_compress_hook" unless NCCL is present;
# this one needs no NCCL, so it answers to torch's name as an attribute only.
bf16_compress_hook.__name__ = bf16_compress_hook.__qualname__ = "pyring_bf16_compress_hook"
