"""Compressed allreduce: the fp16, bf16 and one-bit wires, with error feedback for one-bit.

    state = pyring.OneBitState()                  # one per bucket, owned by the caller
    comm.all_reduce(grad, op="avg", wire="onebit", state=state)

The schedule, for every wire but fp32 (which is the ordinary allreduce), on N ranks:

1. each rank compresses its tensor chunk by chunk (chunk j is owned by rank j); one-bit adds
   the state's *worker* residual first and keeps what compression dropped in it;
2. an all-to-all moves every compressed chunk to its owner;
3. the owner decompresses the N copies of its chunk and adds them in float32 (sum or avg);
4. it compresses the result again (one-bit with the state's *server* residual);
5. an all-gather gives every rank every compressed chunk, which each decompresses.

Every rank therefore ends with the same values. fp16 and bf16 round twice (steps 1 and 4) and
add in float32 once, on the owner; each byte of a float32 tensor crosses the wire as half of
one. One-bit sends, per chunk, an 8-byte scale header and one sign bit per element, plus a
zero mask only in chunks that hold an exact zero: an element that is zero on every rank, with
zero residuals, decodes to exactly zero, so frozen or padded parameters need no user-made mask
(csrc/kernels/onebit.h). Only op "sum" and "avg" of floating tensors are accepted. A world of
one rank returns the tensor unchanged.
"""

from __future__ import annotations

from typing import Any

from . import _C
from .ops import op_code

WIRES = ("fp32", "fp16", "bf16", "onebit")
_HALF = {"fp16": "float16", "bf16": "bfloat16"}
_FLOATS = ("torch.float32", "torch.float64", "torch.float16", "torch.bfloat16")


def check_wire(wire: Any, where: str) -> str:
    if wire not in WIRES:
        raise ValueError(f"{where}: wire={wire!r} is not valid (valid: {', '.join(WIRES)})")
    return wire


class OneBitState:
    """The error-feedback residuals of one bucket on the one-bit wire: ``worker`` (what this
    rank's compression of its whole tensor dropped) and ``server`` (what compressing the
    average of the chunk it owns dropped), and ``masks``, the zero-mask caches of the streams
    this rank encodes and decodes. All start at zero on first use; a state serves one tensor
    size on one world, and refuses any other. Every rank must save and restore its state
    together: a mask cache restored from another step is refused on the next call."""

    def __init__(self) -> None:
        self.worker: Any = None
        self.server: Any = None
        self.masks: Any = None

    def _bind(self, n: int, chunks: list[tuple[int, int]], me: int) -> _MaskCaches:
        import torch

        own = chunks[me][1]
        caches = _MaskCaches(chunks, own)
        if self.worker is None:
            self.worker = torch.zeros(n, dtype=torch.float32)
            self.server = torch.zeros(own, dtype=torch.float32)
        elif self.worker.numel() != n or self.server.numel() != own:
            raise ValueError(f"OneBitState holds residuals for {self.worker.numel()} elements "
                             f"(server chunk {self.server.numel()}), this tensor has {n} "
                             f"(chunk {own}): use one state per bucket")
        if self.masks is None:
            self.masks = torch.zeros(caches.total, dtype=torch.uint8)
        elif self.masks.numel() != caches.total:
            raise ValueError(f"OneBitState holds {self.masks.numel()} bytes of mask caches, "
                             f"this tensor on this world needs {caches.total}")
        caches.split(self.masks)
        return caches

    def state_dict(self) -> dict:
        return {k: None if getattr(self, k) is None else getattr(self, k).clone()
                for k in ("worker", "server", "masks")}

    def load_state_dict(self, sd: dict) -> None:
        for k in ("worker", "server", "masks"):
            v = sd.get(k)  # states saved before the mask caches have none: they start empty
            setattr(self, k, None if v is None else v.clone())


class _MaskCaches:
    """Views into OneBitState.masks, one cache per stream of the schedule: ``enc[j]`` (this
    rank's chunk j to its owner), ``recv[i]`` (rank i's copy of the chunk this rank owns),
    ``server`` (the owned chunk's average to every rank) and ``gather[j]`` (owner j's average)."""

    def __init__(self, chunks: list[tuple[int, int]], own: int) -> None:
        self.sizes = ([n for _, n in chunks] + [own] * len(chunks) + [own]
                      + [n for _, n in chunks])
        self.total = sum(_C.onebit_cache_bytes(n) for n in self.sizes)

    def split(self, masks: Any) -> None:
        views, at = [], 0
        for n in self.sizes:
            b = _C.onebit_cache_bytes(n)
            views.append(masks[at:at + b])
            at += b
        w = (len(self.sizes) - 1) // 3
        self.enc, self.recv = views[:w], views[w:2 * w]
        self.server, self.gather = views[2 * w], views[2 * w + 1:]


def split_chunks(n: int, world: int) -> list[tuple[int, int]]:
    base, extra = divmod(n, world)
    out, off = [], 0
    for j in range(world):
        size = base + (1 if j < extra else 0)
        out.append((off, size))
        off += size
    return out


def _ptr(t: Any) -> int:
    return 0 if t is None else t.data_ptr()


def encode(wire: str, x: Any, residual: Any = None, cache: Any = None) -> Any:
    """``x`` (contiguous float32) compressed for ``wire`` as a uint8 tensor; one-bit takes the
    residual and the stream's encoder-side mask cache (None: none)."""
    import torch

    if wire == "onebit":
        buf = torch.empty(_C.onebit_max_bytes(x.numel()), dtype=torch.uint8)
        size = _C.onebit_encode(x.data_ptr(), _ptr(residual), x.numel(), buf.data_ptr(),
                                _ptr(cache))
        return buf[:size]
    return x.to(getattr(torch, _HALF[wire])).view(torch.uint8)


def decode(wire: str, payload: Any, alpha: float, accumulate: bool, out: Any,
           cache: Any = None) -> None:
    """out (contiguous float32) = alpha * decoded ``payload``, or += with ``accumulate``;
    ``payload`` may run on past the encoded bytes (padding). One-bit takes the stream's
    decoder-side mask cache (None: none)."""
    import torch

    if wire == "onebit":
        _C.onebit_decode(payload.data_ptr(), out.numel(), alpha, accumulate, out.data_ptr(),
                         _ptr(cache))
        return
    v = payload[:2 * out.numel()].view(getattr(torch, _HALF[wire])).to(torch.float32)
    if accumulate:
        out.add_(v, alpha=alpha)
    else:
        torch.mul(v, alpha, out=out)


def _tree_groups(comm: Any, algo: str | None) -> list | None:
    """The top-level groups (hosts) when the exchange goes hierarchical, else None."""
    if algo not in (None, "auto", "tree", "ring", "direct"):
        raise ValueError(f"all_reduce: algo={algo!r} is not valid with a compressed wire "
                         f"(valid: auto, tree, ring, direct)")
    groups = [list(g) for g in comm.topology.groups[-1]]
    several = len(groups) > 1 and max(len(g) for g in groups) > 1
    return groups if several and algo in (None, "auto", "tree") else None


def check_wire_call(tensor: Any, op: Any, wire: str, state: Any, out: Any = None) -> str:
    """Validates an all_reduce on ``wire`` into ``out`` (None: in place) before any byte is
    sent; returns the op's name ('sum' or 'avg')."""
    import torch

    check_wire(wire, "all_reduce")
    name = _C.OP_NAMES[op_code(op, "all_reduce")]
    if name not in ("sum", "avg"):
        raise ValueError(f"all_reduce: wire={wire!r} takes op 'sum' or 'avg', got {op!r}")
    if not isinstance(tensor, torch.Tensor) or str(tensor.dtype) not in _FLOATS:
        raise ValueError(f"all_reduce: wire={wire!r} takes a floating torch tensor, got "
                         f"{getattr(tensor, 'dtype', type(tensor).__name__)}")
    if wire == "onebit" and not isinstance(state, OneBitState):
        raise ValueError("all_reduce: wire='onebit' needs state=pyring.OneBitState() (one per "
                         "bucket, kept across calls)")
    if out is not None and not isinstance(out, torch.Tensor):
        raise TypeError(f"all_reduce: out must be a torch.Tensor on wire={wire!r}, got "
                        f"{type(out).__name__}")
    for what, t in (("tensor", tensor), ("out", out)):
        if t is not None and (t.device.type not in ("cpu", "cuda") or t.layout != torch.strided):
            raise ValueError(f"all_reduce: wire={wire!r} takes dense CPU or CUDA tensors, but "
                             f"{what} is {t.layout} on {t.device}")
    if out is not None and out.device != tensor.device:
        raise ValueError(f"all_reduce: tensor is on {tensor.device} but out is on {out.device}; "
                         f"every buffer of one call must be on one device")
    if out is not None and out is not tensor:
        if out.dtype != tensor.dtype:
            raise TypeError(f"all_reduce: out is {getattr(out, 'dtype', type(out).__name__)} "
                            f"but tensor is {tensor.dtype}")
        if out.shape != tensor.shape:
            raise ValueError(f"all_reduce: out has shape {tuple(out.shape)} but tensor has "
                             f"{tuple(tensor.shape)}")
        if out.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr():
            raise ValueError("all_reduce: out shares memory with tensor; pass out=None to "
                             "reduce in place")
    return name


def all_reduce_wire(comm: Any, tensor: Any, op: str = "avg", wire: str = "fp32",
                    state: OneBitState | None = None, algo: str | None = None) -> Any:
    """Reduces ``tensor`` in place across ``comm``'s ranks on ``wire`` (see the module) and
    returns it. ``state`` is required for (and only used by) the one-bit wire. ``algo``
    'auto' (None) or 'tree' goes hierarchical when the topology has several hosts and some
    host several ranks (pyring/_wire_tree.py); 'ring' and 'direct' keep the flat schedule."""
    import torch

    op = check_wire_call(tensor, op, wire, state)
    if wire == "fp32":
        comm.all_reduce(tensor, op=op)
        return tensor
    groups = _tree_groups(comm, algo)
    if comm.world_size == 1:
        return tensor
    # A CUDA tensor's wire exchange runs on a host copy, ordered on the current stream (the copy
    # to the host waits for the work queued before; the copy back is queued on the stream).
    x = tensor.reshape(-1).to("cpu", torch.float32).contiguous()  # may be tensor's own storage
    if groups is not None:
        from ._wire_tree import tree_all_reduce

        tree_all_reduce(comm, x, op, wire, state, groups)
    else:
        _flat_all_reduce(comm, x, op, wire, state)
    if x.data_ptr() != tensor.data_ptr():
        tensor.copy_(x.view(tensor.shape))
    return tensor


def _flat_all_reduce(comm: Any, x: Any, op: str, wire: str, state: OneBitState | None) -> None:
    """The flat schedule of the module docstring on the contiguous float32 ``x``, in place."""
    import torch

    world, rank = comm.world_size, comm.rank
    chunks = split_chunks(x.numel(), world)
    own_n = chunks[rank][1]
    mc = state._bind(x.numel(), chunks, rank) if wire == "onebit" else None
    if wire == "onebit":
        parts = [encode(wire, x[off:off + n], state.worker[off:off + n], mc.enc[j])
                 for j, (off, n) in enumerate(chunks)]
        send, sizes = torch.cat(parts), [p.numel() for p in parts]
        got = torch.empty(world, dtype=torch.int64)
        comm.all_to_all_single(got, torch.tensor(sizes, dtype=torch.int64))
        recv_sizes = got.tolist()
    else:
        send, sizes = encode(wire, x), [2 * n for _, n in chunks]
        recv_sizes = [2 * own_n] * world
    recv = torch.empty(sum(recv_sizes), dtype=torch.uint8)
    comm.all_to_all_single(recv, send, recv_sizes, sizes)
    # The owner adds the N copies of its chunk in float32, in rank order.
    acc = torch.zeros(own_n, dtype=torch.float32)
    alpha = 1.0 / world if op == "avg" else 1.0
    at = 0
    for i, size in enumerate(recv_sizes):
        decode(wire, recv[at:at + size], alpha, True, acc, mc and mc.recv[i])
        at += size
    mine = encode(wire, acc, state.server if mc else None, mc and mc.server)
    if wire == "onebit":
        lens = torch.empty(world, dtype=torch.int64)
        comm.all_gather_into_tensor(lens, torch.tensor([mine.numel()], dtype=torch.int64))
        width = int(lens.max())
    else:
        width = 2 * max(n for _, n in chunks)
    # all-gather needs equal blocks: every rank pads to the longest.
    block = torch.zeros(width, dtype=torch.uint8)
    block[:mine.numel()] = mine
    gathered = torch.empty(world * width, dtype=torch.uint8)
    comm.all_gather_into_tensor(gathered, block)
    for j, (off, n) in enumerate(chunks):
        decode(wire, gathered[j * width:(j + 1) * width], 1.0, False, x[off:off + n],
               mc and mc.gather[j])


def received_bytes(stats: dict) -> int:
    """The bytes this rank received in ``stats`` (Communicator.stats()): the collectives' links,
    the point-to-point links and the blocks read single copy."""
    p2p = stats["p2p"]
    return stats["bytes_received"] + p2p["bytes_received"] + p2p["single_copy_bytes"]


COMPRESSIONS = ("none", "fp16", "bf16", "onebit")


class _Completed:
    """The Work of an exchange that ran to the end before it was returned."""

    def wait(self, timeout: Any = None) -> bool:
        return True


class GradientExchange:
    """How buckets of gradients are averaged: the strategy that
    ``DistributedOptimizer(compression=...)`` and the DDP hooks share.

    ``compression`` "none" is the ordinary allreduce, asynchronous; "fp16", "bf16" and
    "onebit" run :func:`all_reduce_wire` (synchronously: the schedule is several collectives)
    with one :class:`OneBitState` per bucket key, kept here.
    """

    def __init__(self, compression: str = "none") -> None:
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression={compression!r} is not valid "
                             f"(valid: {', '.join(COMPRESSIONS)})")
        self.compression = compression
        self.wire = "fp32" if compression == "none" else compression
        self.states: dict[Any, OneBitState] = {}

    def average(self, comm: Any, buf: Any, key: Any, exact_tail: int = 0) -> Any:
        """Averages the 1-D ``buf`` in place and returns a Work to wait on. Its last
        ``exact_tail`` elements (flags, counts) always travel exactly, in full precision."""
        if self.compression == "none":
            return comm.all_reduce(buf, op="avg", async_op=True)
        head = buf[:buf.numel() - exact_tail]
        state = self.states.setdefault(key, OneBitState()) if self.wire == "onebit" else None
        all_reduce_wire(comm, head, "avg", self.wire, state)
        if exact_tail:
            comm.all_reduce(buf[buf.numel() - exact_tail:], op="avg")
        return _Completed()

    def state_dict(self) -> dict:
        return {"compression": self.compression,
                "states": {k: s.state_dict() for k, s in self.states.items()}}

    def load_state_dict(self, sd: dict) -> None:
        if sd["compression"] != self.compression:
            raise ValueError(f"GradientExchange: the state is for compression "
                             f"{sd['compression']!r}, this exchange uses {self.compression!r}")
        self.states = {}
        for k, s in sd["states"].items():
            self.states[k] = OneBitState()
            self.states[k].load_state_dict(s)
