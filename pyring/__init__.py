"""pyring: fast ring collectives for PyTorch over shared memory and TCP.

    import pyring
    comm = pyring.init()            # torchrun's environment, or an existing process group
    pyring.all_reduce(tensor)       # in place, summed across ranks
"""

import atexit as _atexit
from pathlib import Path as _Path

from . import _source_tree

# From a clone's root the unbuilt tree shadows the installed package: its modules load from
# the installed copy, or the import fails saying how to fix it (pyring/_source_tree.py).
_installed = _source_tree.resolve(_Path(__file__).resolve().parent)
if _installed is not None:
    __path__[:] = _installed  # noqa: F821 (the package's own __path__)

from . import _C, api  # noqa: E402
from .api import DELEGATED as _DELEGATED  # noqa: E402
from .api import (  # noqa: E402
    all_gather_into_tensor,
    all_reduce,
    barrier,
    broadcast,
    default,
    destroy,
    empty,
    init,
    is_initialized,
    reduce_scatter_tensor,
    reset_stats,
    stats,
)
from .communicator import Communicator  # noqa: E402
from .errors import CommError, CommTimeout, CudaError, DesyncError, Error  # noqa: E402
from .ops import ReduceOp  # noqa: E402
from .topology import Topology  # noqa: E402
from .work import Work  # noqa: E402

__version__ = "0.1.0"

# At interpreter exit pyring's threads start no more Python and finish what they run first:
# Python would end a thread that takes the GIL while it finalizes by unwinding it through
# frames that cannot unwind (std::terminate; csrc/bindings/bindings.h, PythonEntry).
_atexit.register(_C.drain_python_callbacks, 10.0)


def cuda_device_count() -> int:
    """CUDA devices pyring's kernels can see (0 without CUDA, a driver or a GPU)."""
    return _C.cuda_device_count()


__all__ = [
    "Communicator", "CommError", "CommTimeout", "CudaError", "DesyncError", "Error",
    "ReduceOp", "Work",
    "init", "destroy", "default", "is_initialized", "empty",
    "all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor", "barrier",
    "cuda_device_count", "stats", "reset_stats", "Topology",
    # api.DELEGATED, spelt out for static readers (the API reference); tests/test_docs.py
    # checks the two agree.
    "send", "recv", "isend", "irecv", "batch_isend_irecv", "reduce", "gather", "scatter",
    "all_to_all_single", "all_to_all", "all_reduce_coalesced", "all_gather_coalesced",
]
globals().update({_name: getattr(api, _name) for _name in _DELEGATED})
from .c10d import backend as _backend  # registers the "pyring" torch.distributed backend  # noqa: E402, F401

__all__ += ["DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state", "hooks",
            "OneBitState", "GradientExchange", "PeriodicAveraging"]
from . import hooks  # noqa: E402
from .optim import DistributedOptimizer  # noqa: E402
from .optim.compression import GradientExchange, OneBitState  # noqa: E402
from .optim.periodic import PeriodicAveraging  # noqa: E402
from .optim.state import broadcast_optimizer_state, broadcast_parameters  # noqa: E402
