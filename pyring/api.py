"""``init``/``destroy``, the default communicator, and module-level collectives."""

from __future__ import annotations

import atexit
import collections
import logging
import os
import weakref
from typing import Any

from . import _C, _settings, topology
from .communicator import Communicator
from .config import ALGOS, SHM_COPIES, resolve
from .errors import Error
from .runtime import affinity as _affinity
from .runtime import device_links as _device_links
from .runtime import hang as _hang
from .runtime import rendezvous
from .runtime.devices import device_name_of
from .topology import pci
from .work import Work

log = logging.getLogger("pyring")
_default: Communicator | None = None
_live: weakref.WeakSet = weakref.WeakSet()


def _setup_logging(level: str) -> None:
    if level in ("INFO", "DETAIL") and not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[pyring %(levelname)s] %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.DEBUG if level == "DETAIL" else logging.INFO)


def init(rank: int | None = None, world_size: int | None = None, store: Any = None,
         timeout: Any = None, *, segment_bytes: Any = None, transport: str | None = None,
         algo: str | None = None, topology: Any = None, link_model: Any = None,
         set_default: bool = True, device: Any = None) -> Communicator:
    """Meets the other ranks and returns a connected Communicator.

    With no arguments it uses the default torch.distributed process group's store when one
    exists, else torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Any c10d
    Store may be passed with ``rank`` and ``world_size``. ``timeout`` (seconds or timedelta;
    default PYRING_TIMEOUT or 300 s) bounds the rendezvous and every collective.
    ``segment_bytes`` (default PYRING_SEGMENT_BYTES or 256 KiB) is the pipelining unit;
    ``transport`` is 'auto' (shm within a host, tcp across), 'shm' or 'tcp'
    (default PYRING_TRANSPORT). ``algo`` is 'auto' (the selector decides per call), 'ring',
    'direct' or 'tree' (default PYRING_ALGO). ``topology`` is 'auto' (hosts from the
    rendezvous, GPUs by their PCIe tree), 'flat', or explicit: '0,1;2,3|4,5;6,7' or nested
    lists (default PYRING_TOPOLOGY); every rank must pass the same. ``link_model`` overrides
    the selector's alpha-beta figures: {'tcp': (alpha_us, GB/s)} or 'tcp=25/2.9' (default
    PYRING_LINK_MODEL). ``device`` ('cuda:1', 'cuda' for the current CUDA device, a
    torch.device, or None: PYRING_DEVICE, else the device of the first call on device
    buffers) is the device this rank's device buffers must be on; bound at init, ranks of one
    host exchange device buffers device to device (cuda_ipc). The first
    communicator becomes the default one.
    """
    global _default
    cfg = resolve(timeout, segment_bytes, transport, algo, topology, link_model)
    _setup_logging(cfg.debug)
    meeting = rendezvous.find_store(rank, world_size, store, cfg.timeout_s)
    rank, world = meeting.rank, meeting.world_size
    if not (isinstance(world, int) and world >= 1):
        raise ValueError(f"init: world_size must be a positive int, got {world!r}")
    if not (isinstance(rank, int) and 0 <= rank < world):
        raise ValueError(f"init: rank {rank!r} is out of range for world_size {world}")
    bound = device_name_of(device if device is not None else _settings.read("PYRING_DEVICE"))
    comm = _connect(meeting, cfg, bound)
    comm.device = bound
    _live.add(comm)
    if set_default and _default is None:
        _default = comm
    return comm


def _agree(rank: int, peers: list[dict], me: dict, keys: tuple[str, ...]) -> None:
    for key in keys:
        differ = [r for r, p in enumerate(peers) if p[key] != me[key]]
        if differ:
            raise ValueError(f"init on rank {rank}: {key}={me[key]!r} here but ranks {differ} "
                             f"use {[peers[r][key] for r in differ]}")


def _topology(spec: Any, source: str, peers: list[dict], world: int) -> topology.Topology:
    """The same Topology on every rank, from the exchanged inputs alone."""
    if spec == "auto":
        return topology.detect([p["host"] for p in peers], [p["gpu_path"] for p in peers])
    return topology.parse(spec, world, source=source)


def _connect(meeting: rendezvous.Meeting, cfg: Any, device: str | None) -> Communicator:
    rank, world = meeting.rank, meeting.world_size
    store = rendezvous.prefixed(meeting.store, rank)
    if rank == 0:
        store.set("job", os.urandom(40))
    job = rendezvous.job_key(store, rank, cfg.timeout_s) if world > 1 else os.urandom(40)
    secret, job_id = job[:32], job[32:].hex()
    host_ip = rendezvous.listen_address(cfg, meeting.store) if world > 1 else ""
    # Each host transport makes its resources and spells its address (the core's
    # transport/host_channel.h); point-to-point messages travel links of their own.
    enabled = [] if cfg.transport == "auto" else [cfg.transport]
    channels = {name: _C.HostChannel(rank, job_id, name, host_ip, cfg.segment_bytes, enabled)
                for name in ("", "p2p")}
    spec = cfg.topology if isinstance(cfg.topology, str) else _as_lists(cfg.topology)
    me = {"host": rendezvous.host_key(), "pid": os.getpid(), "transport": cfg.transport,
          "segment_bytes": cfg.segment_bytes, "algo": cfg.algo, "topology": spec,
          "gpu_path": _gpu_path(device) if spec == "auto" else None,
          "cores": len(os.sched_getaffinity(0)), "link_model": cfg.link_model,
          "cpus": sorted(os.sched_getaffinity(0)),
          "endpoints": {name: dict(ch.addresses) for name, ch in channels.items()},
          "detail": cfg.debug == "DETAIL", "device": device}
    dropped: dict[str, int] = {}
    try:
        peers = rendezvous.exchange(store, rank, world, me, cfg.timeout_s) if world > 1 else [me]
        # Every rank sees the same peers, so a bad or differing spec fails on every rank here,
        # before any link is opened.
        _agree(rank, peers, me, ("transport", "segment_bytes", "algo", "topology",
                                 "link_model", "detail"))
        topo = _topology(spec, cfg.topology_source, peers, world)
        hosts = list(dict.fromkeys(p["host"] for p in peers))
        host_of = [hosts.index(p["host"]) for p in peers]
        local = [r for r in range(world) if host_of[r] == host_of[rank]]
        local_index, local_world = local.index(rank), len(local)
        if cfg.transport == "shm" and local_world != world:
            raise ValueError(f"init on rank {rank}: transport='shm' needs every rank on one "
                             f"host, but only ranks {local} share this one")
        groups = [[list(g) for g in level] for level in topo.groups]
        # The transport of each pair is the core's choice, from the published endpoints, made
        # once per channel in ready().
        wait = False
        for name, ch in channels.items():
            endpoints = [(p["host"], p["endpoints"][name]) for p in peers]
            wait = ch.ready(endpoints, local_world) or wait
        if wait:  # a local peer attaches to what this rank made
            rendezvous.store_barrier(store, "created", rank, local, cfg.timeout_s)
        needed = _C.needed_peers(rank, world, list(topo.levels), groups)
        transports = {p: channels[""].transport_of(p) for p in needed}
        model = _link_model(cfg, peers, host_of)
        reduce_rate = model.pop("reduce")[1]
        # From the CPUs the launcher gave, before binding.
        shared_cores = _shares_cores([peers[r]["cpus"] for r in local])
        spin_us = _spin_us(shared_cores)
        # Before the core starts its threads: they inherit the binding.
        cpus, why = _affinity.plan(cfg.affinity, me["cpus"], [peers[r]["cpus"] for r in local],
                                   local_index)
        _affinity.apply(cpus)
        if rank == local[0] or cpus is not None:
            log.info("rank %d: affinity: %s", rank, why)
        core = _C.Communicator(rank, world, cfg.timeout_s, cfg.segment_bytes, local_index,
                               local_world, channels[""], secret, ALGOS.index(cfg.algo),
                               spin_us, needed, list(topo.levels),
                               groups, 1 if cfg.debug in ("INFO", "DETAIL") else 0,
                               {k: tuple(v) for k, v in model.items()}, reduce_rate,
                               channels["p2p"], cfg.flight_entries,
                               SHM_COPIES.index(cfg.shm_copy), cfg.socket_nstreams)
        core.single_copy_bytes = cfg.single_copy_bytes
        core.enable_symmetric(local, job_id, shared_cores,
                              _hosts_tree(groups, host_of, local_world))
        _device_links.connect(core, store, rank, world, peers, device, cfg, job_id, needed,
                              local_index, local_world)
        if world > 1:
            rendezvous.store_barrier(store, "connected", rank, list(range(world)), cfg.timeout_s)
    finally:
        # Names and listening ports go as soon as every peer has connected, or at once on
        # failure.
        for ch in channels.values():
            ch.release()
            for key, n in ch.counters.items():
                if key.startswith("tcp.dropped_"):
                    why = key.removeprefix("tcp.dropped_")
                    dropped[why] = dropped.get(why, 0) + n
    if rank == 0:
        log.info("topology (%s): %s\n%s", spec if isinstance(spec, str) else "explicit",
                 topo.spec(), topo.describe())
    log.info("rank %d/%d (local %d/%d): links %s, segment_bytes=%d, timeout=%gs, algo %s",
             rank, world, local_index, local_world, transports or "none", cfg.segment_bytes,
             cfg.timeout_s, cfg.algo)
    comm = Communicator(core, rank=rank, world_size=world, local_rank=local_index,
                        local_world_size=local_world, store=store, transports=transports,
                        topology=topo, detail=cfg.debug == "DETAIL")
    comm.rendezvous_dropped = dropped
    _hang.watch(store, core, rank, world, cfg.timeout_s)
    return comm


def _gpu_path(device: str | None) -> list[str] | None:
    """The PCI path of the GPU this rank is bound to (init's device), else of the current
    CUDA device; None for a rank bound to a device of another kind."""
    if device is None:
        return pci.local_gpu_path()
    kind, index = device.split(":")
    return pci.local_gpu_path(index=int(index)) if kind == "cuda" else None


def _as_lists(spec: Any) -> Any:
    """Nested tuples and lists as lists, so that every rank publishes the same JSON."""
    if isinstance(spec, (list, tuple)):
        return [_as_lists(x) for x in spec]
    return spec


# A hop between ranks that share cores waits for the peer to be scheduled: the shm latency
# fitted with 4 ranks on the development VM's 2 cores (bench/results/algos_vm_w4.json).
OVERSUBSCRIBED_SHM_ALPHA_S = 25e-6


def _link_model(cfg: Any, peers: list[dict], host_of: list[int]) -> dict:
    """The selector's figures, the same on every rank: the shm latency rises to
    OVERSUBSCRIBED_SHM_ALPHA_S when some host has more ranks than cores, unless the user gave
    shm figures."""
    model = {k: list(v) for k, v in cfg.link_model.items()}
    ranks = collections.Counter(host_of)
    cores = {h: min(p["cores"] for p, g in zip(peers, host_of) if g == h) for h in ranks}
    if any(ranks[h] > cores[h] for h in ranks) and "shm" not in cfg.link_classes_set:
        model["shm"][0] = max(model["shm"][0], OVERSUBSCRIBED_SHM_ALPHA_S)
    return model


def _spin_us(shared_cores: bool) -> int:
    """PYRING_SPIN_US, else by whether every local rank has a core of its own (_settings)."""
    spin = _settings.read("PYRING_SPIN_US")
    if spin is not None:
        return spin
    return _settings.SPIN_US_SHARED_CORES if shared_cores else _settings.SPIN_US_OWN_CORE


def _hosts_tree(groups: list, host_of: list[int], local_world: int) -> bool:
    """Whether the job spans several hosts of as many ranks each (more than one) and its
    topology's one level groups the ranks by host: all_reduce on symmetric tensors then runs
    zero-copy within each host (alike on every rank: from what every rank knows)."""
    hosts = sorted(sorted(r for r, h in enumerate(host_of) if h == k) for k in set(host_of))
    return (len(hosts) > 1 and local_world > 1 and len({len(g) for g in hosts}) == 1
            and len(groups) == 1 and sorted(sorted(g) for g in groups[0]) == hosts)


def _shares_cores(local_cpus: list[list[int]]) -> bool:
    """Whether this host's ranks outnumber the CPUs they may run on together (each rank's CPUs
    as the launcher, or an earlier communicator's binding, left them)."""
    return len(set().union(*map(set, local_cpus))) < len(local_cpus)


def default() -> Communicator:
    """The default communicator; raises pyring.Error when ``init`` has not been called."""
    if _default is None:
        raise Error("pyring has no default communicator: call pyring.init() first")
    return _default


def is_initialized() -> bool:
    return _default is not None


def destroy(comm: Communicator | None = None) -> None:
    """Closes ``comm`` (default: the default communicator) and forgets the default."""
    global _default
    target = comm if comm is not None else _default
    if target is not None:
        target.close()
    if target is _default:
        _default = None


@atexit.register
def _close_all() -> None:
    # Progress threads must stop before the interpreter finalizes.
    for comm in list(_live):
        comm.close()


def all_reduce(tensor: Any, op: Any = "sum", async_op: bool = False,
               out: Any = None, algo: str | None = None, wire: str = "fp32",
               state: Any = None) -> Work | None:
    return default().all_reduce(tensor, op=op, async_op=async_op, out=out, algo=algo,
                                wire=wire, state=state)


def stats() -> dict[str, Any]:
    """The default communicator's counters (see Communicator.stats)."""
    return default().stats()


def reset_stats() -> None:
    default().reset_stats()


def broadcast(tensor: Any, src: int = 0, async_op: bool = False) -> Work | None:
    return default().broadcast(tensor, src=src, async_op=async_op)


def all_gather_into_tensor(out: Any, tensor: Any, async_op: bool = False) -> Work | None:
    return default().all_gather_into_tensor(out, tensor, async_op=async_op)


def reduce_scatter_tensor(out: Any, tensor: Any, op: Any = "sum",
                          async_op: bool = False) -> Work | None:
    return default().reduce_scatter_tensor(out, tensor, op=op, async_op=async_op)


def empty(*size: Any, dtype: Any = None, device: Any = None, comm: Communicator | None = None
          ) -> Any:
    """A tensor of ``size`` and ``dtype`` (default float32) in symmetric memory: every rank of
    ``comm`` (default: the default communicator) on this host maps every other's.

    Collective: every rank calls it with the same size and dtype, in the same order; a
    mismatch raises on every rank naming both calls. On the host the memory is one
    shared-memory file per rank (mode 0600) that never has a name in ``/dev/shm``
    (``memfd_create``; local peers open it through ``/proc``), so no ending leaves it behind;
    on a CUDA device (or the test-only sim device) it is device memory that every local rank
    opens once through its IPC handle (ranks may use different GPUs of the host, or share
    one). The returned tensor is an ordinary torch tensor whose storage keeps the mapping
    alive, so it is freed when the last view of it goes (device memory once the collectives
    entered before have finished on the device). all_reduce, reduce_scatter_tensor,
    all_gather_into_tensor and broadcast on such tensors run zero-copy when every rank of the
    communicator shares this host (their inputs must be symmetric on every rank, or on none).
    Its contents start zeroed. ``device``: 'cpu' (the default), 'cuda[:N]' or 'sim[:N]'."""
    from .runtime.symmetric import empty as _empty
    return _empty(comm or default(), *size, dtype=dtype, device=device)


def barrier(async_op: bool = False) -> Work | None:
    return default().barrier(async_op=async_op)


def _delegate(name: str) -> Any:
    method = getattr(Communicator, name)

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(default(), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"The default communicator's :meth:`Communicator.{name}`.\n\n{method.__doc__}"
    return call


# Point-to-point, rooted, personalised and coalesced calls on the default communicator.
DELEGATED = ("send", "recv", "isend", "irecv", "batch_isend_irecv", "reduce", "gather", "scatter",
             "all_to_all_single", "all_to_all", "all_reduce_coalesced", "all_gather_coalesced")
globals().update({name: _delegate(name) for name in DELEGATED})

