"""pyring's exception types: ``Error``, and under it ``CommError``, ``CommTimeout`` and
``CudaError`` (a CUDA call failed: the message names the call and the device).

``CommTimeout`` is also a builtin ``TimeoutError``. Bad arguments raise ``ValueError`` or
``TypeError`` before any byte is sent.
"""

from ._C import CommError, CommTimeout, CudaError, Error

__all__ = ["Error", "CommError", "CommTimeout", "CudaError"]
