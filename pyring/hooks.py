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
from .optim.compression import WIRES, GradientExchange, all_reduce_wire

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


def _compress_hook(state: Any, bucket, wire: str):
    comm = _communicator(state)
    buf = bucket.buffer()
    return all_reduce_wire(comm, buf, "avg", wire, async_op=True).get_future()


def fp16_compress_hook(state: Any, bucket):
    """DDP comm hook with torch's name: the bucket travels as float16, half the bytes of
    float32, on the compressed schedule of pyring/optim/compression.py (rounded to float16 twice,
    added in float32 once; torch's hook over gloo adds in float16 at every hop). It queues one
    collective and returns at once a future whose value is the averaged bucket, so DDP goes
    on with the backward of the next bucket while this one travels.
    ``state`` as for :func:`allreduce_hook`; works whatever DDP's own process group is."""
    return _compress_hook(state, bucket, "fp16")


def bf16_compress_hook(state: Any, bucket):
    """As :func:`fp16_compress_hook`, on the bfloat16 wire (float32's range, 8 bits of
    mantissa)."""
    return _compress_hook(state, bucket, "bf16")


# DDP refuses a hook whose __name__ is torch's "bf16_compress_hook" unless NCCL is present;
# this one needs no NCCL, so it answers to torch's name as an attribute only.
bf16_compress_hook.__name__ = bf16_compress_hook.__qualname__ = "pyring_bf16_compress_hook"


class CompressedHookState:
    """The state of :func:`compressed_hook`: the communicator (None: the default one, as for
    :func:`allreduce_hook`), the ``wire`` (any of ``pyring.optim.compression.WIRES`` but fp32)
    and a :class:`pyring.GradientExchange` on it holding, for a wire with error feedback, each
    bucket's residuals, keyed by the bucket's index and size (DDP rebuilds its buckets once,
    after the first iteration). ``state_dict()`` checkpoints them."""

    def __init__(self, comm: Communicator | None = None, wire: str = "onebit") -> None:
        if wire not in WIRES[1:]:
            raise ValueError(f"pyring.hooks: wire={wire!r} is not a compressed wire "
                             f"(valid: {', '.join(WIRES[1:])})")
        self.comm = comm
        self.wire = wire
        self.exchange = GradientExchange(wire)

    def state_dict(self) -> dict:
        return self.exchange.state_dict()

    def load_state_dict(self, sd: dict) -> None:
        self.exchange.load_state_dict(sd)


def compressed_hook(state: CompressedHookState, bucket):
    """DDP comm hook: averages the bucket on ``state.wire`` (pyring/optim/compression.py), with
    error feedback where the wire keeps it. ``state`` is a :class:`CompressedHookState`, one
    per DDP model. Queues one collective and returns at once a future whose value is the
    averaged bucket."""
    if not isinstance(state, CompressedHookState):
        raise TypeError(f"pyring.hooks.compressed_hook: state must be a "
                        f"pyring.hooks.CompressedHookState, got {type(state).__name__}")
    comm = _communicator(state.comm)
    buf = bucket.buffer()
    # DDP rebuilds its buckets after the first iteration: a bucket is its index and size.
    return state.exchange.average(comm, buf, (bucket.index(), buf.numel())).get_future()


class OneBitHookState(CompressedHookState):
    """The state of :func:`onebit_hook`: :class:`CompressedHookState` on the one-bit wire."""

    def __init__(self, comm: Communicator | None = None) -> None:
        super().__init__(comm, "onebit")


def onebit_hook(state: OneBitHookState, bucket):
    """DDP comm hook: averages the bucket on the one-bit wire with error feedback (signs and a
    scale per chunk; pyring/optim/compression.py), about 1/32 of float32's bytes. ``state`` is a
    :class:`OneBitHookState`, one per DDP model. Queues one collective and returns at once a
    future whose value is the averaged bucket."""
    if not isinstance(state, OneBitHookState):
        raise TypeError(f"pyring.hooks.onebit_hook: state must be a "
                        f"pyring.hooks.OneBitHookState, got {type(state).__name__}")
    return compressed_hook(state, bucket)
