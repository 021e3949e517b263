"""Compressed allreduce: the wires of the core's codec registry (``WIRES``: fp16, bf16,
one-bit, int8), with error feedback for those that keep it (``FEEDBACK_WIRES``).

    state = pyring.OneBitState()                  # one per bucket, owned by the caller
    comm.all_reduce(grad, op="avg", wire="onebit", state=state)
    work = comm.all_reduce(grad, op="avg", wire="bf16", async_op=True)

Each call is one collective of the core (csrc/collectives/compressed.h), run on the
communicator's progress thread like any other, so an async call returns at once and DDP's
hooks overlap it with backward. The schedule, for every wire but fp32 (the ordinary
allreduce), on N ranks:

1. each rank compresses its tensor chunk by chunk (chunk j is owned by rank j); a wire with
   error feedback adds the state's *worker* residual first and keeps what compression dropped
   in it;
2. every compressed chunk goes to its owner;
3. the owner decompresses the N copies of its chunk and adds them in float32 (sum or avg);
4. it compresses the result again (with error feedback: the state's *server* residual);
5. every rank gets every compressed chunk, which it decompresses.

Every rank therefore ends with the same values. fp16 and bf16 round twice (steps 1 and 4) and
add in float32 once, on the owner; each byte of a float32 tensor crosses the wire as half of
one. One-bit sends, per chunk, a 16-byte header and one sign bit per element, plus a zero mask
only in chunks that hold an exact zero: an element that is zero on every rank, with zero
residuals, decodes to exactly zero, so frozen or padded parameters need no user-made mask
(csrc/kernels/onebit.h). int8 sends, per block of 256 values, a float32 scale (the block's
largest magnitude / 127) and one signed byte per value (csrc/codecs/int8/): about a quarter of
float32's bytes; its kernels run on the host, so a device tensor is staged through pinned host
memory. On a topology of several hosts with several ranks on some, the
selector makes it hierarchical: each host adds in full precision first and only its leader's
compressed chunks cross hosts. Only op "sum" and "avg" of floating tensors are accepted. A
world of one rank leaves the tensor unchanged.
"""

from __future__ import annotations

from typing import Any

from .. import _C

WIRES: tuple[str, ...] = tuple(_C.WIRE_NAMES)  # the core's codec registry, in code order
FEEDBACK_WIRES: tuple[str, ...] = tuple(_C.FEEDBACK_WIRES)  # those that need a state
# The wires without error feedback: they need no state.
STATELESS_WIRES: tuple[str, ...] = tuple(w for w in WIRES if w not in FEEDBACK_WIRES)


def check_wire(wire: Any, where: str) -> str:
    if wire not in WIRES:
        raise ValueError(f"{where}: wire={wire!r} is not valid (valid: {', '.join(WIRES)})")
    return wire


class OneBitState:
    """The error-feedback state of one bucket on one wire of ``FEEDBACK_WIRES`` (one-bit,
    int8), which the core updates on every call: ``worker`` (what this rank's compression of its
    whole tensor dropped), ``server`` (what compressing the average of the chunk it owns dropped),
    and ``masks``, the zero-mask caches of the streams this rank encodes and decodes. All start at
    zero on first use; a state serves one tensor size on one world, and refuses any other. Every
    rank must save and restore its state together, while no exchange on it is in flight: a mask
    cache restored from another step is refused on the next call. A state serves one wire: a call on
    another is refused.

    The core keeps the residuals in bfloat16, deferred (``csrc/kernels/onebit.h``): each
    segment holds the value it last encoded and that encoding's scale. ``worker`` and
    ``server`` read them settled, as float32. ``state_dict()`` holds them as kept
    (``worker`` and ``server`` bfloat16, ``scales`` and the ``shape`` they follow), so that a
    resumed job continues bit for bit; a state saved by an earlier version (float32 residuals,
    no scales) loads rounded to bfloat16."""

    def __init__(self) -> None:
        self._core = _C.WireState()

    def _settled(self) -> tuple:
        import torch

        if self._core.empty:
            return None, None
        return tuple(torch.from_numpy(a) for a in self._core.settled())

    @property
    def worker(self) -> Any:
        return self._settled()[0]

    @property
    def server(self) -> Any:
        return self._settled()[1]

    @property
    def masks(self) -> Any:
        import torch

        return None if self._core.empty else torch.from_numpy(self._core.get()[2])

    def state_dict(self) -> dict:
        import torch

        if self._core.empty:
            return {"worker": None, "server": None, "masks": None}
        worker, server, masks, scales, shape = self._core.get()
        return {"worker": torch.from_numpy(worker).view(torch.bfloat16),
                "server": torch.from_numpy(server).view(torch.bfloat16),
                "masks": torch.from_numpy(masks), "scales": torch.from_numpy(scales),
                "shape": torch.tensor(tuple(shape), dtype=torch.int64)}

    def load_state_dict(self, sd: dict) -> None:
        import numpy as np
        import torch

        self._core = _C.WireState()
        if sd.get("worker") is None:
            return

        def kept(t: Any) -> Any:  # bfloat16 bits as uint16 (rounding a float32 residual)
            return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)

        # States saved before the mask caches have none: they start empty. States saved
        # before the kept residuals have no scales: their float32 residuals are settled.
        masks = sd.get("masks")
        scales = sd.get("scales")
        self._core.set(kept(sd["worker"]), kept(sd["server"]),
                       (masks if masks is not None else torch.zeros(0, dtype=torch.uint8))
                       .to(torch.uint8).numpy(),
                       (scales if scales is not None else torch.zeros(0))
                       .to(torch.float32).numpy(),
                       [int(v) for v in sd.get("shape", ())] if scales is not None else [])


def check_wire_call(tensor: Any, wire: str, state: Any, out: Any = None) -> None:
    """What the core cannot check of an all_reduce on ``wire`` into ``out`` (None: in place):
    the Python objects. Op, dtype and sizes are the core's to refuse."""
    import torch

    check_wire(wire, "all_reduce")
    if wire in FEEDBACK_WIRES and not isinstance(state, OneBitState):
        raise ValueError(f"all_reduce: wire={wire!r} keeps error feedback and needs "
                         f"state=pyring.OneBitState() (one per bucket, kept across calls)")
    if out is not None and not (isinstance(out, torch.Tensor) and isinstance(tensor, torch.Tensor)):
        raise TypeError(f"all_reduce: out on wire={wire!r} takes torch tensors, got "
                        f"{type(tensor).__name__} and {type(out).__name__}")


def all_reduce_wire(comm: Any, tensor: Any, op: str = "avg", wire: str = "fp32",
                    state: OneBitState | None = None, algo: str | None = None,
                    async_op: bool = False, exact_tail: int = 0) -> Any:
    """Reduces ``tensor`` in place across ``comm``'s ranks on ``wire`` (see the module): one
    call into the core. Returns the tensor, or with ``async_op`` a Work whose future's value is the
    tensor. ``state`` is required for (and only used by) the wires of ``FEEDBACK_WIRES``. ``algo``
    'auto' (None) or 'tree' lets the selector go hierarchical; 'ring' and 'direct' keep the flat
    schedule. The last ``exact_tail`` elements (flags, counts) travel in full precision,
    in the same collective."""
    check_wire_call(tensor, wire, state)
    work = comm._all_reduce_wire(tensor, op, wire, state, exact_tail, async_op, algo)
    return work if async_op else tensor


def received_bytes(stats: dict) -> int:
    """The bytes this rank received in ``stats`` (Communicator.stats()): the collectives' links,
    the point-to-point links, the blocks read single copy and the bytes read zero-copy from
    the peers' symmetric memory."""
    p2p = stats["p2p"]
    return (stats["bytes_received"] + p2p["bytes_received"] + p2p["single_copy_bytes"]
            + stats["zero_copy"]["bytes"])


COMPRESSIONS = ("none",) + WIRES[1:]


class GradientExchange:
    """How buckets of gradients are averaged: the strategy that
    ``DistributedOptimizer(compression=...)`` and the DDP hooks share.

    ``compression`` "none" is the ordinary allreduce; every other wire of ``WIRES`` runs
    :func:`all_reduce_wire`, those of ``FEEDBACK_WIRES`` with one :class:`OneBitState` per
    bucket key, kept here. Both are
    asynchronous: one collective per bucket, queued on the progress thread.
    """

    def __init__(self, compression: str = "none") -> None:
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression={compression!r} is not valid "
                             f"(valid: {', '.join(COMPRESSIONS)})")
        self.compression = compression
        self.wire = "fp32" if compression == "none" else compression
        self.states: dict[Any, OneBitState] = {}

    def average(self, comm: Any, buf: Any, key: Any, exact_tail: int = 0) -> Any:
        """Starts averaging the 1-D ``buf`` in place and returns its Work at once. Its last
        ``exact_tail`` elements (flags, counts) always travel exactly, in full precision."""
        if self.compression == "none":
            return comm.all_reduce(buf, op="avg", async_op=True)
        state = (self.states.setdefault(key, OneBitState()) if self.wire in FEEDBACK_WIRES
                 else None)
        return all_reduce_wire(comm, buf, "avg", self.wire, state, async_op=True,
                               exact_tail=exact_tail)

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
