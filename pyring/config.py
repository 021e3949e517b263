"""Options: keyword arguments first, then the PYRING_* environment, then defaults.

An unknown or malformed value is a ValueError that names the variable and the valid values.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

from . import _C, _affinity

DEFAULT_TIMEOUT_S = 300.0
DEFAULT_SEGMENT_BYTES = 256 * 1024
# The device links' slot (cuda_ipc) unless segment_bytes is given: a device copy or kernel
# costs microseconds to launch and signal, so its unit is larger than a host link's.
DEFAULT_DEVICE_SEGMENT_BYTES = 2 << 20
# "auto" lets the transport registry (csrc/transport/registry.cc) choose per pair; a name forces
# that transport for every pair.
TRANSPORTS: tuple[str, ...] = ("auto",) + tuple(_C.TRANSPORT_NAMES)
ALGOS: tuple[str, ...] = tuple(_C.ALGO_NAMES)  # index = the core's code
DEBUG_LEVELS = ("WARN", "INFO", "DETAIL")
SHM_COPIES: tuple[str, ...] = tuple(_C.SHM_COPY_NAMES)  # index = the core's code
AFFINITY_MODES = _affinity.MODES
DEFAULT_FLIGHT_ENTRIES = 256
MAX_SOCKET_NSTREAMS: int = _C.MAX_TCP_STREAMS
# The selector's alpha-beta figures, each transport's own (csrc/transport/registry.h): per link
# class, latency in microseconds and bandwidth in GB/s; "reduce" is the local reduction rate.
DEFAULT_LINK_MODEL = {name: (alpha * 1e6, bw / 1e9) for name, (alpha, bw) in
                      _C.TRANSPORT_COSTS.items()}
DEFAULT_LINK_MODEL["reduce"] = (0.0, _C.DEFAULT_REDUCE_BYTES_PER_S / 1e9)


@dataclass(frozen=True)
class Config:
    timeout_s: float
    segment_bytes: int
    transport: str
    algo: str
    debug: str
    socket_ifname: str | None
    topology: Any = "auto"  # "auto", "flat", an explicit spec string or nested lists
    topology_source: str = "topology"  # where it came from, for messages
    # link class -> [alpha s, bytes/s], and "reduce" -> [0, bytes/s] (JSON-ready: ranks agree
    # on it through the store)
    link_model: Any = None
    link_classes_set: frozenset = frozenset()  # the classes the user gave figures for
    # gather/scatter/all_to_all blocks from this size up go single copy within a host; 0: never
    single_copy_bytes: int = _C.DEFAULT_SINGLE_COPY_BYTES
    # collectives the flight recorder keeps (Communicator.debug_dump); 0: none
    flight_entries: int = DEFAULT_FLIGHT_ENTRIES
    # how sends are copied into a peer's shm slots: "auto" (measured), "cached", "streaming"
    shm_copy: str = "auto"
    # TCP connections per tcp link; each direction's bytes go to them in turn, 64 KiB at a time
    socket_nstreams: int = 1
    # the device links' slot size: segment_bytes when given, else DEFAULT_DEVICE_SEGMENT_BYTES
    device_segment_bytes: int = DEFAULT_DEVICE_SEGMENT_BYTES
    # where a rank's threads run when the launcher left it open: "auto" or "off" (_affinity.py)
    affinity: str = "auto"


def _timeout_seconds(value: Any, source: str) -> float:
    if isinstance(value, datetime.timedelta):
        seconds = value.total_seconds()
    else:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            raise ValueError(
                f"{source}: timeout must be seconds or a timedelta, got {value!r}"
            ) from None
    if not seconds > 0:
        raise ValueError(f"{source}: timeout must be positive, got {value!r}")
    return seconds


def parse_bytes(value: Any, source: str) -> int:
    """Parses 4096, '4096', '64k', '1M' or '1MiB' into bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    else:
        text = str(value).strip().lower().removesuffix("ib").removesuffix("b")
        scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(text[-1:], 1)
        digits = text[:-1] if scale > 1 else text
        try:
            n = int(digits) * scale
        except ValueError:
            raise ValueError(
                f"{source}: expected a byte count such as 65536, '64k' or '1M', got {value!r}"
            ) from None
    if n < 8:
        raise ValueError(f"{source}: must be at least 8 bytes, got {n}")
    return n


def _choice(name: str, value: str, valid: tuple[str, ...], upper: bool = False) -> str:
    v = value.upper() if upper else value.lower()
    if v not in valid:
        raise ValueError(f"{name}={value!r} is not valid (valid: {', '.join(valid)})")
    return v


def parse_link_model(value: Any, source: str) -> tuple[dict[str, list[float]], frozenset]:
    """{'tcp': (alpha_us, gbps), ...} or 'tcp=25/2.9,shm=4/5' (the keys of DEFAULT_LINK_MODEL)
    over the defaults -> ({class: [alpha s, bytes/s]}, the classes given)."""
    model = dict(DEFAULT_LINK_MODEL)
    items: Any = value.items() if isinstance(value, dict) else None
    if items is None:
        items = []
        for part in str(value).split(","):
            name, sep, figures = part.partition("=")
            alpha, slash, gbps = figures.partition("/")
            if not (sep and slash):
                raise ValueError(f"{source}: expected NAME=ALPHA_US/GBPS entries such as "
                                 f"'tcp=25/2.9', got {part.strip()!r}")
            items.append((name.strip(), (alpha, gbps)))
    for name, figures in items:
        if name not in model:
            raise ValueError(f"{source}: unknown link class {name!r} "
                             f"(valid: {', '.join(model)})")
        try:
            alpha, gbps = (float(x) for x in figures)
        except (TypeError, ValueError):
            raise ValueError(f"{source}: {name} needs (alpha_us, GB/s), got {figures!r}") from None
        if alpha < 0 or not gbps > 0:
            raise ValueError(f"{source}: {name} needs alpha >= 0 and a positive bandwidth, "
                             f"got {figures!r}")
        model[name] = (alpha, gbps)
    figures = {name: [alpha * 1e-6, gbps * 1e9] for name, (alpha, gbps) in model.items()}
    return figures, frozenset(name for name, _ in items)


def resolve(timeout: Any = None, segment_bytes: Any = None, transport: str | None = None,
            algo: str | None = None, topology: Any = None, link_model: Any = None) -> Config:
    env = os.environ
    if timeout is not None:
        timeout_s = _timeout_seconds(timeout, "init(timeout=...)")
    elif env.get("PYRING_TIMEOUT"):
        timeout_s = _timeout_seconds(env["PYRING_TIMEOUT"], "PYRING_TIMEOUT")
    else:
        timeout_s = DEFAULT_TIMEOUT_S
    if segment_bytes is not None:
        seg = parse_bytes(segment_bytes, "init(segment_bytes=...)")
    elif env.get("PYRING_SEGMENT_BYTES"):
        seg = parse_bytes(env["PYRING_SEGMENT_BYTES"], "PYRING_SEGMENT_BYTES")
    else:
        seg = DEFAULT_SEGMENT_BYTES
    seg -= seg % 8
    given_seg = segment_bytes is not None or bool(env.get("PYRING_SEGMENT_BYTES"))
    device_seg = seg if given_seg else DEFAULT_DEVICE_SEGMENT_BYTES
    if transport is not None:
        trans = _choice("init(transport=...)", transport, TRANSPORTS)
    else:
        trans = _choice("PYRING_TRANSPORT", env.get("PYRING_TRANSPORT", "auto"), TRANSPORTS)
    if algo is not None:
        alg = _choice("init(algo=...)", algo, ALGOS)
    else:
        alg = _choice("PYRING_ALGO", env.get("PYRING_ALGO", "auto"), ALGOS)
    debug = _choice("PYRING_DEBUG", env.get("PYRING_DEBUG", "WARN"), DEBUG_LEVELS, upper=True)
    topology_source = "init(topology=...)"
    if topology is None:
        topology = env.get("PYRING_TOPOLOGY") or "auto"
        topology_source = "PYRING_TOPOLOGY"
    elif not isinstance(topology, (str, list, tuple)):
        raise TypeError(f"init(topology=...) must be a str or nested lists of ranks, got "
                        f"{type(topology).__name__}")
    if link_model is not None:
        model, given = parse_link_model(link_model, "init(link_model=...)")
    elif env.get("PYRING_LINK_MODEL"):
        model, given = parse_link_model(env["PYRING_LINK_MODEL"], "PYRING_LINK_MODEL")
    else:
        model, given = parse_link_model({}, "defaults")
    single = env.get("PYRING_SINGLE_COPY_BYTES", "").strip()
    single_bytes = (0 if single == "0" else parse_bytes(single, "PYRING_SINGLE_COPY_BYTES")
                    if single else _C.DEFAULT_SINGLE_COPY_BYTES)
    flight = env.get("PYRING_FLIGHT_RECORDER", "").strip() or str(DEFAULT_FLIGHT_ENTRIES)
    if not flight.isdigit():
        raise ValueError(f"PYRING_FLIGHT_RECORDER={flight!r} is not valid (valid: a count of "
                         f"collectives to keep, 0 for none)")
    shm_copy = _choice("PYRING_SHM_COPY", env.get("PYRING_SHM_COPY", "auto"), SHM_COPIES)
    nstreams = env.get("PYRING_SOCKET_NSTREAMS", "").strip() or "1"
    if not (nstreams.isdigit() and 1 <= int(nstreams) <= MAX_SOCKET_NSTREAMS):
        raise ValueError(f"PYRING_SOCKET_NSTREAMS={nstreams!r} is not valid (valid: 1 to "
                         f"{MAX_SOCKET_NSTREAMS} TCP connections per link)")
    affinity = _choice("PYRING_AFFINITY", env.get("PYRING_AFFINITY", "auto"), AFFINITY_MODES)
    return Config(timeout_s, seg, trans, alg, debug, env.get("PYRING_SOCKET_IFNAME") or None,
                  topology, topology_source, model, given, single_bytes, int(flight), shm_copy,
                  int(nstreams), device_seg, affinity)
