"""pyring's exception types: ``Error``, and under it ``CommError`` and ``CommTimeout``.

``CommTimeout`` is also a builtin ``TimeoutError``. Bad arguments raise ``ValueError`` or
``TypeError`` before any byte is sent.
"""

from ._C import CommError, CommTimeout, Error

__all__ = ["Error", "CommError", "CommTimeout"]
