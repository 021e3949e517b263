"""pyring's entry point for torch's out-of-tree backends (the ``torch.backends`` group, loaded at
``import torch`` unless TORCH_DEVICE_BACKEND_AUTOLOAD=0): ``init_process_group("pyring")``
then works without ``import pyring``. Only the name is registered here, from a module outside
pyring: pyring itself (and the torch modules it uses, not all imported yet while torch loads)
is imported when the first process group is made. Nothing here may raise: torch's own import
would fail with it."""

from __future__ import annotations

from typing import Any

from .names import BACKEND_NAME, DEVICES


def _create(*args: Any, **kwargs: Any) -> Any:
    from pyring.c10d import backend

    return backend._create(*args, **kwargs)


def register() -> None:
    try:
        import torch.distributed as dist

        if dist.is_available() and BACKEND_NAME not in dist.Backend.backend_list:
            dist.Backend.register_backend(BACKEND_NAME, _create, devices=list(DEVICES))
    except Exception:  # an old or partial torch: `import pyring` still registers the backend
        pass
