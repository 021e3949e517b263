"""The ``pyring`` torch.distributed backend, registered by ``import pyring``.

``torch.distributed.init_process_group("pyring", ...)`` (under torchrun, or with ``store``,
``rank`` and ``world_size``) then gives a process group whose collectives run on a pyring
Communicator: the usual ``torch.distributed`` calls, DDP, ``new_group`` subgroups (one
Communicator each) and the functional collectives.

Contracts:
- Tensors are dense (non-contiguous ones, as gloo takes them, go through contiguous copies
  for the collectives and rooted ops), on the CPU, or on CUDA for the collectives (allreduce,
  broadcast, allgather, reduce_scatter; point-to-point, rooted and personalised ops take CPU
  tensors). Each call carries one tensor (c10d's lists must hold exactly one), except the
  per-rank lists (``all_gather``'s output, ``reduce_scatter``'s input,
  ``gather``/``scatter``/``alltoall``'s) and the coalesced calls, whose tensors (one dtype)
  travel packed in one exchange.
- Every op torch's CPU backends offer: the collectives, ``send``/``recv`` (any source too;
  ``isend``/``irecv``/``batch_isend_irecv`` through torch), ``reduce``, ``gather``, ``scatter``,
  ``all_to_all`` and ``all_to_all_single`` (uneven splits). Data-moving ops take any dtype,
  complex included; reductions take pyring's dtypes, complex SUM and AVG (the same reduction
  of the real view) and bool SUM, PRODUCT, MAX and MIN (any, all, any, all), as gloo gives.
- Reduce ops: SUM, AVG, MAX, MIN, PRODUCT; others raise before any byte is sent. AVG of
  integer tensors divides the (wrapping) sum, truncating toward zero, where gloo refuses it.
  A sparse COO tensor's allreduce (SUM) gathers every rank's indices and values and sums
  them.
- ``monitored_barrier`` is refused by torch itself for every backend but gloo.
- Every call returns a :class:`PyringWork`. Calls with ``asyncOp`` set (DDP, the functional
  collectives, ``async_op=True``) return at once, and the future (value: the list of output
  tensors) completes on a pyring callback thread once the outputs hold the result. torch's
  synchronous Python calls (``asyncOp`` False) run to completion before returning.
- Deadline: ``init_process_group(timeout=...)`` when given, else ``PYRING_TIMEOUT`` (300 s).
- A mixed backend string (``"cpu:pyring,cuda:nccl"``) hands the other devices' tensors to
  their backends (pyring.c10d.routes).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from _pyring_autoload.names import BACKEND_NAME, DEVICES

from .. import _settings
from ..api import init
from ..runtime.buffers import bytes_of
from ..work import Work
from .routes import backends_from_caller, route
from .tensors import _Dense, _real
from .work import PyringWork, _seconds, eager_under_compile, run_as_is

try:
    import torch
    import torch.distributed as dist
    from torch.distributed.constants import default_pg_timeout

    _ProcessGroup = dist.ProcessGroup
except (ImportError, AttributeError):  # no torch, or a torch built without distributed
    dist = None
    _ProcessGroup = object

def _one(tensors: Any, what: str) -> Any:
    """The single tensor of a c10d tensor list (a bare tensor is accepted too)."""
    if dist is not None and isinstance(tensors, torch.Tensor):
        return tensors
    if len(tensors) != 1:
        raise ValueError(f"pyring backend: {what} got {len(tensors)} tensors in one call; "
                         "pyring takes one tensor per call (flatten them into one first)")
    return tensors[0]


def _check_pieces(pieces: list, single: Any, world: int, what: str) -> None:
    if len(pieces) != world:
        raise ValueError(f"pyring backend: {what} needs {world} tensors (one per rank), "
                         f"got {len(pieces)}")
    for r, p in enumerate(pieces):
        if p.dtype != single.dtype or p.numel() != single.numel():
            raise ValueError(f"pyring backend: {what} tensor {r} is {p.dtype} with {p.numel()} "
                             f"elements, expected {single.dtype} with {single.numel()}")


_SYNC_P2P = ("send", "recv")
# Frames between torch's send/recv and the group's: torch.compile's wrappers, the routing.
_PASSED_THROUGH = (f"{os.sep}_dynamo{os.sep}", sys.modules[route.__module__].__file__)


def _called_from_sync_p2p(frame: Any) -> bool:
    """True when ``frame`` (or its caller: torch's send goes through isend) is torch's
    synchronous ``send`` or ``recv``. torch.compile's wrappers around the group's methods
    (eager_under_compile) and the routing of mixed backend strings are looked through."""
    seen = 0
    while frame is not None and seen < 2:
        code = frame.f_code
        if code.co_name in _SYNC_P2P and code.co_filename.endswith("distributed_c10d.py"):
            return True
        seen += not any(p in code.co_filename for p in _PASSED_THROUGH)
        frame = frame.f_back
    return False


def _group_topology(size: int) -> str | None:
    """An explicit PYRING_TOPOLOGY names the default group's ranks; a smaller subgroup detects
    its own topology instead."""
    import torch.distributed as dist

    spec = _settings.read("PYRING_TOPOLOGY")
    if spec in ("auto", "flat") or not dist.is_initialized() or size == dist.get_world_size():
        return None
    return "auto"


@eager_under_compile("_get_backend", "_device_types", "_allgather_base", "_reduce_scatter_base")
class ProcessGroupPyring(_ProcessGroup):
    """A torch.distributed ProcessGroup backed by one pyring Communicator (``.comm``)."""

    _routes: dict = {}  # device type -> the c10d Backend a mixed backend string gave it

    def __init__(self, store: Any, rank: int, size: int, timeout: Any = None) -> None:
        super().__init__(rank, size)
        self._group_name = self._group_desc = ""
        if timeout == default_pg_timeout:
            timeout = None  # torch's default, not the user's: PYRING_TIMEOUT applies
        self.comm = init(rank, size, store, timeout, topology=_group_topology(size),
                         set_default=False)

    def getBackendName(self) -> str:
        return BACKEND_NAME

    # c10d asks a group which devices its backends serve, and for the backend of one: to place
    # object collectives, FSDP's sharded state dicts, distributed checkpoints, timeouts. A Python
    # group registers no C++ backend, so it answers for itself: it serves DEVICES, and is its
    # own backend on each, but where a mixed backend string gave a device to another backend
    # (pyring.c10d.routes), whose timeouts torch then adjusts as usual.
    @property
    def _device_types(self) -> list:
        return [torch.device(d) for d in DEVICES]

    def _get_backend(self, device: Any) -> ProcessGroupPyring:
        kind = torch.device(device).type
        if kind not in DEVICES:
            raise RuntimeError(f"pyring backend: no backend for device {device} (it serves "
                               f"{', '.join(DEVICES)})")
        return self._routes.get(kind, self)

    # c10d keeps group names on its C++ backends; a Python group keeps its own.
    def getGroupName(self) -> str:
        return self._group_name

    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupDesc(self) -> str:
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    @staticmethod
    def _run(launch: Any, outputs: list, opts: Any, finish: Any = None) -> PyringWork:
        """Runs ``launch(async_op)``. ``asyncOp=False`` (torch's synchronous Python calls, which
        wait at once) runs it to completion here; otherwise it is queued and this returns."""
        if opts is not None and not getattr(opts, "asyncOp", True):  # torch >= 2.7
            launch(False)
            if finish is not None:
                finish()
            return PyringWork(None, outputs)
        timeout_s = _seconds(opts.timeout) if opts is not None else None
        return PyringWork(launch(True), outputs, finish, timeout_s)

    def allreduce(self, tensors: Any, opts: Any = None) -> PyringWork:
        t = _one(tensors, "allreduce")
        op = opts.reduceOp if opts is not None else "sum"
        if t.layout == torch.sparse_coo:
            self._sparse_sum(t, op)
            return PyringWork(None, [t])
        d = _Dense()
        r, rop = _real(d.output(t), op)
        return self._run(lambda a: self.comm.all_reduce(r, rop, async_op=a), [t], opts,
                         d.finish())

    def _sparse_sum(self, t: Any, op: Any) -> None:
        """A sparse COO tensor's sum over ranks, in place (coalesced), as gloo gives: every
        rank's indices and values are gathered (padded to the largest count), then summed."""
        from ..ops import op_code

        if op_code(op, "allreduce") != op_code("sum"):
            raise ValueError("pyring backend: sparse tensors reduce with SUM only")
        comm, world = self.comm, self.comm.world_size
        mine = t.coalesce()
        idx, val = mine.indices().contiguous(), mine.values().contiguous()
        counts = torch.empty(world, dtype=torch.int64)
        comm.all_gather_into_tensor(counts, torch.tensor([idx.shape[1]], dtype=torch.int64))
        most = int(counts.max())
        pad_idx = torch.zeros(idx.shape[0], most, dtype=idx.dtype)
        pad_idx[:, :idx.shape[1]] = idx
        pad_val = torch.zeros((most,) + tuple(val.shape[1:]), dtype=val.dtype)
        pad_val[:val.shape[0]] = val
        all_idx = torch.empty((world,) + tuple(pad_idx.shape), dtype=idx.dtype)
        all_val = torch.empty((world,) + tuple(pad_val.shape), dtype=val.dtype)
        comm.all_gather_into_tensor(all_idx, pad_idx)
        comm.all_gather_into_tensor(all_val, pad_val)
        keep = [slice(0, int(n)) for n in counts]
        total = torch.sparse_coo_tensor(
            torch.cat([all_idx[r][:, keep[r]] for r in range(world)], dim=1),
            torch.cat([all_val[r][keep[r]] for r in range(world)]), t.shape).coalesce()
        t.copy_(total)

    def allreduce_coalesced(self, tensors: Any, opts: Any = None) -> PyringWork:
        """Every tensor in one exchange: packed into one buffer, reduced, copied back."""
        tensors = list(tensors)
        if not tensors:
            raise ValueError("pyring backend: allreduce_coalesced needs at least one tensor")
        for i, t in enumerate(tensors):
            if t.dtype != tensors[0].dtype:
                raise ValueError(f"pyring backend: allreduce_coalesced tensor {i} is {t.dtype} "
                                 f"but tensor 0 is {tensors[0].dtype}")
        if len(tensors) == 1:
            return self.allreduce(tensors, opts)
        flat = torch.cat([t.reshape(-1) for t in tensors])
        op = opts.reduceOp if opts is not None else "sum"

        def copy_back() -> None:
            for t, piece in zip(tensors, flat.split([t.numel() for t in tensors])):
                t.copy_(piece.view_as(t))

        return self._run(lambda a: self.comm.all_reduce(flat, op, async_op=a), tensors, opts,
                         copy_back)

    def broadcast(self, tensors: Any, opts: Any = None) -> PyringWork:
        t = _one(tensors, "broadcast")
        src = opts.rootRank if opts is not None else 0
        d = _Dense()
        c = d.output(t)
        return self._run(lambda a: self.comm.broadcast(c, src, async_op=a), [t], opts,
                         d.finish())

    def allgather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> PyringWork:
        t = _Dense.input(_one(input_tensors, "allgather"))
        outs = _one(output_tensors, "allgather")
        world, n = self.comm.world_size, t.numel()
        _check_pieces(outs, t, world, "allgather output list")
        flat = torch.empty(world * n, dtype=t.dtype, device=t.device)

        def copy_out() -> None:
            for out, piece in zip(outs, flat.view(world, n)):
                out.copy_(piece.view(out.shape))

        return self._run(lambda a: self.comm.all_gather_into_tensor(flat, t, async_op=a),
                         list(outs), opts, copy_out)

    def all_gather_single(self, output: Any, input: Any, opts: Any = None) -> PyringWork:
        d = _Dense()
        out, inp = d.output(output), d.input(input)
        return self._run(lambda a: self.comm.all_gather_into_tensor(out, inp, async_op=a),
                         [output], opts, d.finish())

    def all_gather_single_coalesced(self, outputs: Any, inputs: Any,
                                    opts: Any = None) -> PyringWork:
        return self.all_gather_single(_one(outputs, "all_gather_single_coalesced"),
                                      _one(inputs, "all_gather_single_coalesced"), opts)

    # The names before torch 2.13.
    _allgather_base = all_gather_single
    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(self, output_tensors: Any, input_tensors: Any,
                       opts: Any = None) -> PyringWork:
        out = _one(output_tensors, "reduce_scatter")
        pieces = _one(input_tensors, "reduce_scatter")
        _check_pieces(pieces, out, self.comm.world_size, "reduce_scatter input list")
        flat = torch.cat([p.reshape(-1) for p in pieces])
        return self.reduce_scatter_single(out, flat, opts)

    def reduce_scatter_single(self, output: Any, input: Any, opts: Any = None) -> PyringWork:
        op = opts.reduceOp if opts is not None else "sum"
        d = _Dense()
        (out, rop), (inp, _) = _real(d.output(output), op), _real(d.input(input), op)
        return self._run(lambda a: self.comm.reduce_scatter_tensor(out, inp, rop, async_op=a),
                         [output], opts, d.finish())

    def reduce_scatter_single_coalesced(self, outputs: Any, inputs: Any,
                                        opts: Any = None) -> PyringWork:
        return self.reduce_scatter_single(_one(outputs, "reduce_scatter_single_coalesced"),
                                          _one(inputs, "reduce_scatter_single_coalesced"), opts)

    _reduce_scatter_base = reduce_scatter_single
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -- point-to-point: the Work's _source_rank() is the sender of a completed receive -----
    # torch's synchronous send and recv wait on these at once, so they skip pyring.Work.

    def send(self, tensors: Any, dstRank: int, tag: int) -> PyringWork:
        return self._p2p(self.comm._c.send, tensors, dstRank, tag, "send")

    def recv(self, tensors: Any, srcRank: int, tag: int) -> PyringWork:
        return self._p2p(self.comm._c.recv, tensors, srcRank, tag, "recv")

    def recv_anysource(self, tensors: Any, tag: int) -> PyringWork:
        return self._p2p(self.comm._c.recv, tensors, None, tag, "recv_anysource")

    def _p2p(self, call: Any, tensors: Any, peer: Any, tag: int, what: str) -> PyringWork:
        t = _one(tensors, what)
        comm = self.comm
        v = bytes_of(t, what, "tensor", writable=what != "send")
        peer = comm._peer(peer, what, "peer", any_ok=what == "recv_anysource")
        tag = comm._tag(tag, what)
        if _called_from_sync_p2p(sys._getframe(2)):
            # torch's synchronous send/recv, which wait at once: the op runs to the end here
            # (this thread drives the links, the p2p thread is left asleep) and torch's wait()
            # finds it complete.
            source = call(v.ptr, v.nbytes, peer, tag, False, True)
            return PyringWork(None, [t], source=-1 if source is None else source)
        work = call(v.ptr, v.nbytes, peer, tag, True, False)
        comm._keep(work, t)
        return PyringWork(Work(work, t), [t])

    # -- rooted and personalised ----------------------------------------------------------

    def reduce(self, tensors: Any, opts: Any = None) -> PyringWork:
        t = _one(tensors, "reduce")
        root = opts.rootRank if opts is not None else 0
        op = opts.reduceOp if opts is not None else "sum"
        d = _Dense()
        r, rop = _real(d.output(t), op)
        return self._run(lambda a: self.comm.reduce(r, root, rop, async_op=a), [t], opts,
                         d.finish())

    def gather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> PyringWork:
        t = _Dense.input(_one(input_tensors, "gather"))
        root = opts.rootRank if opts is not None else 0
        d = _Dense()
        outs = [d.output(o) for o in _one(output_tensors, "gather")] \
            if self.comm.rank == root else None
        return self._run(lambda a: self.comm.gather(t, outs, root, async_op=a),
                         list(output_tensors), opts, d.finish())

    def scatter(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> PyringWork:
        d = _Dense()
        t = _one(output_tensors, "scatter")
        out = d.output(t)
        root = opts.rootRank if opts is not None else 0
        ins = [_Dense.input(i) for i in _one(input_tensors, "scatter")] \
            if self.comm.rank == root else None
        return self._run(lambda a: self.comm.scatter(out, ins, root, async_op=a), [t], opts,
                         d.finish())

    def alltoall(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> PyringWork:
        outs, ins = list(output_tensors), list(input_tensors)
        return self._run(lambda a: self.comm.all_to_all(outs, ins, async_op=a), outs, opts)

    def alltoall_base(self, output: Any, input: Any, output_split_sizes: Any,
                      input_split_sizes: Any, opts: Any = None) -> PyringWork:
        outs, ins = list(output_split_sizes), list(input_split_sizes)
        return self._run(lambda a: self.comm.all_to_all_single(output, input, outs, ins,
                                                               async_op=a), [output], opts)

    all_to_all_single = alltoall_base

    def allgather_coalesced(self, output_lists: Any, input_list: Any,
                            opts: Any = None) -> PyringWork:
        outs, ins = [list(o) for o in output_lists], list(input_list)
        if len(ins) == 0:
            raise ValueError("pyring backend: allgather_coalesced needs at least one tensor")
        return self._run(lambda a: self.comm.all_gather_coalesced(outs, ins, async_op=a),
                         [t for o in outs for t in o], opts)

    def barrier(self, opts: Any = None) -> PyringWork:
        return self._run(lambda a: self.comm.barrier(async_op=a), [], opts)

    def shutdown(self) -> None:
        """Closes the Communicator (queued work fails with pyring.CommError) and the backends a
        mixed backend string added."""
        self.comm.close()
        for other in self._routes.values():
            other.shutdown()

    abort = shutdown

    def __repr__(self) -> str:
        return f"<ProcessGroupPyring rank {self.comm.rank} of {self.comm.world_size}>"


def _create(store: Any, rank: int, size: int, timeout: Any) -> ProcessGroupPyring:
    group = ProcessGroupPyring(store, rank, size, timeout)
    route(group, backends_from_caller(sys._getframe(1)), run_as_is)  # torch's group maker
    return group


if dist is not None and BACKEND_NAME not in dist.Backend.backend_list:
    dist.Backend.register_backend(BACKEND_NAME, _create, devices=list(DEVICES))
