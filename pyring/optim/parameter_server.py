"""Asynchronous training on a parameter server (Downpour SGD, DistBelief; BytePS's sharding).

    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ps = pyring.optim.ParameterServer(opt, servers=1, push_every=1, pull_every=1, wire="onebit")
    if ps.is_server:
        ps.serve()                      # applies pushes as they arrive, answers pulls
    else:
        for x, y in data:               # each worker its own shard of the data
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            ps.step()                   # never waits for another worker
        ps.close()

The last ``servers`` ranks serve; every other rank is a worker. The parameters, flattened in
the optimizer's order, are cut into one contiguous shard per server by bytes. Every rank builds
the same model and optimizer; at construction each server sends its shard (its own initial
values) to every worker, so every worker starts from the servers' parameters.

- A worker's ``step()`` adds the gradients to an accumulator. Every ``push_every`` steps it
  sends each server its shard of their mean (a push), encoded on ``wire`` (any wire of the codec
  registry, ``pyring.optim.compression.WIRES``) with an error-feedback residual per server kept
  on the worker. Every ``pull_every`` steps it asks every server for
  its shard (a pull). By default the step waits for its pull, so that the next gradients are
  computed on the parameters with this worker's last push applied: a round trip's wait a step
  (with W workers pushing every step, a push is about W - 1 versions stale). With
  ``overlap_pull=True`` it takes the answer into the model when it has arrived, at the latest at
  the next pull, which is then the only time a step waits: the round trip overlaps a step, for
  links where it lasts longer than one, and a push is about 2W - 1 versions stale. A step that
  pushes and pulls sends one request: the server answers the pull right after applying the
  push.
- A server's ``serve()`` applies each push as it arrives: the push's gradient is the shard's
  ``grad`` for one ``step()`` of a copy of the wrapped optimizer's class and hyperparameters over
  the shard (torch's fused implementation where the user left that choice to torch). It
  answers each pull with its shard and its version (the pushes applied so far), and returns
  once every worker has called ``close()`` (which returns then too). It sends its answers
  without waiting for the workers to take them, so a slow puller holds no push back.
- Staleness of a push: the server's version when it applies it, minus the version of the
  parameters the worker computed it on.
- A push is applied only once its whole payload has arrived. A worker sends a push's payload
  before its request (on one link a peer's messages arrive in the order sent), so the server
  meets a request only once its payload is in, and never waits on one worker's payload while
  another's request waits. A worker that dies mid-push, before its request or mid-payload, has
  its push dropped, and its death ends the job on every rank with the communicator's errors.
- Messages use the point-to-point links with tags from ``TAG_BASE`` (user tags there would
  collide); a rank's messages to one peer on one tag arrive in order.

``state_dict()`` holds a server's shard, its optimizer's state and version (take it once
``serve()`` has returned), and a worker's parameters, accumulator, residuals, counts and
whether a pull was on its way (take it between steps, before ``close()``). Every rank loads its
own state with ``load_state_dict()`` right after construction, on the same layout; a worker
asks again for the pull it was waiting for. With one worker the resumed job then repeats the
uninterrupted one bit for bit; with several, the order in which the server meets their pushes
is the network's, as in any asynchronous run.
"""

from __future__ import annotations

import time
from typing import Any

from .. import _C
from ..api import default
from ..runtime.agree import check_same_on_all_ranks, describe
from .compression import check_wire

#: The first of the point-to-point tags the parameter server uses (TAG_BASE .. TAG_BASE + 3).
TAG_BASE = 0x5053_0000
_TAG_REQ, _TAG_PUSH, _TAG_PARAMS = TAG_BASE, TAG_BASE + 1, TAG_BASE + 2
# A request's kind (header[0]). _PUSH_PULL: a push, and a pull answered right after it is
# applied (a step that does both sends one request).
_PUSH, _PULL, _CLOSE, _PUSH_PULL = 1, 2, 3, 4
_TAG_DONE = TAG_BASE + 3  # a server to every worker: every worker has closed


def _shard_bounds(n: int, servers: int) -> list[int]:
    """Element bounds of each server's shard of n float32 values: equal by bytes."""
    return [n * s // servers for s in range(servers + 1)]


class _Codec:
    """One push's encoding of float32 values on a wire of the codec registry, with error
    feedback per destination in float32 (codecs/message.h)."""

    def __init__(self, wire: str, n: int) -> None:
        import torch

        self.wire = wire
        self.residual = torch.zeros(n)
        self.max_bytes = max(1, _C.wire_message_max_bytes(wire, n))

    def encode(self, g: Any) -> Any:
        """The payload (uint8, a tensor of its own) for g + the residual; keeps the new
        residual."""
        import torch

        g = g.contiguous()
        out = torch.empty(self.max_bytes, dtype=torch.uint8)
        k = _C.wire_encode_message(self.wire, g.data_ptr(), self.residual.data_ptr(), g.numel(),
                                   out.data_ptr())
        return out[:k]

    @staticmethod
    def decode(wire: str, payload: Any, out: Any) -> Any:
        """``out`` (float32) = the values of ``payload``."""
        _C.wire_decode_message(wire, payload.data_ptr(), payload.numel(), out.numel(),
                               out.data_ptr())
        return out


def _shard_optimizer(cls: Any, groups: list) -> Any:
    """The server's optimizer over its shard: `cls` with each group's hyperparameters. Where
    every group leaves the implementation to torch (``fused`` and ``foreach`` None), it takes
    torch's fused one, a push's step in one kernel (docs/asynchronous.md has the timing), or
    the class's own where torch offers no fused one."""
    if groups and all(g.get("fused", False) is None and g.get("foreach", False) is None
                      and not g.get("differentiable", False) for g in groups):
        try:
            return cls([{**g, "fused": True} for g in groups])
        except (RuntimeError, ValueError, TypeError):
            pass
    return cls(groups)


class ParameterServer:
    def __init__(self, optimizer: Any, named_parameters: Any = None, servers: int = 1,
                 push_every: int = 1, pull_every: int = 1, wire: str = "fp32",
                 comm: Any = None, overlap_pull: bool = False) -> None:
        import torch

        self.comm = comm if comm is not None else default()
        world, rank = self.comm.world_size, self.comm.rank
        if not isinstance(servers, int) or not 1 <= servers < world:
            raise ValueError(f"ParameterServer: servers must be an int from 1 to world_size - 1 "
                             f"({world - 1}), got {servers!r}")
        for name, v in (("push_every", push_every), ("pull_every", pull_every)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"ParameterServer: {name} must be an int >= 1, got {v!r}")
        check_wire(wire, "ParameterServer")
        if not isinstance(overlap_pull, bool):
            raise ValueError(f"ParameterServer: overlap_pull must be True or False, got "
                             f"{overlap_pull!r}")
        self.optimizer = optimizer
        self.push_every, self.pull_every, self.wire = push_every, pull_every, wire
        self.overlap_pull = overlap_pull
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        for i, p in enumerate(self.params):
            if p.dtype != torch.float32:
                raise ValueError(f"ParameterServer: parameter {i} is {p.dtype}; it takes float32 "
                                 f"parameters")
        names = ([n for n, _ in named_parameters] if named_parameters is not None
                 else [f"parameter {i}" for i in range(len(self.params))])
        if len(names) != len(self.params):
            raise ValueError(f"ParameterServer: named_parameters names {len(names)} parameters "
                             f"but the optimizer holds {len(self.params)}")
        check_same_on_all_ranks(self.comm, "ParameterServer",
                                [(f"{n!r}", describe(p)) for n, p in zip(names, self.params)]
                                + [("servers", str(servers)), ("wire", wire),
                                   ("overlap_pull", str(overlap_pull))])
        self.n = sum(p.numel() for p in self.params)
        self.bounds = _shard_bounds(self.n, servers)
        self.servers = list(range(world - servers, world))
        self.workers = list(range(world - servers))
        self.is_server = rank in self.servers
        self.closed = False
        flat = torch.cat([p.detach().reshape(-1).float().cpu() for p in self.params]) \
            if self.params else torch.zeros(0)
        if self.is_server:
            self._init_server(flat)
        else:
            self._init_worker()

    # ------------------------------------------------------------------ server
    def _init_server(self, flat: Any) -> None:
        import torch

        s = self.servers.index(self.comm.rank)
        self.lo, self.hi = self.bounds[s], self.bounds[s + 1]
        self.shard = flat[self.lo:self.hi].clone()
        # One parameter per original group's part of the shard: the optimizer's class and each
        # group's hyperparameters over views of the shard.
        groups, off = [], 0
        for g in self.optimizer.param_groups:
            k = sum(p.numel() for p in g["params"])
            a, b = max(off, self.lo), min(off + k, self.hi)
            if a < b:
                opts = {key: v for key, v in g.items() if key != "params"}
                groups.append({**opts, "params": [
                    torch.nn.Parameter(self.shard[a - self.lo:b - self.lo], requires_grad=True)]})
            off += k
        self.shard_optimizer = _shard_optimizer(type(self.optimizer), groups) if groups else None
        self.version = 0
        self._stats = {"pushes_received": 0, "pushes_applied": 0, "pulls_answered": 0,
                       "staleness": {}}
        self._last_push: dict[int, int] = {}
        self._answering: list[tuple[Any, Any]] = []  # (work, message) of answers in flight
        self._send_params(self.workers)  # every worker starts from the servers' parameters

    def _send_params(self, workers: list[int]) -> None:
        """Sends the shard and its version to `workers` without waiting for them to take it
        (a blocking send would hold every push behind the slowest puller); the message is a
        copy, kept until its send completes."""
        import torch

        msg = torch.empty(8 + 4 * self.shard.numel(), dtype=torch.uint8)
        msg[:8].view(torch.int64)[0] = self.version
        msg[8:].view(torch.float32).copy_(self.shard)
        self._answering = [(w, m) for w, m in self._answering if not w.is_completed()]
        for w in workers:
            self._answering.append((self.comm.isend(msg, w, tag=_TAG_PARAMS), msg))

    def serve(self, on_update: Any = None) -> None:
        """Applies pushes and answers pulls until every worker has closed (servers only).

        ``on_update(version, shard)``, if given, is called after each applied push with the new
        version and the server's shard (a view it updates in place: copy what you keep). Its
        time is the pulls' and pushes' wait: keep it short."""
        import torch

        if not self.is_server:
            raise RuntimeError("ParameterServer.serve: this rank is a worker; call step()")
        live = set(self.workers)
        hdr = torch.zeros(4, dtype=torch.int64)
        grad = torch.empty(self.hi - self.lo)  # each push's gradient, decoded and applied
        while live:
            src = self.comm.recv(hdr, src=None, tag=_TAG_REQ)
            kind, version, nbytes, seq = (int(v) for v in hdr.tolist())
            if kind in (_PUSH, _PUSH_PULL):
                payload = torch.empty(nbytes, dtype=torch.uint8)
                self.comm.recv(payload, src=src, tag=_TAG_PUSH)  # in before its request
                self._stats["pushes_received"] += 1
                if seq <= self._last_push.get(src, 0):
                    raise RuntimeError(f"ParameterServer: push {seq} from rank {src} after its "
                                       f"push {self._last_push[src]}")
                self._last_push[src] = seq
                self._apply(_Codec.decode(self.wire, payload, grad), version)
                if on_update is not None:
                    on_update(self.version, self.shard)
                if kind == _PUSH_PULL:
                    self._send_params([src])
                    self._stats["pulls_answered"] += 1
            elif kind == _PULL:
                self._send_params([src])
                self._stats["pulls_answered"] += 1
            elif kind == _CLOSE:
                live.discard(src)
            else:
                raise RuntimeError(f"ParameterServer: request of unknown kind {kind} from rank "
                                   f"{src}")
        for work, _ in self._answering:
            work.wait()
        self._answering = []
        done = torch.ones(1, dtype=torch.int64)
        for w in self.workers:
            self.comm.send(done, w, tag=_TAG_DONE)
        self.comm.barrier()  # no rank leaves (and closes its links) while another still talks

    def _apply(self, grad: Any, version: int) -> None:
        stale = self.version - version
        self._stats["staleness"][stale] = self._stats["staleness"].get(stale, 0) + 1
        if self.shard_optimizer is not None:
            off = 0
            for g in self.shard_optimizer.param_groups:
                for p in g["params"]:
                    p.grad = grad[off:off + p.numel()]  # read by step() before the next push
                    off += p.numel()
            self.shard_optimizer.step()
        self.version += 1
        self._stats["pushes_applied"] += 1

    # ------------------------------------------------------------------ worker
    def _init_worker(self) -> None:
        import torch

        self.steps = 0
        self.pushes = 0
        self.acc = torch.zeros(self.n)
        self._acc_views = self._views_of(self.acc)  # each parameter's part of the accumulator
        self._on_cpu = bool(self.params) and all(p.device.type == "cpu" for p in self.params)
        self.codecs = [_Codec(self.wire, b - a) for a, b in zip(self.bounds, self.bounds[1:])]
        self.versions = [0] * len(self.servers)
        self._sending: list[tuple[Any, Any]] = []  # (work, the tensors it sends)
        self._pull: list[tuple[Any, Any]] | None = None  # per server: (work, message)
        self.waited_s = 0.0
        self._stats = {"pushes_sent": 0, "pulls": 0}
        self._pull = self._post_pull(request=False)  # the servers' initial parameters
        self._take_pull()

    def _post_pull(self, request: bool = True) -> list[tuple[Any, Any]]:
        """Posts the receives of a pull's answers (per server: (work, message)), and asks for
        them unless `request` is False (the servers send unasked, or a push asked)."""
        import torch

        pull = []
        for s, srv in enumerate(self.servers):
            msg = torch.empty(8 + 4 * (self.bounds[s + 1] - self.bounds[s]), dtype=torch.uint8)
            if request:
                self._request(srv, _PULL, 0, 0)
            pull.append((self.comm.irecv(msg, src=srv, tag=_TAG_PARAMS), msg))
        return pull

    def _take_pull(self) -> None:
        """Waits for the outstanding pull and copies its shards into the parameters."""
        import torch

        if self._pull is None:
            return
        t0 = time.monotonic()
        for work, _ in self._pull:
            work.wait()
        self.waited_s += time.monotonic() - t0
        shards = [msg[8:].view(torch.float32) for _, msg in self._pull]
        flat = shards[0] if len(shards) == 1 else torch.cat(shards)
        self.versions = [int(msg[:8].view(torch.int64)[0]) for _, msg in self._pull]
        self._pull = None
        with torch.no_grad():
            if self._on_cpu:
                torch._foreach_copy_(self.params, self._views_of(flat))
            else:
                for p, v in zip(self.params, self._views_of(flat)):
                    p.copy_(v)

    def _views_of(self, flat: Any) -> list:
        """Each parameter's part of `flat` (the parameters flattened in order), in its shape."""
        views, off = [], 0
        for p in self.params:
            views.append(flat[off:off + p.numel()].view_as(p))
            off += p.numel()
        return views

    def _request(self, server: int, kind: int, nbytes: int, seq: int, version: int = 0) -> None:
        import torch

        hdr = torch.tensor([kind, version, nbytes, seq], dtype=torch.int64)
        self._sending.append((self.comm.isend(hdr, server, tag=_TAG_REQ), hdr))

    def step(self, closure: Any = None) -> Any:
        """Accumulates this step's gradients; pushes and pulls as configured (workers only)."""
        import torch

        if self.is_server:
            raise RuntimeError("ParameterServer.step: this rank is a server; call serve()")
        if self.closed:
            raise RuntimeError("ParameterServer.step: the worker is closed")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.steps += 1
        computed_on = list(self.versions)  # the parameters these gradients were computed on
        grads = [(a, p.grad.detach()) for a, p in zip(self._acc_views, self.params)
                 if p.grad is not None]
        if self._on_cpu and grads:
            torch._foreach_add_([a for a, _ in grads], [g for _, g in grads])
        else:
            for a, g in grads:
                a += g.cpu()
        self._sending = [(w, t) for w, t in self._sending if not w.is_completed()]
        if self._pull is not None and all(w.is_completed() for w, _ in self._pull):
            self._take_pull()  # arrived: no wait
        push, pull = self.steps % self.push_every == 0, self.steps % self.pull_every == 0
        if push:
            g = self.acc / self.push_every
            self.acc.zero_()
            self.pushes += 1
            kind = _PUSH_PULL if pull else _PUSH
            for s, srv in enumerate(self.servers):
                payload = self.codecs[s].encode(g[self.bounds[s]:self.bounds[s + 1]])
                # The payload before its request: a request then means the whole push is in,
                # and the server never waits on one worker's payload (over a slow link) while
                # another's request waits.
                self._sending.append((self.comm.isend(payload, srv, tag=_TAG_PUSH), payload))
                self._request(srv, kind, payload.numel(), self.pushes, computed_on[s])
            self._stats["pushes_sent"] += 1
        if pull:
            # Answers arrive in the order asked: the new pull's receives may be posted before
            # the last pull is taken, which is in before the new one.
            new = self._post_pull(request=not push)
            self._stats["pulls"] += 1
            self._take_pull()
            self._pull = new
            if not self.overlap_pull:
                self._take_pull()  # the parameters with this push applied
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def close(self) -> None:
        """A worker's last call: its pushes sent, its last pull taken, the servers told. Returns
        once every worker has closed (the servers say so), so that no rank closes its links
        while another still uses them: a worker that finishes more than the communicator's
        timeout before the last one fails with its TimeoutError."""
        import torch

        if self.is_server or self.closed:
            self.closed = True
            return
        self._take_pull()
        for srv in self.servers:
            self._request(srv, _CLOSE, 0, 0)
        for work, _ in self._sending:
            work.wait()
        self._sending = []
        done = torch.zeros(1, dtype=torch.int64)
        for srv in self.servers:
            self.comm.recv(done, src=srv, tag=_TAG_DONE)
        self.comm.barrier()
        self.closed = True

    # ------------------------------------------------------------------ both
    def stats(self) -> dict:
        """Server: pushes received and applied, pulls answered, staleness {value: pushes} and
        version. Worker: pushes sent, pulls asked, steps, seconds waited for pulls."""
        if self.is_server:
            return {**self._stats, "staleness": dict(sorted(self._stats["staleness"].items())),
                    "version": self.version}
        return {**self._stats, "steps": self.steps, "waited_s": self.waited_s}

    def state_dict(self) -> dict:
        if self.is_server:
            return {"role": "server", "bounds": [self.lo, self.hi], "shard": self.shard.clone(),
                    "optimizer": (self.shard_optimizer.state_dict()
                                  if self.shard_optimizer is not None else None),
                    "version": self.version, "stats": self.stats(),
                    "last_push": dict(self._last_push)}
        import torch

        flat = torch.cat([p.detach().reshape(-1).float().cpu() for p in self.params])
        return {"role": "worker", "steps": self.steps, "pushes": self.pushes,
                "acc": self.acc.clone(), "residuals": [c.residual.clone() for c in self.codecs],
                "versions": list(self.versions), "params": flat,
                "pulling": self._pull is not None}

    def load_state_dict(self, sd: dict) -> None:
        role = "server" if self.is_server else "worker"
        if sd.get("role") != role:
            raise ValueError(f"ParameterServer.load_state_dict: a {sd.get('role')!r} state on a "
                             f"{role} rank")
        if self.is_server:
            if sd["bounds"] != [self.lo, self.hi]:
                raise ValueError(f"ParameterServer.load_state_dict: the state covers elements "
                                 f"{sd['bounds']}, this server [{self.lo}, {self.hi}]")
            self.shard.copy_(sd["shard"])
            if self.shard_optimizer is not None:
                self.shard_optimizer.load_state_dict(sd["optimizer"])
            self.version = sd["version"]
            self._last_push = {int(k): v for k, v in sd["last_push"].items()}
            return
        import torch

        self.steps, self.pushes = sd["steps"], sd["pushes"]
        self.acc.copy_(sd["acc"])
        for c, r in zip(self.codecs, sd["residuals"]):
            c.residual = r.clone()
        self.versions = list(sd["versions"])
        off = 0
        with torch.no_grad():  # the parameters it computed on, and the pull it was waiting for
            for p in self.params:
                p.copy_(sd["params"][off:off + p.numel()].view_as(p))
                off += p.numel()
        if sd["pulling"]:
            self._pull = self._post_pull()
            self._stats["pulls"] += 1
