"""Point-to-point messages and the rooted and personalised collectives of a Communicator.

Messages travel links of their own, to every peer, apart from the collectives' links: a
message never waits behind a collective. Between a pair of ranks, messages with one tag arrive
in the order they were sent; a message that arrives before its receive is posted is held in
memory until one is. Any element type moves (complex and bool too); a receive's size must
equal the message's. Every op has the communicator's deadline; a receive that never matches
fails with CommTimeout naming the peer and the tag.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from .. import _C
from ..ops import op_code
from ..work import Work
from .buffers import bytes_of, check_same_dtype, view_of
from .desync import dtype_code

_ANY = -1


def _to_device(v: Any, host: np.ndarray) -> None:
    """Copies a received message from ``host`` into the device buffer of view ``v``, on its
    stream; returns once the copy is done."""
    kind, index, stream = v.device
    _C.device_copy(kind, index, stream, v.ptr, host.ctypes.data, v.nbytes)



def _integer(value: Any, op: str, name: str) -> int:
    """``value`` as an int: Python, numpy and 0-d torch integers pass; bool and anything else
    raise TypeError naming ``name``."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise TypeError(f"{op}: {name} must be an int, got {type(value).__name__} {value!r}")

class PointToPoint:
    """Mixed into :class:`pyring.Communicator`; needs ``_c``, ``rank``, ``world_size`` and
    ``_launch``."""

    _c: Any
    rank: int
    world_size: int

    def _peer(self, peer: Any, op: str, name: str, any_ok: bool = False) -> int:
        if peer is None and any_ok:
            return _ANY
        peer = self._root(peer, op, name)
        if peer == self.rank:
            raise ValueError(f"{op}: {name}={peer} is this rank; a rank cannot message itself")
        return peer

    @staticmethod
    def _tag(tag: Any, op: str) -> int:
        tag = _integer(tag, op, "tag")
        if not -(1 << 63) <= tag < 1 << 63:
            raise ValueError(f"{op}: tag={tag} is outside the 64-bit signed range")
        return tag

    def _root(self, root: Any, op: str, name: str) -> int:
        root = _integer(root, op, name)
        if not 0 <= root < self.world_size:
            raise ValueError(f"{op}: {name}={root} is not a rank of a world of "
                             f"{self.world_size}")
        return root

    # -- point-to-point -------------------------------------------------------------------

    def isend(self, tensor: Any, dst: int, tag: int = 0) -> Work:
        """Sends ``tensor`` to rank ``dst``; the Work completes once the bytes have left
        (``tensor`` may then be reused)."""
        v, host = self._outgoing(tensor, "isend")
        w = self._c.send(v.ptr, v.nbytes, self._peer(dst, "isend", "dst"),
                         self._tag(tag, "isend"), True)
        return self._launch(tensor, (tensor, host), True, w)

    def irecv(self, tensor: Any, src: int | None = None, tag: int = 0) -> Work:
        """Receives into ``tensor`` from rank ``src`` (None: any rank); the Work's ``source``
        is the sender once it completes."""
        v = bytes_of(tensor, "irecv", "tensor", writable=True, devices=True)
        peer = self._peer(src, "irecv", "src", any_ok=True)
        if self._on_device("irecv", [v], ["tensor"]) is None:
            w = self._c.recv(v.ptr, v.nbytes, peer, self._tag(tag, "irecv"), True)
            return self._launch(tensor, (tensor,), True, w)
        host = np.empty(v.nbytes, np.uint8)
        w = self._c.recv(host.ctypes.data, v.nbytes, peer, self._tag(tag, "irecv"), True)
        self._keep(w, (tensor, host))
        return Work(w, tensor, finish=lambda: _to_device(v, host))

    def send(self, tensor: Any, dst: int, tag: int = 0) -> None:
        """Sends ``tensor`` to rank ``dst``; returns once the bytes have left."""
        v, _host = self._outgoing(tensor, "send")
        self._c.send(v.ptr, v.nbytes, self._peer(dst, "send", "dst"), self._tag(tag, "send"),
                     False)

    def recv(self, tensor: Any, src: int | None = None, tag: int = 0) -> int:
        """Receives into ``tensor`` from rank ``src`` (None: any rank); returns the sender."""
        v = bytes_of(tensor, "recv", "tensor", writable=True, devices=True)
        peer = self._peer(src, "recv", "src", any_ok=True)
        if self._on_device("recv", [v], ["tensor"]) is None:
            return self._c.recv(v.ptr, v.nbytes, peer, self._tag(tag, "recv"), False)
        host = np.empty(v.nbytes, np.uint8)
        source = self._c.recv(host.ctypes.data, v.nbytes, peer, self._tag(tag, "recv"), False)
        _to_device(v, host)
        return source

    def _outgoing(self, tensor: Any, op: str) -> tuple[Any, Any]:
        """The view a send travels from, and the host copy it keeps alive: a device buffer's
        bytes are copied to the host after the work queued on its stream (the host waits for
        that copy; point-to-point messages travel host memory)."""
        v = bytes_of(tensor, op, "tensor", devices=True)
        if self._on_device(op, [v], ["tensor"]) is None:
            return v, None
        host = np.empty(v.nbytes, np.uint8)
        kind, index, stream = v.device
        _C.device_copy(kind, index, stream, host.ctypes.data, v.ptr, v.nbytes)
        return v._replace(ptr=host.ctypes.data, device=None), host

    def batch_isend_irecv(self, ops: list) -> list[Work]:
        """Posts every op of ``ops`` and returns their Works. An op is ``('isend' | 'irecv',
        tensor, peer[, tag])`` or torch's ``P2POp``."""
        if not isinstance(ops, (list, tuple)) or not ops:
            raise ValueError("batch_isend_irecv: ops must be a non-empty list")
        parsed = []
        for op in ops:
            if isinstance(op, (tuple, list)):
                kind, tensor, peer, *rest = op
                tag = rest[0] if rest else 0
            else:
                fn = getattr(op, "op", None)
                kind = getattr(fn, "__name__", fn)
                tensor, peer, tag = op.tensor, op.peer, getattr(op, "tag", 0)
            if kind not in ("isend", "irecv"):
                raise ValueError(f"batch_isend_irecv: op {kind!r} is neither isend nor irecv")
            parsed.append((kind, tensor, peer, tag))
        return [getattr(self, kind)(tensor, peer, tag) for kind, tensor, peer, tag in parsed]

    # -- rooted and personalised collectives ----------------------------------------------

    def reduce(self, tensor: Any, dst: int = 0, op: Any = "sum",
               async_op: bool = False) -> Work | None:
        """Reduces ``tensor`` across ranks into ``tensor`` on rank ``dst``; the other ranks'
        tensors are left unchanged. It runs as an allreduce (the same bytes on the root's
        links as a reduce-scatter and a gather), so other ranks need scratch of its size."""
        dst = self._root(dst, "reduce", "dst")
        if self._detail:
            v = view_of(tensor, "reduce", "tensor", writable=self.rank == dst)
            self._check("reduce", v.count, v.dtype, op_code(op, "reduce"), dst)
        code = op_code(op, "reduce")
        if self.rank == dst:
            return self._nested(self._all_reduce, tensor, None, code, async_op, None, dst)
        # all_reduce keeps the scratch alive until the exchange completes.
        scratch = tensor.new_empty(tensor.shape) if hasattr(tensor, "new_empty") else \
            np.empty_like(tensor)
        w = self._nested(self._all_reduce, tensor, scratch, code, async_op, None, dst)
        return None if w is None else Work(w._work, tensor, ticket=w._ticket, stream=w._stream)

    def gather(self, tensor: Any, gather_list: list | None = None, dst: int = 0,
               async_op: bool = False) -> Work | None:
        """Rank ``dst`` receives every rank's ``tensor`` into ``gather_list`` (one tensor
        per rank, each of ``tensor``'s size and type); other ranks pass None."""
        dst = self._root(dst, "gather", "dst")
        src = bytes_of(tensor, "gather", "tensor", devices=True)
        views = self._blocks(gather_list, tensor, src, "gather", "gather_list",
                             self.rank == dst, writable=True)
        dev = self._on_device("gather", [src] + views,
                              ["tensor"] + [f"gather_list[{i}]" for i in range(len(views))])
        if self._detail:
            self._check("gather", src.nbytes, dtype_code(tensor.dtype), root=dst)
        w = self._c.gather(src.ptr, src.nbytes, [(v.ptr, v.nbytes) for v in views], dst,
                           async_op, dev)
        return self._launch(gather_list, (tensor, gather_list), async_op, w)

    def scatter(self, tensor: Any, scatter_list: list | None = None, src: int = 0,
                async_op: bool = False) -> Work | None:
        """Rank ``src`` sends ``scatter_list[r]`` to rank r, into ``tensor``; other ranks pass
        None."""
        src = self._root(src, "scatter", "src")
        out = bytes_of(tensor, "scatter", "tensor", writable=True, devices=True)
        views = self._blocks(scatter_list, tensor, out, "scatter", "scatter_list",
                             self.rank == src)
        dev = self._on_device("scatter", [out] + views,
                              ["tensor"] + [f"scatter_list[{i}]" for i in range(len(views))])
        if self._detail:
            self._check("scatter", out.nbytes, dtype_code(tensor.dtype), root=src)
        w = self._c.scatter([(v.ptr, v.nbytes) for v in views], out.ptr, out.nbytes, src,
                            async_op, dev)
        return self._launch(tensor, (tensor, scatter_list), async_op, w)

    def _blocks(self, tensors: Any, like: Any, view: Any, op: str, name: str, root: bool,
                writable: bool = False) -> list:
        if not root:
            if tensors:
                raise ValueError(f"{op}: {name} must be None or empty except on the root")
            return []
        if not isinstance(tensors, (list, tuple)) or len(tensors) != self.world_size:
            n = len(tensors) if isinstance(tensors, (list, tuple)) else tensors
            raise ValueError(f"{op}: {name} must hold one tensor per rank ({self.world_size}) "
                             f"on the root, got {n!r}")
        out = []
        for i, t in enumerate(tensors):
            v = bytes_of(t, op, f"{name}[{i}]", writable=writable, devices=True)
            if t.dtype != like.dtype or v.nbytes != view.nbytes:
                raise ValueError(f"{op}: {name}[{i}] is {t.dtype} of {v.count} elements but "
                                 f"tensor is {like.dtype} of {view.count}")
            out.append(v)
        return out

    def all_to_all_single(self, output: Any, input: Any, output_split_sizes: list | None = None,
                          input_split_sizes: list | None = None,
                          async_op: bool = False) -> Work | None:
        """Splits ``input`` along its first dimension and sends part j to rank j; ``output``
        receives rank j's part for this rank as its j-th part. Split sizes (rows per rank)
        default to equal parts; each pair of ranks must agree on the size between them."""
        i = bytes_of(input, "all_to_all_single", "input", devices=True)
        o = bytes_of(output, "all_to_all_single", "output", writable=True, devices=True)
        dev = self._on_device("all_to_all_single", [i, o], ["input", "output"])
        if input.dtype != output.dtype:
            raise TypeError(f"all_to_all_single: input is {input.dtype} but output is "
                            f"{output.dtype}")
        ins = self._splits(input, i, input_split_sizes, "input")
        outs = self._splits(output, o, output_split_sizes, "output")
        if self._detail:
            self._check("all_to_all_single", i.nbytes, dtype_code(input.dtype))
        w = self._c.all_to_all(ins, outs, async_op, dev)
        return self._launch(output, (output, input), async_op, w)

    def _splits(self, t: Any, v: Any, sizes: list | None, name: str) -> list:
        op, n = "all_to_all_single", self.world_size
        rows = t.shape[0] if len(t.shape) else 1
        row_bytes = v.nbytes // rows if rows else 0
        if sizes is None or len(sizes) == 0:
            if rows % n:
                raise ValueError(f"{op}: {name} has {rows} rows, not divisible by the world "
                                 f"size {n}; pass {name}_split_sizes")
            sizes = [rows // n] * n
        sizes = list(sizes)
        if len(sizes) != n or any(not isinstance(s, int) or s < 0 for s in sizes):
            raise ValueError(f"{op}: {name}_split_sizes must be {n} non-negative ints, got "
                             f"{sizes!r}")
        if sum(sizes) != rows:
            raise ValueError(f"{op}: {name}_split_sizes sum to {sum(sizes)} but {name} has "
                             f"{rows} rows")
        out, at = [], v.ptr
        for s in sizes:
            out.append((at, s * row_bytes))
            at += s * row_bytes
        return out

    def all_to_all(self, output_tensor_list: list, input_tensor_list: list,
                   async_op: bool = False) -> Work | None:
        """Sends ``input_tensor_list[j]`` to rank j, which receives it as
        ``output_tensor_list[this rank]``."""
        iv = self._tensor_list(input_tensor_list, "input_tensor_list")
        ov = self._tensor_list(output_tensor_list, "output_tensor_list", writable=True)
        dev = self._on_device("all_to_all", iv + ov,
                              [f"input_tensor_list[{j}]" for j in range(len(iv))]
                              + [f"output_tensor_list[{j}]" for j in range(len(ov))])
        ins, outs = [(v.ptr, v.nbytes) for v in iv], [(v.ptr, v.nbytes) for v in ov]
        for j, (a, b) in enumerate(zip(input_tensor_list, output_tensor_list)):
            if a.dtype != b.dtype:
                raise TypeError(f"all_to_all: input_tensor_list[{j}] is {a.dtype} but "
                                f"output_tensor_list[{j}] is {b.dtype}")
        if self._detail:
            self._check("all_to_all", sum(n for _, n in ins),
                        dtype_code(input_tensor_list[0].dtype) if ins else -1)
        w = self._c.all_to_all(ins, outs, async_op, dev)
        return self._launch(output_tensor_list, (output_tensor_list, input_tensor_list),
                            async_op, w)

    def _tensor_list(self, tensors: Any, name: str, writable: bool = False) -> list:
        if not isinstance(tensors, (list, tuple)) or len(tensors) != self.world_size:
            raise ValueError(f"all_to_all: {name} must hold one tensor per rank "
                             f"({self.world_size})")
        return [bytes_of(t, "all_to_all", f"{name}[{j}]", writable, devices=True)
                for j, t in enumerate(tensors)]

    # -- coalesced ------------------------------------------------------------------------

    def all_reduce_coalesced(self, tensors: list, op: Any = "sum",
                             async_op: bool = False) -> Work | None:
        """Reduces every tensor of ``tensors`` (one dtype) in one exchange, in place."""
        flat = self._pack(tensors, "all_reduce_coalesced")
        w = self.all_reduce(flat, op=op, async_op=async_op)

        def finish() -> None:
            at = 0
            for t in tensors:
                t.copy_(flat[at:at + t.numel()].view_as(t))
                at += t.numel()

        return self._finish_later(w, finish, tensors, async_op)

    def all_gather_coalesced(self, output_lists: list, tensors: list,
                             async_op: bool = False) -> Work | None:
        """``output_lists[r][i]`` receives ``tensors[i]`` of rank r, all in one exchange."""
        import torch

        if not isinstance(output_lists, (list, tuple)) or len(output_lists) != self.world_size:
            raise ValueError(f"all_gather_coalesced: output_lists must hold one list per rank "
                             f"({self.world_size})")
        flat = self._pack(tensors, "all_gather_coalesced")
        for r, outs in enumerate(output_lists):
            if len(outs) != len(tensors) or any(o.numel() != t.numel()
                                                for o, t in zip(outs, tensors)):
                raise ValueError(f"all_gather_coalesced: output_lists[{r}] must match tensors "
                                 f"in count and sizes")
            for i, o in enumerate(outs):
                if o.dtype != flat.dtype:
                    raise ValueError(f"all_gather_coalesced: output_lists[{r}][{i}] is "
                                     f"{o.dtype}, tensors are {flat.dtype}")
                if o.device != flat.device:
                    raise ValueError(f"all_gather_coalesced: output_lists[{r}][{i}] is on "
                                     f"{o.device}, tensors are on {flat.device}")
        out = torch.empty(flat.numel() * self.world_size, dtype=flat.dtype, device=flat.device)
        w = self.all_gather_into_tensor(out, flat, async_op=async_op)

        def finish() -> None:
            for r, outs in enumerate(output_lists):
                at = r * flat.numel()
                for o, t in zip(outs, tensors):
                    o.copy_(out[at:at + t.numel()].view_as(o))
                    at += t.numel()

        return self._finish_later(w, finish, output_lists, async_op)

    def _pack(self, tensors: Any, op: str) -> tuple:
        import torch

        if not isinstance(tensors, (list, tuple)) or not tensors:
            raise ValueError(f"{op}: tensors must be a non-empty list")
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{op}: tensors[{i}] is a {type(t).__name__}; the coalesced "
                                f"collectives take torch tensors")
        views = [view_of(t, op, f"tensors[{i}]", devices=True) for i, t in enumerate(tensors)]
        for i, v in enumerate(views[1:], 1):
            check_same_dtype(op, views[0], v, "tensors[0]", f"tensors[{i}]")
            if tensors[i].device != tensors[0].device:
                raise ValueError(f"{op}: tensors[{i}] is on {tensors[i].device} but tensors[0] "
                                 f"is on {tensors[0].device}")
        return torch.cat([t.reshape(-1) for t in tensors])

    def _finish_later(self, w: Any, finish: Any, result: Any, async_op: bool) -> Any:
        if not async_op:
            finish()
            return None
        # The copy-out runs on the caller's stream once it is ordered after the results.
        return Work(w._work, result, finish, ticket=w._ticket, stream=w._stream)
