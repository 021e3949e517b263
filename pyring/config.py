"""Options: keyword arguments first, then the PYRING_* environment, then defaults, each
parsed and defaulted by its row of the one settings table (_settings.py).

An unknown or malformed value is a ValueError that names the variable and the valid values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import _C, _settings
from ._settings import (  # noqa: F401  (ALGOS, SHM_COPIES, parse_bytes: config's names)
    ALGOS,
    DEFAULT_DEVICE_SEGMENT_BYTES,
    SHM_COPIES,
    parse_bytes,
)

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
    topology: Any  # "auto", "flat", an explicit spec string or nested lists
    topology_source: str  # where it came from, for messages
    # link class -> [alpha s, bytes/s], and "reduce" -> [0, bytes/s] (JSON-ready: ranks agree
    # on it through the store)
    link_model: Any
    link_classes_set: frozenset  # the classes the user gave figures for
    # gather/scatter/all_to_all blocks from this size up go single copy within a host; 0: never
    single_copy_bytes: int
    # collectives the flight recorder keeps (Communicator.debug_dump); 0: none
    flight_entries: int
    # how sends are copied into a peer's shm slots: "auto" (measured), "cached", "streaming"
    shm_copy: str
    # TCP connections per tcp link; each direction's bytes go to them in turn, 64 KiB at a time
    socket_nstreams: int
    # the device links' slot size: segment_bytes when given, else DEFAULT_DEVICE_SEGMENT_BYTES
    device_segment_bytes: int
    # where a rank's threads run when the launcher left it open: "auto" or "off" (_affinity.py)
    affinity: str


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


def _keyword_or_env(name: str, value: Any, variable: str) -> Any:
    """init(name=value) parsed as its variable would be, else the variable's value."""
    if value is None:
        return _settings.read(variable)
    return _settings.BY_VARIABLE[variable].parse(value, f"init({name}=...)")


def resolve(timeout: Any = None, segment_bytes: Any = None, transport: str | None = None,
            algo: str | None = None, topology: Any = None, link_model: Any = None) -> Config:
    timeout_s = _keyword_or_env("timeout", timeout, "PYRING_TIMEOUT")
    seg = _keyword_or_env("segment_bytes", segment_bytes, "PYRING_SEGMENT_BYTES")
    seg -= seg % 8
    given_seg = segment_bytes is not None or _settings.given("PYRING_SEGMENT_BYTES")
    device_seg = seg if given_seg else DEFAULT_DEVICE_SEGMENT_BYTES
    trans = _keyword_or_env("transport", transport, "PYRING_TRANSPORT")
    alg = _keyword_or_env("algo", algo, "PYRING_ALGO")
    topology_source = "init(topology=...)"
    if topology is None:
        topology = _settings.read("PYRING_TOPOLOGY")
        topology_source = "PYRING_TOPOLOGY"
    elif not isinstance(topology, (str, list, tuple)):
        raise TypeError(f"init(topology=...) must be a str or nested lists of ranks, got "
                        f"{type(topology).__name__}")
    if link_model is not None:
        model, given = parse_link_model(link_model, "init(link_model=...)")
    elif _settings.given("PYRING_LINK_MODEL"):
        model, given = parse_link_model(_settings.read("PYRING_LINK_MODEL"), "PYRING_LINK_MODEL")
    else:
        model, given = parse_link_model({}, "defaults")
    return Config(timeout_s, seg, trans, alg, _settings.read("PYRING_DEBUG"),
                  _settings.read("PYRING_SOCKET_IFNAME"), topology, topology_source, model, given,
                  _settings.read("PYRING_SINGLE_COPY_BYTES"),
                  _settings.read("PYRING_FLIGHT_RECORDER"), _settings.read("PYRING_SHM_COPY"),
                  _settings.read("PYRING_SOCKET_NSTREAMS"), device_seg,
                  _settings.read("PYRING_AFFINITY"))
