"""pyring's exception types: ``Error``, and under it ``CommError``, ``CommTimeout``,
``CudaError`` (a CUDA call failed: the message names the call and the device) and
``DesyncError`` (at PYRING_DEBUG=DETAIL, the ranks called different collectives: the
message names the ranks that differ and what each called).

Where torch is installed, ``Error`` (and so every one of them) is a
``torch.distributed.DistBackendError``, what torch raises for NCCL's and gloo's failures: code
that catches torch's errors, torch's elastic agent included, catches pyring's too.
``CommTimeout`` is also a builtin ``TimeoutError``. Bad arguments raise ``ValueError`` or
``TypeError`` before any byte is sent.
"""

from ._C import CommError, CommTimeout, CudaError, Error


class DesyncError(Error):
    """The ranks called different collectives (kind, size, dtype, op, root, algorithm or
    wire format), or a rank skipped one. Raised on every rank before any data moves."""


__all__ = ["Error", "CommError", "CommTimeout", "CudaError", "DesyncError"]
