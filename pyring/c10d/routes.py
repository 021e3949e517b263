"""Mixed backend strings (``"cpu:pyring,cuda:nccl"``, ``"cpu:gloo,cuda:pyring"``) for the
``pyring`` torch.distributed backend.

torch makes a group whose backend is written in Python the whole group: once pyring's creator
has run, torch registers no other backend, whatever the string gave the other devices. So the
pyring group hands the tensors of those devices to the backend the string names for them: the
one torch already made (devices before pyring's in the string), or one made here as torch makes
it (gloo or nccl; any other name is refused, naming the string). Every other call stays on
pyring, ``barrier`` included.

Contracts:
- ``backends_from_caller(frame)`` reads torch's group maker (``_new_process_group_helper``,
  which called pyring's creator, directly or through the entry point's); without it (another
  torch, a direct ``ProcessGroupPyring(...)``) no other backend is made: pyring serves every
  device.
- ``route(group, backends, wrap)`` sets, on that group object only, each c10d method of ROUTED to
  one that sends a call whose first tensor is on a routed device to that device's backend.
  A group with no other backend keeps the class's methods, untouched.
"""

from __future__ import annotations

from typing import Any, Callable

from _pyring_autoload.names import BACKEND_NAME

from ..runtime.buffers import first_tensor

try:
    import torch
    import torch.distributed as dist
except ImportError:  # the backend is not registered without torch
    torch = dist = None

# pyring group method -> the c10d Backend method that takes the same arguments.
ROUTED = {
    "allreduce": "allreduce", "allreduce_coalesced": "allreduce_coalesced",
    "broadcast": "broadcast", "allgather": "allgather",
    "allgather_coalesced": "allgather_coalesced",
    "all_gather_single": "_allgather_base", "_allgather_base": "_allgather_base",
    "reduce_scatter": "reduce_scatter", "reduce_scatter_single": "_reduce_scatter_base",
    "_reduce_scatter_base": "_reduce_scatter_base", "alltoall": "alltoall",
    "alltoall_base": "alltoall_base", "all_to_all_single": "alltoall_base", "send": "send",
    "recv": "recv", "recv_anysource": "recv_anysource", "reduce": "reduce", "gather": "gather",
    "scatter": "scatter",
}
_MADE_HERE = ("gloo", "nccl")
_MAKER = "_new_process_group_helper"  # torch's group maker, which calls the creator
_MAKER_DEPTH = 4


def backends_from_caller(frame: Any) -> dict[str, Any]:
    """{device type: c10d Backend} for the devices the group's backend string gives to another
    backend than pyring (see the module's contracts). `frame` is torch's group maker or a frame
    it called (the entry point's creator stands between them when pyring was not imported)."""
    for _ in range(_MAKER_DEPTH):
        if frame is None or frame.f_code.co_name == _MAKER:
            break
        frame = frame.f_back
    here = frame.f_locals if frame is not None and frame.f_code.co_name == _MAKER else {}
    config = here.get("backend_config")
    if config is None or not hasattr(config, "get_device_backend_map"):
        return {}
    pairs = {str(d): str(b) for d, b in config.get_device_backend_map().items()}
    others = {d: b for d, b in pairs.items() if b != BACKEND_NAME}
    if not others:
        return {}
    spec = ",".join(f"{d}:{b}" for d, b in pairs.items())
    out = {}
    for device, name in others.items():
        made = _made_by_torch(here.get("pg"), device)
        out[device] = made if made is not None else _make(name, device, here, spec)
    return out


def _made_by_torch(pg: Any, device: str) -> Any:
    try:
        return pg._get_backend(torch.device(device)) if pg is not None else None
    except RuntimeError:  # not made: the device comes after pyring's in the string
        return None


def _make(name: str, device: str, here: dict, spec: str) -> Any:
    """The backend `name` for `device`, with the store, rank, size and timeout torch uses."""
    if name not in _MADE_HERE:
        raise ValueError(f"pyring backend: init_process_group({spec!r}) gives {device} tensors "
                         f"to {name!r}; beside pyring a group can hand a device's tensors to "
                         f"{' or '.join(_MADE_HERE)} only")
    needed = ("prefix_store", "group_rank", "group_size", "timeout")
    if any(k not in here for k in needed):
        raise ValueError(f"pyring backend: init_process_group({spec!r}): this torch does not say "
                         f"how it makes a group's backends, so pyring cannot make {name!r} for "
                         f"{device}; give pyring the whole group, or make a second group with "
                         f"new_group(backend={name!r})")
    store = dist.PrefixStore(f"{device}/", here["prefix_store"])
    rank, size, timeout = (here[k] for k in needed[1:])
    if name == "gloo":
        backend = dist.ProcessGroupGloo(store, rank, size, timeout=timeout)
    else:
        opts = dist.ProcessGroupNCCL.Options()
        opts.is_high_priority_stream = False
        opts._timeout = timeout
        backend = dist.ProcessGroupNCCL(store, rank, size, opts)
    backend._set_sequence_number_for_group()
    return backend



def route(group: Any, backends: dict[str, Any], wrap: Callable[[Any], Any]) -> None:
    """Gives `group` (a ProcessGroupPyring) its `_routes` and per-object methods that route by
    device; `wrap` is applied to each (torch.compile's "run as it is")."""
    if not backends:
        return
    group._routes = backends
    for name, target in ROUTED.items():
        own = getattr(group, name)  # the class's method, bound

        def call(*args: Any, _own: Any = own, _target: str = target, **kwargs: Any) -> Any:
            t = first_tensor((args, list(kwargs.values())))
            other = backends.get(t.device.type) if t is not None else None
            if other is not None:
                return getattr(other, _target)(*args, **kwargs)
            return _own(*args, **kwargs)

        call.__name__ = call.__qualname__ = name
        setattr(group, name, wrap(call))
