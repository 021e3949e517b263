"""The Python Communicator: validates arguments, then hands views to the core."""

from __future__ import annotations

import collections
import weakref
from typing import Any

from . import _C
from .config import ALGOS
from .ops import op_code
from .runtime import desync as _desync
from .runtime import hang as _hang
from .runtime.buffers import check_same_dtype, fast_call_args, overlaps, view_of
from .runtime.devices import common_device, waiting_stream
from .runtime.p2p import PointToPoint
from .work import Work


class Communicator(PointToPoint):
    """A group of ranks and the links between them. Create it with ``pyring.init``.

    Collectives and point-to-point calls mirror torch.distributed's names and argument
    order (pyring/runtime/p2p.py has messages and the rooted and personalised collectives). With
    ``async_op=True`` they return a :class:`Work` at once; otherwise they return None after
    completing. Every rank must call
    the same collectives in the same order with matching sizes.
    """

    def __init__(self, core: Any, *, rank: int, world_size: int, local_rank: int,
                 local_world_size: int, store: Any, transports: dict[int, str],
                 topology: Any, detail: bool = False) -> None:
        self._c = core
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.local_world_size = local_world_size
        self.store = store
        self.transports = transports
        #: The pyring.topology.Topology every rank agreed on at init.
        self.topology = topology
        self._stats_base: tuple[dict, dict, tuple] = ({}, {}, (0, 0, 0))
        self._stats_base_device: dict = {}
        self._stats_base_crossing = 0
        self._stats_base_zero_copy: dict = {}
        # Tensors of queued collectives stay referenced here until their work completes.
        self._inflight: collections.deque = collections.deque()
        self._closed = False
        # PYRING_DEBUG=DETAIL: collectives agree on their description first (_desync.py);
        # calls made by another collective's implementation (depth > 0) are not checked.
        self._detail = detail
        # all_reduce with its short path in C (csrc/bindings/fast_call.cc), which passes every
        # call it does not run itself to the method below. Not under PYRING_DEBUG=DETAIL, whose
        # checks are here, nor in a subclass that overrides all_reduce.
        if (not detail and fast_call_args is not None
                and type(self).all_reduce is Communicator.all_reduce):
            self.all_reduce = core.fast_all_reduce(*fast_call_args, self._inflight,
                                                   weakref.WeakMethod(self.all_reduce))
        #: The device this rank's collectives use ('cuda:0', 'sim:1'): set by init(device=...)
        #: or by the first call on device buffers; None while only host buffers were used.
        self.device: str | None = None
        self._desync_seq = 0
        self._desync_depth = 0
        #: Connections this rank's tcp listeners dropped during init, by why: 'silent',
        #: 'garbage', 'bad_mac' (failed authentication), 'not_expected', 'overflow'.
        self.rendezvous_dropped: dict[str, int] = {}

    @property
    def size(self) -> int:
        return self.world_size

    def _keep(self, cwork: Any, keep: Any) -> None:
        """Keeps ``keep`` (the tensors of a queued op) alive until ``cwork`` completes."""
        inflight = self._inflight
        while inflight and inflight[0][0].is_completed():
            inflight.popleft()
        inflight.append((cwork, keep))

    def _check(self, kind: str, count: int = 0, dtype: int = -1, op: int = -1, root: int = -1,
                algo: str | None = None, wire: str = "fp32") -> None:
        if self._desync_depth == 0:
            _desync.check(self, kind, count, dtype, op, root, algo, wire)

    def _nested(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Runs ``fn`` with the desync check of the collectives it calls turned off."""
        self._desync_depth += 1
        try:
            return fn(*args, **kwargs)
        finally:
            self._desync_depth -= 1

    def _launch(self, result: Any, keep: tuple, async_op: bool, cwork: Any) -> Work | None:
        if not async_op:
            inflight = self._inflight
            while inflight and inflight[0][0].is_completed():
                inflight.popleft()
            if isinstance(cwork, _C.DeviceTicket):
                # A synchronous device call returns once its host part is done, with pyring's
                # stream still copying: the buffers stay referenced until its results are in
                # place, so that no allocator hands their memory out early.
                inflight.append((cwork, keep))
            return None
        if isinstance(cwork, tuple):  # a device collective: (Work, DeviceTicket)
            cwork, ticket = cwork
            work = Work(cwork, result, ticket=ticket, stream=waiting_stream(result,
                                                                          self._device_tuple))
            # The buffers stay referenced until the device results are in place, so that no
            # allocator hands their memory out while pyring's stream still copies.
            self._keep(work, keep)
            return work
        self._keep(cwork, keep)
        return Work(cwork, result)

    def _on_device(self, op: str, views: list, names: list[str]) -> tuple | None:
        dev = common_device(self, op, views, names)
        if dev is not None:
            self._device_tuple = dev
        return dev

    @staticmethod
    def _algo_code(algo: str | None) -> int:
        if algo is None:
            return -1
        if algo in ALGOS:
            return ALGOS.index(algo)
        raise ValueError(f"all_reduce: algo={algo!r} is not valid (valid: {', '.join(ALGOS)})")

    def all_reduce(self, tensor: Any, op: Any = "sum", async_op: bool = False,
                   out: Any = None, algo: str | None = None, wire: str = "fp32",
                   state: Any = None) -> Work | None:
        """Reduces ``tensor`` across ranks into ``out`` (default: in place). ``algo``
        ('auto', 'ring', 'direct', 'tree') overrides the communicator's for this call; every rank
        must pass the same. ``wire`` (a name of the codec registry, pyring.optim.compression.WIRES:
        'fp16', 'bf16', 'onebit', 'int8'; those that keep error feedback with ``state``, a
        pyring.OneBitState per bucket) compresses what travels (pyring/optim/compression.py): op
        'sum' or 'avg' of floating torch tensors, one collective like any other (async_op applies);
        ``algo`` then lets the selector go hierarchical ('auto', 'tree') or keeps
        the flat schedule ('ring', 'direct')."""
        code = op_code(op, "all_reduce")
        self._algo_code(algo)  # refuses an unknown algo before any wire check
        if wire != "fp32":
            from .optim.compression import check_wire_call

            check_wire_call(tensor, wire, state, out)
            if out is not None and out is not tensor:
                dst = view_of(out, "all_reduce", "out", writable=True, devices=True)
                src = view_of(tensor, "all_reduce", "tensor", devices=True)
                check_same_dtype("all_reduce", src, dst, "tensor", "out")
                if dst.count != src.count:
                    raise ValueError(f"all_reduce: out has {dst.count} elements but tensor has "
                                     f"{src.count}")
                if overlaps(src, dst):
                    raise ValueError("all_reduce: out shares memory with tensor; pass out=None "
                                     "to reduce in place")
                self._on_device("all_reduce", [src, dst], ["tensor", "out"])
                out.copy_(tensor.reshape(out.shape))  # same count, any shape: as on fp32
                tensor = out
            return self._all_reduce_wire(tensor, op, wire, state, 0, async_op, algo)
        return self._all_reduce(tensor, out, code, async_op, algo)

    def _all_reduce(self, tensor: Any, out: Any, code: int, async_op: bool, algo: str | None,
                    root: int = -1) -> Work | None:
        """The full-precision all_reduce; ``root`` >= 0 makes it a reduce to that rank, which
        every rank's headers then carry (ranks naming different roots raise)."""
        algo_code = self._algo_code(algo)
        what = "reduce" if root >= 0 else "all_reduce"
        src = view_of(tensor, what, "tensor", writable=out is None, devices=True)
        if out is None:
            out, dst = tensor, src
        else:
            dst = view_of(out, what, "out", writable=True, devices=True)
            check_same_dtype(what, src, dst, "tensor", "out")
            if dst.count != src.count:
                raise ValueError(f"{what}: out has {dst.count} elements but tensor has "
                                 f"{src.count}")
            if dst.ptr != src.ptr and overlaps(src, dst):
                raise ValueError(f"{what}: out partially overlaps tensor")
        if self._detail:
            self._check("all_reduce", src.count, src.dtype, code, -1, algo or "auto")
        dev = self._on_device(what, [src, dst], ["tensor", "out"])
        if dev is not None:
            w = self._c.all_reduce(src[0], dst[0], src[1], src[2], code, async_op, algo_code,
                                   dev, root)
            return self._launch(out, (tensor, out), async_op, w)
        w = self._c.all_reduce(src[0], dst[0], src[1], src[2], code, async_op, algo_code,
                               None, root)
        if async_op or self._inflight:
            return self._launch(out, (tensor, out), async_op, w)
        return None

    def _all_reduce_wire(self, tensor: Any, op: Any, wire: str, state: Any, exact_tail: int,
                         async_op: bool, algo: str | None) -> Work | None:
        """All_reduce on a compressed wire, in place: one call into the core
        (pyring/optim/compression.py). A non-contiguous tensor goes through a contiguous copy,
        synchronously."""
        import torch

        from .optim.compression import WIRES

        code = op_code(op, "all_reduce")
        algo_code = self._algo_code(algo)
        if isinstance(tensor, torch.Tensor) and not tensor.is_contiguous():
            if async_op:
                raise ValueError(f"all_reduce: wire={wire!r} with async_op needs a contiguous "
                                 f"tensor")
            flat = tensor.contiguous()
            self._all_reduce_wire(flat, op, wire, state, exact_tail, False, algo)
            tensor.copy_(flat)
            return None
        v = view_of(tensor, "all_reduce", "tensor", writable=True, devices=True)
        if not 0 <= exact_tail <= v.count:
            raise ValueError(f"all_reduce: exact_tail={exact_tail} is not within the tensor's "
                             f"{v.count} elements")
        if self._detail:
            self._check("all_reduce", v.count, v.dtype, code, -1, algo or "auto", wire)
        core_state = state._core if state is not None else None
        dev = self._on_device("all_reduce", [v], ["tensor"])
        w = self._c.all_reduce_wire(v.ptr, v.count, v.dtype, code, WIRES.index(wire), core_state,
                                    exact_tail, async_op, algo_code, dev)
        if async_op or self._inflight or dev is not None:
            return self._launch(tensor, (tensor, state), async_op, w)
        return None

    def broadcast(self, tensor: Any, src: int = 0, async_op: bool = False) -> Work | None:
        """Copies ``tensor`` from rank ``src`` to every rank."""
        src = self._root(src, "broadcast", "src")
        v = view_of(tensor, "broadcast", "tensor", writable=True, devices=True)
        dev = self._on_device("broadcast", [v], ["tensor"])
        if self._detail:
            self._check("broadcast", v.count, v.dtype, root=src)
        w = self._c.broadcast(v.ptr, v.count, v.dtype, src, async_op, dev)
        return self._launch(tensor, (tensor,), async_op, w)

    def all_gather_into_tensor(self, out: Any, tensor: Any,
                               async_op: bool = False) -> Work | None:
        """Concatenates every rank's ``tensor`` into ``out`` (world_size times larger)."""
        src = view_of(tensor, "all_gather_into_tensor", "tensor", devices=True)
        dst = view_of(out, "all_gather_into_tensor", "out", writable=True, devices=True)
        dev = self._on_device("all_gather_into_tensor", [src, dst], ["tensor", "out"])
        check_same_dtype("all_gather_into_tensor", src, dst, "tensor", "out")
        if dst.count != src.count * self.world_size:
            raise ValueError(
                f"all_gather_into_tensor: out has {dst.count} elements, expected "
                f"world_size * tensor = {self.world_size} * {src.count} = "
                f"{self.world_size * src.count}"
            )
        own = dst.ptr + self.rank * src.nbytes
        if src.ptr != own and overlaps(src, dst):
            raise ValueError("all_gather_into_tensor: tensor overlaps out but is not this "
                             "rank's slice of it")
        if self._detail:
            self._check("all_gather_into_tensor", src.count, src.dtype)
        w = self._c.all_gather(src.ptr, dst.ptr, src.count, src.dtype, async_op, dev)
        return self._launch(out, (out, tensor), async_op, w)

    def reduce_scatter_tensor(self, out: Any, tensor: Any, op: Any = "sum",
                              async_op: bool = False) -> Work | None:
        """Reduces ``tensor`` across ranks; rank r receives slice r into ``out``."""
        code = op_code(op, "reduce_scatter_tensor")
        src = view_of(tensor, "reduce_scatter_tensor", "tensor", devices=True)
        dst = view_of(out, "reduce_scatter_tensor", "out", writable=True, devices=True)
        dev = self._on_device("reduce_scatter_tensor", [src, dst], ["tensor", "out"])
        check_same_dtype("reduce_scatter_tensor", src, dst, "tensor", "out")
        if src.count != dst.count * self.world_size:
            raise ValueError(
                f"reduce_scatter_tensor: tensor has {src.count} elements, expected "
                f"world_size * out = {self.world_size} * {dst.count} = "
                f"{self.world_size * dst.count}"
            )
        own = src.ptr + self.rank * dst.nbytes
        if dst.ptr != own and overlaps(src, dst):
            raise ValueError("reduce_scatter_tensor: out overlaps tensor but is not this rank's "
                             "slice of it")
        if self._detail:
            self._check("reduce_scatter_tensor", dst.count, src.dtype, code)
        w = self._c.reduce_scatter(src.ptr, dst.ptr, dst.count, src.dtype, code, async_op,
                                   dev)
        return self._launch(out, (out, tensor), async_op, w)

    def barrier(self, async_op: bool = False) -> Work | None:
        """Returns once every rank has entered the barrier."""
        if self._detail:
            self._check("barrier")
        return self._launch(None, (), async_op, self._c.barrier(async_op))

    def transport(self, peer: int) -> str | None:
        """'shm' or 'tcp' for a peer this rank has a link to, else None."""
        return self._c.link_kind(peer)

    def link_bytes(self, peer: int) -> tuple[int, int]:
        """(bytes sent, bytes received) over the link to ``peer``."""
        return self._c.link_bytes(peer)

    def stats(self) -> dict[str, Any]:
        """Counters since init or the last reset_stats(): this rank's ``bytes_sent`` and
        ``bytes_received``, ``links`` (peer rank -> transport and bytes each way) and
        ``calls`` (collectives run per algorithm; barriers are not counted). Byte counts
        include the 32-byte header each collective sends on every link it uses. ``p2p``
        counts the point-to-point links (messages, and the collectives that travel them:
        gather, scatter, all-to-all), 32-byte frames included; its ``single_copy_bytes`` are
        the blocks this rank read straight from a peer's memory (PYRING_SINGLE_COPY_BYTES),
        which bytes_received leaves out. A shm link's ``bytes_streamed`` are the bytes of its
        bytes_sent that were copied into the peer's slots with non-temporal stores
        (PYRING_SHM_COPY); a tcp link's ``connections`` are its TCP connections
        (PYRING_SOCKET_NSTREAMS). ``device_links`` counts the links that carry device buffers
        device to device (cuda_ipc; empty where device buffers are staged through the host).
        ``device_host_bytes`` are the bytes copied between this rank's devices and the host:
        staged buffers, and the encoded bytes of the compressed wires, whose codec runs on
        the device. ``device_memory`` is the device memory pyring holds in this process, by
        device ('cuda:0': bytes): cuda_ipc inboxes, device scratch and the compressed wires'
        residuals, allocated outside torch's caching allocator (a level, not a counter:
        reset_stats leaves it). ``zero_copy`` counts the collectives that ran zero-copy on
        symmetric tensors (``calls``, of which ``one_shot``) and the ``bytes`` this rank read
        from its peers' mappings for them, which bytes_received leaves out; ``slot_schedule``
        counts the calls on symmetric tensors that ran over the links instead (the calls of
        8 KiB and more time both ways and take the cheaper, where the host's ranks have a core
        each; docs/symmetric.md),
        ``streamed`` the zero-copy all_reduces that wrote their outputs with non-temporal stores
        (those of 16 MiB and more time both kinds of store), and ``barriers`` the barriers that
        ran on the symmetric control pages (every rank on this host, after the first
        pyring.empty);
        ``symmetric_memory`` is what pyring.empty holds now (``allocations``, ``bytes``: a
        level)."""
        links, calls = self._c.raw_stats()
        base_links, base_calls, base_p2p = self._stats_base
        p2p = self._c.p2p_bytes()
        out_links = {}
        for peer, (kind, sent, received, streamed, connections) in sorted(links.items()):
            s0, r0, t0 = base_links.get(peer, (0, 0, 0))
            out_links[peer] = {"transport": kind, "bytes_sent": sent - s0,
                               "bytes_received": received - r0}
            if kind == "shm":
                out_links[peer]["bytes_streamed"] = streamed - t0
            elif kind == "tcp":
                out_links[peer]["connections"] = connections
        device_links = {}
        for peer, (kind, sent, received) in sorted(self._c.device_link_stats().items()):
            s0, r0 = self._stats_base_device.get(peer, (0, 0))
            device_links[peer] = {"transport": kind, "bytes_sent": sent - s0,
                                  "bytes_received": received - r0}
        sym, zc0 = self._c.symmetric_stats(), self._stats_base_zero_copy
        return {
            "bytes_sent": sum(v["bytes_sent"] for v in out_links.values()),
            "bytes_received": sum(v["bytes_received"] for v in out_links.values()),
            "links": out_links,
            "calls": {a: n - base_calls.get(a, 0) for a, n in calls.items()},
            "p2p": {"bytes_sent": p2p[0] - base_p2p[0], "bytes_received": p2p[1] - base_p2p[1],
                    "single_copy_bytes": p2p[2] - base_p2p[2]},
            "device_links": device_links,
            "device_host_bytes": self._c.device_host_bytes() - self._stats_base_crossing,
            "device_memory": _C.device_memory_held(),
            "zero_copy": {"calls": sym["zero_copy_calls"] - zc0.get("zero_copy_calls", 0),
                          "one_shot": sym["one_shot_calls"] - zc0.get("one_shot_calls", 0),
                          "slot_schedule": sym["slot_calls"] - zc0.get("slot_calls", 0),
                          "streamed": sym["streamed_calls"] - zc0.get("streamed_calls", 0),
                          "barriers": sym["barriers"] - zc0.get("barriers", 0),
                          "bytes": sym["zero_copy_bytes"] - zc0.get("zero_copy_bytes", 0)},
            "symmetric_memory": {"allocations": sym["symmetric_allocations"],
                                 "bytes": sym["symmetric_bytes"]},
        }

    def empty(self, *size: Any, dtype: Any = None, device: Any = None) -> Any:
        """A tensor in symmetric memory: see :func:`pyring.empty`."""
        from .runtime.symmetric import empty
        return empty(self, *size, dtype=dtype, device=device)

    def debug_dump(self) -> list[dict[str, Any]]:
        """The flight recorder: this rank's last collectives (PYRING_FLIGHT_RECORDER, default
        256), oldest first, each a dict of ``seq``, ``kind``, ``count``, ``dtype``, ``op``,
        ``root``, ``algo`` (as the selector chose), ``start`` (wall clock, seconds since the
        epoch), ``duration_s`` (None while running), ``state`` ('running', 'completed',
        'failed', 'timed out') and ``error``. Safe to call from any thread while a collective
        runs. The same record goes to stderr the first time a collective fails. Point-to-point
        messages (send, recv) are not recorded; gather, scatter and all-to-all are, without
        an algorithm."""
        return self._c.debug_dump()

    def reset_stats(self) -> None:
        """Zeroes the counters that stats() reports."""
        links, calls = self._c.raw_stats()
        self._stats_base = ({p: (s, r, t) for p, (_, s, r, t, _) in links.items()}, dict(calls),
                            self._c.p2p_bytes())
        self._stats_base_device = {p: (s, r) for p, (_, s, r) in
                                   self._c.device_link_stats().items()}
        self._stats_base_crossing = self._c.device_host_bytes()
        self._stats_base_zero_copy = self._c.symmetric_stats()

    def close(self) -> None:
        """Finishes the work already running, fails queued work with CommError, and frees the
        links. Idempotent."""
        if not self._closed:
            self._closed = True
            _hang.unwatch(self._c)
            self._c.close()
            self._inflight.clear()

    destroy = close

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<pyring.Communicator rank {self.rank} of {self.world_size}, local "
                f"{self.local_rank} of {self.local_world_size}, topology "
                f"{self.topology.spec()}>")
