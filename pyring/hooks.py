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
