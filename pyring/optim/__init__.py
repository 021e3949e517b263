"""Gradient averaging for any torch optimizer (broadcasts of the starting state: state.py).

    opt = pyring.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      named_parameters=model.named_parameters())
    pyring.broadcast_parameters(model, src=0)
    pyring.broadcast_optimizer_state(opt, src=0)
    for x, y in data:
        opt.zero_grad()
        loss_fn(model(x), y).backward()     # full buckets are averaged while backward runs
        opt.step()                          # waits for what is still in flight, then steps
"""

from __future__ import annotations

import collections
import contextlib
import functools
import weakref
from collections.abc import Iterator
from typing import Any

from ..api import default
from ..errors import Error
from ..runtime import symmetric as _symmetric
from ..runtime.agree import check_same_on_all_ranks, describe
from .compression import GradientExchange

_FLOATS = ("torch.float32", "torch.float64", "torch.float16", "torch.bfloat16")


class _Bucket:
    """Gradients of one dtype, flattened: the parameters' slots, then one flag per parameter
    (1 where the rank has a gradient for it, else 0)."""

    __slots__ = ("index", "members", "offsets", "numel", "buf", "bufs", "missing")

    def __init__(self, index: int) -> None:
        self.index = index
        self.members: list[int] = []  # indices into _GradSync.params
        self.offsets: list[int] = []
        self.numel = 0
        self.buf: Any = None
        self.missing = 0  # members not yet copied into buf in this window


def plan(params: list[Any], bucket_bytes: int) -> list[list[int]]:
    """Buckets as lists of indices into ``params`` (in the order their gradients are expected),
    in launch order. Each bucket holds one dtype and device; it is closed when the next
    parameter would take it past ``bucket_bytes``. The bucket launched last is then cut so that
    it holds at most ``bucket_bytes // 4`` (but at least one parameter): it can only start once
    backward is done, so what it holds is exchanged with nothing left to overlap."""
    groups: list[list[int]] = []
    size: list[int] = []
    open_: dict[Any, int] = {}
    nbytes = [p.numel() * p.element_size() for p in params]
    for i, p in enumerate(params):
        key = (p.dtype, p.device)
        g = open_.get(key)
        if g is None or size[g] + nbytes[i] > bucket_bytes:
            g = open_[key] = len(groups)
            groups.append([])
            size.append(0)
        groups[g].append(i)
        size[g] += nbytes[i]
    if groups and len(groups[-1]) > 1:
        last, tail, k = groups[-1], 0, len(groups[-1])
        while k > 1 and tail + nbytes[last[k - 1]] <= bucket_bytes // 4:
            k -= 1
            tail += nbytes[last[k]]
        k = min(k, len(last) - 1)  # the tail keeps at least its last parameter
        if k > 0 and size[-1] > bucket_bytes // 4:
            groups[-1:] = [last[:k], last[k:]]
    return groups


class _GradSync:
    """The state DistributedOptimizer attaches to an optimizer. A *window* is everything
    accumulated into the gradients since the last exchange."""

    def __init__(self, comm: Any, params: list[Any], names: list[str], bucket_bytes: int,
                 passes: int, as_view: bool, exchange: GradientExchange,
                 symmetric: bool = True, staleness: int = 0) -> None:
        import torch

        self.exchange = exchange
        self.comm, self.params, self.names, self.passes = comm, params, names, passes
        self.as_view = as_view
        groups = plan(params, bucket_bytes)
        self.buckets = [_Bucket(k) for k in range(len(groups))]
        self.where: list[tuple[_Bucket, int]] = [None] * len(params)  # type: ignore[list-item]
        for b, members in zip(self.buckets, groups):  # per parameter: (bucket, position)
            for i in members:
                self.where[i] = (b, len(b.members))
                b.members.append(i)
                b.offsets.append(b.numel)
                b.numel += params[i].numel()
        self.slots: list[Any] = [None] * len(params)  # per parameter: its view into a bucket
        for b in self.buckets:
            p0 = params[b.members[0]]
            n = b.numel + len(b.members)
            if symmetric:  # the same buckets on every rank: collective
                b.buf = _symmetric.zeros(comm, n, p0.dtype, p0.device)
            else:
                b.buf = torch.zeros(n, dtype=p0.dtype, device=p0.device)
            b.missing = len(b.members)
            for i, off in zip(b.members, b.offsets):
                p = params[i]
                self.slots[i] = b.buf[off:off + p.numel()].view(p.shape)
        # Stale-synchronous: staleness + 1 sets of buffers, one per window in flight; window w
        # fills set w % (staleness + 1).
        self.staleness = staleness
        self.window = 0
        self.pending: collections.deque = collections.deque()  # (works, set) per window
        self.slot_sets = [self.slots]
        for b in self.buckets:
            b.bufs = [b.buf]
        for _ in range(staleness):
            slots: list[Any] = [None] * len(params)
            for b in self.buckets:
                p0 = params[b.members[0]]
                n = b.numel + len(b.members)
                b.bufs.append(_symmetric.zeros(comm, n, p0.dtype, p0.device) if symmetric
                              else torch.zeros(n, dtype=p0.dtype, device=p0.device))
                for i, off in zip(b.members, b.offsets):
                    slots[i] = b.bufs[-1][off:off + params[i].numel()].view(params[i].shape)
            self.slot_sets.append(slots)
        self.counts = [0] * len(params)  # backward passes seen per parameter in this window
        self.next = 0  # buckets launch strictly in index order: this one is next
        self.inflight: list[Any] = []  # pyring.Work of the launched buckets
        # Both flags change only at points every rank reaches alike. fresh: the gradients hold
        # the last exchange's result (or were zeroed since). dirty: a gradient was accumulated
        # since the last exchange or zero_grad(). Whatever .grad holds when the optimizer is
        # wrapped counts as neither: step() averages it, zero_grad() discards it unexchanged.
        self.fresh = False
        self.dirty = False
        self.no_sync_depth = 0
        self.skip_depth = 0

    def before_grad(self, i: int) -> None:
        """Runs before a gradient is accumulated into parameter i's .grad: refuses one past the
        window's last pass, whose .grad may be its bucket slot, in flight."""
        if not self.no_sync_depth and self.counts[i] >= self.passes:
            raise Error(
                f"DistributedOptimizer: parameter {self.names[i]!r} received "
                f"{self.counts[i] + 1} gradients but backward_passes_per_step={self.passes}; "
                f"call step(), synchronize() or the optimizer's zero_grad() between windows, "
                f"or use no_sync()")

    def on_grad(self, i: int) -> None:
        self.fresh, self.dirty = False, True
        if self.no_sync_depth:
            return
        c = self.counts[i] = self.counts[i] + 1  # before_grad refused any past self.passes
        if c == self.passes:
            b, j = self.where[i]
            self.fill(b, j)
            if b.missing == 0:
                while self.next < len(self.buckets) and self.buckets[self.next].missing == 0:
                    self.launch(self.buckets[self.next])

    def fill(self, b: _Bucket, j: int) -> None:
        i = b.members[j]
        p, g, slot = self.params[i], self.params[i].grad, self.slots[i]
        if g is None:
            slot.zero_()
        elif g.layout != p.layout:
            raise Error(f"DistributedOptimizer: parameter {self.names[i]!r} has a {g.layout} "
                        f"gradient; pyring averages dense gradients only (for nn.Embedding, "
                        f"use sparse=False)")
        elif g.data_ptr() != slot.data_ptr():  # else .grad is the slot (gradient as view)
            slot.copy_(g)
            if self.as_view:
                p.grad = slot  # frees autograd's tensor now, for the allocator to reuse
        b.buf[b.numel + j] = 0 if g is None else 1
        b.missing -= 1

    def launch(self, b: _Bucket) -> None:
        self.inflight.append(self.exchange.average(self.comm, b.buf, b.index,
                                                   exact_tail=len(b.members)))
        self.next += 1

    def unpack(self, k: int | None = None) -> None:
        """Points (or copies) every .grad that some rank contributed to at its averaged slot
        (of buffer set k: the current one by default)."""
        slots = self.slots if k is None else self.slot_sets[k]
        for b in self.buckets:
            buf = b.buf if k is None else b.bufs[k]
            used = buf[b.numel:].tolist()
            for j, i in enumerate(b.members):
                if used[j] == 0:  # no rank had a gradient: leave .grad as it is
                    continue
                p, slot = self.params[i], slots[i]
                g = p.grad
                if self.as_view:
                    if g is None or g.data_ptr() != slot.data_ptr():
                        p.grad = slot
                elif g is None:
                    p.grad = slot.clone()
                else:
                    g.copy_(slot)

    def synchronize(self) -> None:
        """Exchanges the window (every bucket not yet launched, in order) and waits."""
        if self.fresh:
            return
        try:
            for b in self.buckets[self.next:]:
                for j, i in enumerate(b.members):
                    if self.counts[i] < self.passes:
                        self.fill(b, j)
                self.launch(b)
            if self.staleness:
                self.stale_unpack()
            else:
                for work in self.inflight:
                    work.wait()  # raises pyring's own error types
                self.unpack()
        finally:
            self.reset()
        self.fresh, self.dirty = True, False

    def stale_unpack(self) -> None:
        """Leaves this window's exchange in flight and gives the gradients the average of the
        window `staleness` before it; none (every .grad None: the step changes nothing) while
        there is no such window yet."""
        self.pending.append((list(self.inflight), self.window % (self.staleness + 1)))
        if len(self.pending) <= self.staleness:
            for p in self.params:
                p.grad = None
            return
        works, k = self.pending.popleft()
        for work in works:
            work.wait()
        self.unpack(k)

    def reset(self) -> None:
        self.inflight.clear()
        self.next = 0
        self.counts = [0] * len(self.params)
        for b in self.buckets:
            b.missing = len(b.members)
        if self.staleness:  # the next window fills the next set of buffers
            self.window += 1
            k = self.window % (self.staleness + 1)
            self.slots = self.slot_sets[k]
            for b in self.buckets:
                b.buf = b.bufs[k]

    def before_step(self, _opt: Any, _args: Any, _kwargs: Any) -> None:
        if self.skip_depth:
            if not self.fresh:
                raise Error("DistributedOptimizer: step() inside skip_synchronize() with "
                            "gradients not yet averaged; call synchronize() first")
            return
        self.synchronize()

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        self.no_sync_depth += 1
        try:
            yield
        finally:
            self.no_sync_depth -= 1

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        self.skip_depth += 1
        try:
            yield
        finally:
            self.skip_depth -= 1


def _pre_hook(ref: Any, i: int, _grad: Any) -> None:
    sync = ref()
    if sync is not None:
        sync.before_grad(i)


def _hook(ref: Any, i: int, _param: Any) -> None:
    sync = ref()
    if sync is not None:
        sync.on_grad(i)


def _step_hook(ref: Any, opt: Any, args: Any, kwargs: Any) -> None:
    sync = ref()
    if sync is not None:
        sync.before_step(opt, args, kwargs)


def _zero_grad(opt_ref: Any, set_to_none: bool = True) -> None:
    opt = opt_ref()
    sync = opt._pyring_sync
    if sync.dirty:
        sync.synchronize()  # every rank must launch the same buckets, even when discarding them
    type(opt).zero_grad(opt, set_to_none=set_to_none)
    sync.fresh, sync.dirty = True, False


def _remove(handles: list[Any]) -> None:
    for h in handles:
        h.remove()


def DistributedOptimizer(optimizer: Any, named_parameters: Any = None, comm: Any = None,
                         bucket_bytes: int = 25 << 20, backward_passes_per_step: int = 1,
                         gradient_as_bucket_view: bool = True, compression: str = "none",
                         symmetric_buckets: bool | None = None, staleness: int = 0) -> Any:
    """Makes ``optimizer`` average its gradients across ranks, and returns it (the same object,
    still an instance of its class, so LR schedulers and ``state_dict`` work as before).

    ``named_parameters`` (e.g. ``model.named_parameters()``) names the parameters in errors and
    fixes their order; without it they are named ``param_groups[g][i]``. ``comm`` defaults to
    ``pyring.default()``. Every rank must construct it at the same point, with the same
    parameters (names, shapes, dtypes), ``bucket_bytes`` and ``backward_passes_per_step``; a
    difference raises pyring.Error naming the parameter, on every rank, here.

    Buckets: the trainable parameters of the optimizer, in reverse registration order, fill
    buckets of one dtype each, closed when the next parameter would take one past
    ``bucket_bytes``; the bucket launched last is cut to at most ``bucket_bytes // 4`` (its
    exchange cannot overlap backward). When a parameter's gradient has been accumulated
    ``backward_passes_per_step`` times, it is copied into its bucket; a full bucket is averaged
    asynchronously (op "avg") as soon as every bucket before it has been launched.

    ``gradient_as_bucket_view`` (default True): once a gradient is copied into its bucket,
    ``.grad`` becomes its view into the bucket (autograd's tensor is freed at once, so the next
    backward reuses its memory), and after the exchange it holds the average (no copy back). It
    stays the view until the user replaces it or sets it to None; a ``.grad`` that already is
    its view is not copied, so ``zero_grad(set_to_none=False)`` windows accumulate straight into
    the bucket. Between the copy and ``synchronize()`` the view is in flight: read gradients
    only after ``synchronize()`` (or ``step()``), and clone one to keep it past the next
    exchange. False: the averages are copied into the ``.grad`` tensors autograd made.

    ``compression`` ("none", or a compressed wire of ``pyring.optim.compression.WIRES``: fp16,
    bf16, onebit, int8) is the wire the gradients travel on: a :class:`pyring.GradientExchange`,
    the strategy the DDP hooks share. "none" is the ordinary allreduce, overlapping backward; the
    others exchange each bucket as it fills, on the compressed schedule of
    pyring/optim/compression.py (onebit and int8 with error-feedback residuals per bucket, in
    ``opt.exchange.states``; ``opt.exchange.state_dict()`` checkpoints them).
    The per-parameter flags always travel exactly.

    ``staleness`` (default 0: synchronous, as before, bit for bit): stale-synchronous parallel
    (Petuum's SSP). Step t applies the average of the gradients of step t - staleness, so each
    exchange overlaps ``staleness`` steps of compute; the first ``staleness`` steps change
    nothing (no window is old enough; their ``.grad`` are None). Call ``zero_grad()`` before
    each backward, as usual; the windows still in flight when training stops are not applied.
    It takes ``compression="none"`` and ``backward_passes_per_step=1``.

    ``symmetric_buckets`` (default None: wherever the exchange can run zero-copy, that is a
    communicator whose ranks have local peers, all on this host, with CPU or CUDA parameters,
    or CPU parameters on hosts of as many ranks each): the
    buckets are ``pyring.empty`` tensors, so their all-reduces read the peers' buckets in place
    instead of copying through shm slots or device inboxes (docs/symmetric.md); the results are
    the same. False: private buckets.

    Added methods:
      - ``synchronize()``: launches the remaining buckets and waits; afterwards ``.grad``
        holds the averages. A no-op when no gradient was accumulated since the last exchange.
      - ``step()`` calls ``synchronize()`` first, so after ``synchronize()`` (e.g. to clip) it
        does not exchange again. Inside ``with opt.skip_synchronize():`` it never exchanges
        (Horovod's spelling), and raises pyring.Error if the gradients are not yet averaged.
      - ``with opt.no_sync():`` backward passes inside only accumulate locally; their gradients
        are averaged with the next window.
      - ``zero_grad(set_to_none=True)``: when the window holds gradients not yet exchanged, it
        exchanges them first (so every rank launches the same buckets), then zeroes.

    Parameters without a gradient: at exchange time a rank contributes ``.grad``, or zeros where
    ``.grad`` is None, plus a flag per parameter. Where some rank had a gradient, every rank's
    ``.grad`` becomes the average over all ranks (missing ones counting as zero), as for one
    process on the concatenated batch; where no rank had one, ``.grad`` is left untouched (None
    stays None, so the optimizer skips the parameter as it would without pyring). A bucket with
    such a parameter (or with a parameter accumulated fewer than ``backward_passes_per_step``
    times) is launched at ``synchronize()``, with every bucket after it.

    Contracts: every rank runs the same number of backward passes and calls ``step``,
    ``synchronize`` and ``zero_grad`` at the same points; other collectives on ``comm`` between
    the first backward of a window and its exchange must also be issued in the same order on
    every rank (or use a separate communicator). Use the optimizer's ``zero_grad()`` rather than
    ``model.zero_grad()`` to discard a window. Sparse gradients raise pyring.Error. Parameter
    groups added after this call are not averaged. Hooks are removed when the optimizer is freed.
    """
    if getattr(optimizer, "_pyring_sync", None) is not None:
        raise ValueError("DistributedOptimizer: this optimizer is already distributed")
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError(f"DistributedOptimizer: backward_passes_per_step must be an int >= 1, "
                         f"got {backward_passes_per_step!r}")
    if not isinstance(bucket_bytes, int) or bucket_bytes < 1:
        raise ValueError(f"DistributedOptimizer: bucket_bytes must be a positive int, "
                         f"got {bucket_bytes!r}")
    comm = comm if comm is not None else default()
    in_opt = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    if named_parameters is None:
        named = [(f"param_groups[{gi}][{pi}]", p) for gi, g in enumerate(optimizer.param_groups)
                 for pi, p in enumerate(g["params"])]
    else:
        named = list(named_parameters)
    name_of: dict[int, str] = {}
    order: list[Any] = []
    for name, p in named:
        if id(p) not in name_of:
            name_of[id(p)] = name
            order.append(p)
    wanted = {id(p) for p in in_opt}
    unnamed = [p for p in in_opt if id(p) not in name_of]
    if unnamed:
        raise ValueError(f"DistributedOptimizer: {len(unnamed)} of the optimizer's parameters "
                         f"(shapes {[tuple(p.shape) for p in unnamed[:3]]}) are not in "
                         f"named_parameters")
    params = [p for p in reversed(order) if id(p) in wanted]
    names = [name_of[id(p)] for p in params]
    for n, p in zip(names, params):
        if str(p.dtype) not in _FLOATS:
            raise ValueError(f"DistributedOptimizer: parameter {n!r} is {p.dtype}; pyring "
                             f"averages {', '.join(d[6:] for d in _FLOATS)} gradients")
    # Registration order, so that an error names the first parameter that differs.
    entries = [(f"parameter {n!r}", describe(p)) for n, p in zip(names[::-1], params[::-1])]
    exchange = GradientExchange(compression)
    if not isinstance(staleness, int) or isinstance(staleness, bool) or staleness < 0:
        raise ValueError(f"DistributedOptimizer: staleness must be an int >= 0, got "
                         f"{staleness!r}")
    if staleness and (compression != "none" or backward_passes_per_step != 1):
        raise ValueError("DistributedOptimizer: staleness > 0 takes compression='none' and "
                         "backward_passes_per_step=1")
    if symmetric_buckets not in (None, False):
        raise ValueError(f"DistributedOptimizer: symmetric_buckets must be None (where the "
                         f"exchange runs zero-copy) or False, got {symmetric_buckets!r}")
    entries += [("bucket_bytes", str(bucket_bytes)),
                ("symmetric_buckets", str(symmetric_buckets)),
                ("backward_passes_per_step", str(backward_passes_per_step)),
                ("compression", compression), ("staleness", str(staleness))]
    check_same_on_all_ranks(comm, "DistributedOptimizer", entries)

    sync = _GradSync(comm, params, names, bucket_bytes, backward_passes_per_step,
                     bool(gradient_as_bucket_view), exchange, symmetric_buckets is None,
                     staleness)
    ref = weakref.ref(sync)
    handles = [p.register_hook(functools.partial(_pre_hook, ref, i)) for i, p in enumerate(params)]
    handles += [p.register_post_accumulate_grad_hook(functools.partial(_hook, ref, i))
                for i, p in enumerate(params)]
    handles.append(optimizer.register_step_pre_hook(functools.partial(_step_hook, ref)))
    optimizer._pyring_sync = sync
    optimizer.synchronize = sync.synchronize
    optimizer.no_sync = sync.no_sync
    optimizer.skip_synchronize = sync.skip_synchronize
    optimizer.exchange = exchange
    optimizer.zero_grad = functools.partial(_zero_grad, weakref.ref(optimizer))
    weakref.finalize(optimizer, _remove, handles)
    return optimizer


def __getattr__(name: str) -> Any:
    """``pyring.optim.OneBitAdam``, ``ZeroOneAdam`` and ``ParameterServer``, imported on first
    use (they need torch)."""
    if name == "OneBitAdam":
        from .onebit_adam import OneBitAdam

        return OneBitAdam
    if name == "ZeroOneAdam":
        from .zero_one_adam import ZeroOneAdam

        return ZeroOneAdam
    if name == "ParameterServer":
        from .parameter_server import ParameterServer

        return ParameterServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
