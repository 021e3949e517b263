"""Meeting the peers through a torch.distributed Store.

Python does the exchange; the core gets each peer's details and builds the links. Keys live
under ``pyring/<n>/`` where ``n`` counts the rendezvous of each rank on that store.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
import struct
from dataclasses import dataclass
from typing import Any

from ..config import Config
from ..errors import Error


@dataclass
class Meeting:
    rank: int
    world_size: int
    store: Any
    is_torch_default: bool = False


def _env_int(name: str) -> int | None:
    v = os.environ.get(name)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"environment variable {name}={v!r} is not an integer") from None


def find_store(rank: int | None, world_size: int | None, store: Any, timeout_s: float) -> Meeting:
    """Resolves rank, world size and store from the arguments, torch.distributed or torchrun."""
    import torch.distributed as dist

    if store is not None:
        if rank is None or world_size is None:
            raise ValueError("init(store=...) also needs rank= and world_size=")
        return Meeting(rank, world_size, store)
    if dist.is_available() and dist.is_initialized():
        from torch.distributed import distributed_c10d as c10d

        pg_rank, pg_world = dist.get_rank(), dist.get_world_size()
        if (rank is not None and rank != pg_rank) or (
            world_size is not None and world_size != pg_world
        ):
            raise ValueError(
                f"init(rank={rank}, world_size={world_size}) disagrees with the default process "
                f"group (rank {pg_rank} of {pg_world})"
            )
        return Meeting(pg_rank, pg_world, c10d._get_default_store(), is_torch_default=True)
    rank = rank if rank is not None else _env_int("RANK")
    world_size = world_size if world_size is not None else _env_int("WORLD_SIZE")
    if world_size == 1 and rank in (None, 0):
        return Meeting(0, 1, dist.HashStore())
    missing = [n for n, v in (("RANK", rank), ("WORLD_SIZE", world_size)) if v is None]
    missing += [n for n in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(n)]
    if missing:
        raise ValueError(
            "pyring.init() found no store: pass store=, rank= and world_size=, or launch with "
            f"torchrun (missing environment: {', '.join(missing)})"
        )
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    addr, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    try:
        tcp = dist.TCPStore(addr, int(port), world_size, is_master=(rank == 0 and not agent_store),
                            timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
    except (RuntimeError, OSError) as e:
        from ..errors import CommError

        detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CommError(f"rank {rank}: could not reach the store at {addr}:{port} "
                        f"(MASTER_ADDR, MASTER_PORT): {detail}") from None
    return Meeting(rank, world_size, tcp)


# What the keys under a rendezvous's prefix carry, for the errors of a failing store.
_KEY_MEANINGS = (("pyring/inits", "the count of this rank's rendezvous"),
                 ("job", "the job's key"), ("peer", "the ranks' endpoints"),
                 ("created", "the barrier after creating shared memory"),
                 ("connected", "the barrier after connecting the links"),
                 ("device", "the ranks' device endpoints"), ("hang", "the hang account"))


def store_address(store: Any) -> str:
    """'TCPStore at host:port' (what a failing store is called in errors), else its type."""
    base = getattr(store, "_underlying_non_prefix_store", store)
    host, port = getattr(base, "host", None), getattr(base, "port", None)
    name = type(base).__name__
    return f"{name} at {host}:{port}" if host is not None and port is not None else name


def _is_timeout(e: BaseException) -> bool:
    import torch.distributed as dist

    return isinstance(e, getattr(dist, "DistStoreError", ())) or "timeout" in str(e).lower()


class Guarded:
    """A store whose failures (a dead or unreachable store: anything but a wait's timeout)
    raise CommError naming the store's address, the rank and what the keys carry. Timeouts
    pass through for the caller to explain."""

    def __init__(self, store: Any, rank: int) -> None:
        self.inner = store
        self.rank = rank
        self.address = store_address(store)

    def _call(self, op: str, keys: list[str], *args: Any) -> Any:
        from ..errors import CommError

        try:
            return getattr(self.inner, op)(*args)
        except Exception as e:
            if op == "wait" and _is_timeout(e):
                raise
            key = keys[0] if keys else ""
            what = next((m for k, m in _KEY_MEANINGS if key.startswith(k)), f"key {key!r}")
            detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CommError(f"rank {self.rank}: the store ({self.address}) failed in {op} of "
                            f"{what}: {detail}") from None

    def set(self, key: str, value: Any) -> None:
        self._call("set", [key], key, value)

    def get(self, key: str) -> bytes:
        return self._call("get", [key], key)

    def add(self, key: str, amount: int) -> int:
        return self._call("add", [key], key, amount)

    def check(self, keys: list[str]) -> bool:
        return self._call("check", keys, keys)

    def wait(self, keys: list[str], *timeout: Any) -> None:
        self._call("wait", keys, keys, *timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def host_key() -> str:
    """Equal for processes that share a kernel, pid namespace and IPC namespace."""
    parts = [socket.gethostname()]
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            parts.append(f.read().strip())
    except OSError:
        pass
    for ns in ("pid", "ipc"):
        try:
            parts.append(str(os.stat(f"/proc/self/ns/{ns}").st_ino))
        except OSError:
            pass
    return "|".join(parts)


def _interface_address(ifname: str) -> str:
    names = [n for _, n in socket.if_nameindex()]
    if ifname not in names:
        raise ValueError(f"PYRING_SOCKET_IFNAME={ifname!r} is not an interface here "
                         f"(valid: {', '.join(names)})")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", ifname[:15].encode()))
        except OSError:
            raise ValueError(f"PYRING_SOCKET_IFNAME={ifname!r} has no IPv4 address") from None
    return socket.inet_ntoa(packed[20:24])


def _route_address(target: str) -> str:
    """The local address the kernel would use to reach ``target``."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((socket.gethostbyname(target), 9))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def listen_address(cfg: Config, store: Any) -> str:
    if cfg.socket_ifname:
        return _interface_address(cfg.socket_ifname)
    base = getattr(store, "_underlying_non_prefix_store", store)
    target = os.environ.get("MASTER_ADDR") or getattr(base, "host", None)
    return _route_address(target) if target else "127.0.0.1"


def store_barrier(store: Any, name: str, rank: int, ranks: list[int], timeout_s: float) -> None:
    """Returns once every rank in ``ranks`` has reached barrier ``name``."""
    from ..errors import CommTimeout

    store.set(f"{name}/{rank}", b"1")
    keys = [f"{name}/{r}" for r in ranks]
    try:
        store.wait(keys, datetime.timedelta(seconds=timeout_s))
    except Error:
        raise
    except Exception as e:  # torch raises DistStoreError / RuntimeError on timeout
        missing = [r for r, k in zip(ranks, keys) if not store.check([k])]
        raise CommTimeout(
            f"Timed out: rendezvous barrier '{name}' on rank {rank}: ranks {missing} did not "
            f"arrive within {timeout_s:g} s ({e})"
        ) from None


def job_key(store: Any, rank: int, timeout_s: float) -> bytes:
    """The job's secret and name, which rank 0 publishes when it joins."""
    from ..errors import CommTimeout

    try:
        store.wait(["job"], datetime.timedelta(seconds=timeout_s))
    except Error:
        raise
    except Exception as e:  # torch raises DistStoreError / RuntimeError on timeout
        raise CommTimeout(f"Timed out: init on rank {rank}: rank 0 did not join within "
                          f"{timeout_s:g} s ({e})") from None
    return store.get("job")


def exchange(store: Any, rank: int, world: int, info: Any, timeout_s: float,
             key: str = "peer") -> list:
    """Publishes ``info`` (JSON) under ``key`` and returns every rank's, in rank order."""
    from ..errors import CommTimeout

    store.set(f"{key}/{rank}", json.dumps(info).encode())
    keys = [f"{key}/{r}" for r in range(world)]
    try:
        store.wait(keys, datetime.timedelta(seconds=timeout_s))
    except Error:
        raise
    except Exception as e:
        missing = [r for r, k in zip(range(world), keys) if not store.check([k])]
        raise CommTimeout(
            f"Timed out: init on rank {rank}: ranks {missing} did not join within {timeout_s:g} s "
            f"({e})"
        ) from None
    return [json.loads(store.get(k)) for k in keys]


def prefixed(store: Any, rank: int) -> Any:
    """A fresh key space on ``store``: the n-th rendezvous of this rank on this store gets
    ``pyring/<n>/``, the same n on every rank that meets there (a subgroup's members may have
    met elsewhere different numbers of times)."""
    import torch.distributed as dist

    n = Guarded(store, rank).add(f"pyring/inits/{rank}", 1)
    return Guarded(dist.PrefixStore(f"pyring/{n}", store), rank)
