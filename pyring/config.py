"""Options: keyword arguments first, then the PYRING_* environment, then defaults.

An unknown or malformed value is a ValueError that names the variable and the valid values.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

DEFAULT_TIMEOUT_S = 300.0
DEFAULT_SEGMENT_BYTES = 256 * 1024
TRANSPORTS = ("auto", "shm", "tcp")
ALGOS = ("auto", "ring", "direct")  # codes 0, 1, 2 in the core
DEBUG_LEVELS = ("WARN", "INFO", "DETAIL")


@dataclass(frozen=True)
class Config:
    timeout_s: float
    segment_bytes: int
    transport: str
    algo: str
    debug: str
    socket_ifname: str | None


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
        raise ValueError(f"{source}: segment_bytes must be at least 8, got {n}")
    return n


def _choice(name: str, value: str, valid: tuple[str, ...], upper: bool = False) -> str:
    v = value.upper() if upper else value.lower()
    if v not in valid:
        raise ValueError(f"{name}={value!r} is not valid (valid: {', '.join(valid)})")
    return v


def resolve(timeout: Any = None, segment_bytes: Any = None, transport: str | None = None,
            algo: str | None = None) -> Config:
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
    if transport is not None:
        trans = _choice("init(transport=...)", transport, TRANSPORTS)
    else:
        trans = _choice("PYRING_TRANSPORT", env.get("PYRING_TRANSPORT", "auto"), TRANSPORTS)
    if algo is not None:
        alg = _choice("init(algo=...)", algo, ALGOS)
    else:
        alg = _choice("PYRING_ALGO", env.get("PYRING_ALGO", "auto"), ALGOS)
    debug = _choice("PYRING_DEBUG", env.get("PYRING_DEBUG", "WARN"), DEBUG_LEVELS, upper=True)
    return Config(timeout_s, seg, trans, alg, debug, env.get("PYRING_SOCKET_IFNAME") or None)
