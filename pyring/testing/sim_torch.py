"""torch tensors on the sim device, for tests: ``torch.device("sim:N")``.

:func:`enable` registers the sim device as torch's PrivateUse1 backend, named ``sim``. After it,
``model.to("sim:0")``, ``torch.zeros(3, device="sim:1")`` and autograd work as on a GPU, and
pyring takes such tensors where it takes CUDA tensors, so the optimizer, the hooks and the
backend run their device paths in CI.

The contract, as CUDA's:
- Every operation on sim tensors is queued on the current sim stream of its device
  (:func:`pyring.testing.sim.current_stream`) and runs on that stream's thread, after
  ``PYRING_SIM_DELAY_US``'s random delay. The host does not wait for it.
- Reading values on the host (``.cpu()``, ``.item()``, ``.tolist()``, a copy into a CPU tensor)
  waits for the current stream first, as a blocking device-to-host copy does.
- A host tensor read by a queued operation is copied when the operation is queued, as a copy
  from pageable host memory is.
- Memory is freed stream-ordered: once no tensor holds it, its free is queued on the stream
  that allocated it (at once if that stream was closed, which drained it), so work queued
  before on that stream still sees it. Work on another
  stream must hold a reference (or the tensor's memory may be reused), exactly what
  ``record_stream`` guards against on a GPU.

Ops that take seeded randomness or return host values run at once, after a wait. Autograd
runs backward on torch's device thread, whose current sim stream is the default one: train on
the default stream (a user stream orders the collectives called under it, not backward).
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

import torch
from torch.utils._pytree import tree_map

from .. import _C
from . import sim

NAME = "sim"
_aten = torch.ops.aten
_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_lock = threading.Lock()
_enabled: list[Any] = []  # the torch.library.Library holding the fallback, once enabled
# Sim memory in use by tensors: storage -> (device, address, allocating stream).
_live: list[tuple[Any, int, int, sim.SimStream]] = []
_sweep_at = [64]
# Sim memory pyring allocated (pyring.empty): storage -> the object whose life holds it.
_adopted: list[tuple[Any, Any]] = []


def enable() -> None:
    """Registers the ``sim`` device with torch (once per process). Raises RuntimeError when
    another backend already holds PrivateUse1."""
    with _lock:
        if _enabled:
            return
        current = torch._C._get_privateuse1_backend_name()
        if current not in ("privateuseone", NAME):
            raise RuntimeError(f"sim_torch: torch's PrivateUse1 is already {current!r}")
        from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

        _setup_privateuseone_for_python_backend(NAME, backend_module=_Module())
        lib = torch.library.Library("_", "IMPL")  # noqa: TOR901 - a fallback, not an op
        lib.fallback(_fallback, "PrivateUse1")
        _enabled.append(lib)
        from ..runtime import symmetric

        symmetric.register_adopter(NAME, adopt)
        from ..c10d import backend  # the torch backend takes sim tensors as it takes CUDA ones

        caps = torch.distributed.Backend.backend_capability[backend.BACKEND_NAME]
        if NAME not in caps:
            caps.append(NAME)


class _Module:
    """torch.sim: what torch asks of a device module."""

    def is_initialized(self) -> bool:
        return True

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        return 0

    def _is_in_bad_fork(self) -> bool:
        return False

    def manual_seed_all(self, seed: int) -> None:
        pass

    def device_count(self) -> int:
        return 1  # torch's Python device guard knows device 0 alone

    def synchronize(self, device: Any = None) -> None:
        sim.current_stream(0).synchronize()


def is_sim(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == NAME


def _host_alias(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor over the same memory (for queued kernels and host reads)."""
    st = t.untyped_storage()
    cpu = torch._C._construct_storage_from_data_pointer(_C.sim_host_view(st.data_ptr()),
                                                         torch.device("cpu"), st.nbytes())
    return torch.empty(0, dtype=t.dtype).set_(cpu, t.storage_offset(), t.size(), t.stride())


def _new(size: Any, stride: Any, dtype: torch.dtype, index: int) -> torch.Tensor:
    """An uninitialised sim tensor with this size and stride on sim device ``index``."""
    if index != 0:
        raise RuntimeError(f"sim_torch: sim:{index} is not available to torch: a Python device "
                           f"backend has one device, sim:0 (its ranks share it, as ranks share "
                           f"a GPU)")
    span = 1 + sum((s - 1) * st for s, st in zip(size, stride)) if all(size) else 0
    nbytes = span * torch.empty((), dtype=dtype).element_size()
    stream = sim.current_stream(index)
    _sweep()
    if _adopted:
        _release_adopted()
    ptr = _C.sim_alloc(index, max(nbytes, 1))
    storage = torch._C._construct_storage_from_data_pointer(
        ptr, torch.device(NAME, index), nbytes)
    t = torch._C._acc.create_empty_tensor([0], dtype)
    _aten.set_.source_Storage_storage_offset.redispatch(_CPU_KEYS, t, storage, 0, size, stride)
    with _lock:
        _live.append((storage, index, ptr, stream))
    return t


def adopt(ptr: int, nbytes: int, index: int, owner: Any) -> torch.Tensor:
    """A uint8 sim tensor over ``nbytes`` of sim memory at ``ptr`` that ``owner`` holds (a
    symmetric block): ``owner`` lives while any tensor or storage over the memory does. As with
    memory torch did not allocate on a GPU, dropping the last tensor does not wait for work
    queued on it: synchronize first."""
    _release_adopted()
    storage = torch._C._construct_storage_from_data_pointer(
        ptr, torch.device(NAME, index), nbytes)
    t = torch._C._acc.create_empty_tensor([0], torch.uint8)
    _aten.set_.source_Storage_storage_offset.redispatch(_CPU_KEYS, t, storage, 0, [nbytes], [1])
    with _lock:
        _adopted.append((storage, owner))
    return t


def _release_adopted() -> None:
    """Drops the owners of adopted memory no tensor holds any more."""
    with _lock:
        gone = [e for e in _adopted if torch._C._storage_Use_Count(e[0]._cdata) == 1]
        _adopted[:] = [e for e in _adopted if torch._C._storage_Use_Count(e[0]._cdata) != 1]
    del gone  # owners released outside the lock


def _sweep() -> None:
    """Queues the free of memory no tensor holds any more on the stream that allocated it."""
    with _lock:
        if len(_live) < _sweep_at[0]:
            return
        keep, gone = [], []
        for entry in _live:
            # Held by this list alone: no tensor or storage object refers to it.
            (gone if torch._C._storage_Use_Count(entry[0]._cdata) == 1 else keep).append(entry)
        _live[:] = keep
        _sweep_at[0] = max(64, 2 * len(keep))
    for _storage, index, ptr, stream in gone:
        if stream.closed:  # drained when it closed: nothing queued on it can still read
            _C.sim_free(index, ptr)
        else:
            stream.launch(lambda index=index, ptr=ptr: _C.sim_free(index, ptr))


def _device_of(args: Any, kwargs: dict) -> int:
    found: list[int] = []

    def look(x: Any) -> Any:
        if is_sim(x):
            found.append(x.device.index)
        elif isinstance(x, torch.device) and x.type == NAME:
            found.append(x.index or 0)
        return x

    tree_map(look, (args, kwargs))
    if len(set(found)) > 1:
        raise RuntimeError(f"sim_torch: one operation on sim devices {sorted(set(found))}")
    return found[0] if found else 0


def _to_host(x: Any, snapshot: bool) -> Any:
    if is_sim(x):
        return _host_alias(x)
    if isinstance(x, torch.device) and x.type == NAME:
        return torch.device("cpu")
    if snapshot and isinstance(x, torch.Tensor):
        return x.detach().clone()  # a queued kernel reads the value of now
    return x


def _to_meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device="meta")
    if isinstance(x, torch.device):
        return torch.device("meta")
    return x


def _targets(op: Any, args: Any, kwargs: dict) -> list[tuple[str, Any]]:
    """(name, value) of each argument ``op`` writes (in-place self, out=), in schema order."""
    named = dict(zip([a.name for a in op._schema.arguments], args))
    named.update(kwargs)
    return [(a.name, named.get(a.name)) for a in op._schema.arguments
            if a.alias_info is not None and a.alias_info.is_write]


def _returned(op: Any, targets: list[tuple[str, Any]]) -> Any:
    """What an operation that wrote ``targets`` returns: the written tensor(s), or None."""
    if not op._schema.returns:
        return None
    return targets[0][1] if len(targets) == 1 else tuple(t for _, t in targets)


def _resize(t: torch.Tensor, size: Any) -> torch.Tensor:
    """resize_ on a sim tensor: new metadata now; growing moves it to new memory, and the old
    contents are copied there by a kernel on the current stream."""
    size = list(size)
    stride, acc = [0] * len(size), 1
    for i in range(len(size) - 1, -1, -1):
        stride[i], acc = acc, acc * max(size[i], 1)
    need = (t.storage_offset() + (acc if all(size) else 0)) * t.element_size()
    st = t.untyped_storage()
    if need > st.nbytes():
        fresh = _new([need // t.element_size()], [1], t.dtype, t.device.index or 0)
        old = _host_alias(t) if t.numel() else None
        if old is not None:
            dest = _host_alias(fresh)[t.storage_offset():t.storage_offset() + t.numel()]
            sim.current_stream(t.device.index or 0).launch(
                lambda: dest.copy_(old.reshape(-1)))
        st = fresh.untyped_storage()
    _aten.set_.source_Storage_storage_offset.redispatch(_CPU_KEYS, t, st, t.storage_offset(),
                                                         size, stride)
    return t


def _resize_outputs(op: Any, args: Any, kwargs: dict, targets: list) -> None:
    """An out= operation resizes its outputs first (on a GPU, before its kernel is queued)."""
    if not any(name.startswith("out") for name, _ in targets):
        return
    metas = tree_map(_to_meta, (args, kwargs))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # meta kernels warn of the resizes they make
            op(*metas[0], **metas[1])
    except Exception:  # no meta kernel: the sizes stay as they are
        return
    for (_, t), (_, m) in zip(targets, _targets(op, *metas)):
        if is_sim(t) and isinstance(m, torch.Tensor) and m.size() != t.size():
            _resize(t, m.size())


def _fallback(op: Any, *args: Any, **kwargs: Any) -> Any:
    if op.is_view or op.overloadpacket is _aten.set_:
        return op.redispatch(_CPU_KEYS, *args, **kwargs)  # metadata only: no data moves
    if op is _aten.resize_.default:
        return _resize(args[0], args[1])
    if op is _aten._copy_from.default:  # (src, dst, non_blocking): a copy across devices
        return _fallback(_aten.copy_.default, args[1], args[0])
    if op is _aten._copy_from_and_resize.default:
        args[1].resize_(args[0].size())
        return _fallback(_aten.copy_.default, args[1], args[0])
    index = _device_of(args, kwargs)
    stream = sim.current_stream(index)
    targets = _targets(op, args, kwargs)
    written = bool(targets)
    host_target = any(isinstance(t, torch.Tensor) and not is_sim(t) for _, t in targets)
    seeded = torch.Tag.nondeterministic_seeded in op.tags
    if written and not host_target and not seeded:
        _resize_outputs(op, args, kwargs, targets)
        host_args, host_kwargs = tree_map(lambda x: _to_host(x, True), (args, kwargs))
        stream.launch(lambda: op(*host_args, **host_kwargs))
        return _returned(op, targets)
    meta = None
    if not written and not seeded:
        try:
            meta = op(*tree_map(_to_meta, args), **tree_map(_to_meta, kwargs))
        except Exception:  # no meta kernel, or a data-dependent shape: run at once
            meta = None
    wants_host = (isinstance(kwargs.get("device"), torch.device)
                  and kwargs["device"].type == "cpu")
    outs = meta if isinstance(meta, (tuple, list)) else [meta]
    if meta is not None and not wants_host and all(isinstance(o, torch.Tensor) for o in outs):
        results = [_new(o.size(), o.stride(), o.dtype, index) for o in outs]
        host_args, host_kwargs = tree_map(lambda x: _to_host(x, True), (args, kwargs))
        dests = [_host_alias(r) for r in results]

        def kernel() -> None:
            got = op(*host_args, **host_kwargs)
            for d, g in zip(dests, got if isinstance(got, (tuple, list)) else [got]):
                d.copy_(g)

        stream.launch(kernel)
        return type(meta)(results) if isinstance(meta, (tuple, list)) else results[0]
    # Host values, seeded randomness, data-dependent shapes: wait, then run here.
    stream.synchronize()
    got = op(*tree_map(lambda x: _to_host(x, False), args),
             **tree_map(lambda x: _to_host(x, False), kwargs))
    if written:  # written through the aliases
        return _returned(op, targets)
    if wants_host:
        return got

    def back(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            r = _new(x.size(), x.stride(), x.dtype, index)
            _host_alias(r).copy_(x)  # the stream is idle: written before any later kernel
            return r
        return x

    return tree_map(back, got)


def storage_bytes() -> int:
    """Sim memory held by sim tensors now (after freeing what no tensor holds)."""
    with _lock:
        _sweep_at[0] = 0
    _sweep()
    with _lock:
        return sum(e[0].nbytes() for e in _live)
