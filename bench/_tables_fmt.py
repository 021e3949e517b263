"""Number formats and the Markdown table of bench/tables.py's renderers: times in µs, ms or s
with 3 significant digits, ratios with 2 (3 below 2), sizes in KiB/MiB/GiB."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

DASH = "–"
LIB = {"pyring": "pyring", "mpi": "Open MPI", "gloo": "gloo", "oneccl": "oneCCL",
       "memcpy": "memcpy", "tcp": "tcp"}
SHORT = {"mpi": "MPI", "oneccl": "oneCCL"}  # a library's name in an X/pyring column


def sig(x: float, n: int = 3) -> str:
    """x with n significant digits, never fewer than its integer digits."""
    if x == 0 or not math.isfinite(x):
        return f"{x:.{n - 1}f}" if x == 0 else str(x)
    d = max(0, n - 1 - math.floor(math.log10(abs(x))))
    r = round(x, d)
    if r and math.floor(math.log10(abs(r))) != math.floor(math.log10(abs(x))):
        d = max(0, n - 1 - math.floor(math.log10(abs(r))))
    return f"{x:.{d}f}"


def _unit(us: float) -> tuple[float, str]:
    for scale, unit in ((1.0, "µs"), (1e3, "ms")):
        if float(sig(us / scale)) < 1000:
            return scale, unit
    return 1e6, "s"


def t(us: float, n: int = 3) -> str:
    """A time given in µs."""
    scale, unit = _unit(us)
    return f"{sig(us / scale, n)} {unit}"


def t_pair(a: float, b: float) -> str:
    """Two times in µs as 'a / b unit', in the smaller one's unit."""
    scale, unit = _unit(min(a, b))
    return f"{sig(a / scale)} / {sig(b / scale)} {unit}"


def t_range(values: Iterable[float]) -> str:
    """The least and greatest of times in µs as 'lo–hi unit', in the greater one's unit."""
    vs = list(values)
    scale, unit = _unit(max(vs))
    lo, hi = sig(min(vs) / scale), sig(max(vs) / scale)
    return f"{lo} {unit}" if lo == hi else f"{lo}–{hi} {unit}"


def ratio(x: float) -> str:
    """2 significant digits, 3 below 2 (where 1.03 and 1.0 differ), no decimals from 10."""
    return f"{x:.0f}" if x >= 9.95 else f"{x:.1f}" if x >= 1.995 else f"{x:.2f}"


def ratio3(x: float) -> str:
    """3 significant digits, never fewer than 2 decimals below 10."""
    return f"{x:.0f}" if x >= 99.95 else f"{x:.1f}" if x >= 9.995 else f"{x:.2f}"


def span(values: Iterable[float], fmt=ratio3) -> str:
    """The least and greatest of values as 'lo–hi' (one value where they print alike)."""
    vs = list(values)
    lo, hi = fmt(min(vs)), fmt(max(vs))
    return lo if lo == hi else f"{lo}–{hi}"


def gbps(x: float) -> str:
    return f"{x:.2f} GB/s" if x < 0.995 else f"{x:.1f} GB/s"


def pct(x: float) -> str:
    return f"{x * 100:.0f}%"


def mb(n: float) -> str:
    return f"{sig(n / 1e6)} MB"


def size(n: int) -> str:
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def parse_sizes(text: str) -> list[int]:
    """'4K,1M,1G' -> bytes."""
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return [int(s[:-1]) * mult[s[-1].upper()] if s[-1].upper() in mult else int(s)
            for s in text.split(",") if s]


def rate_name(rate: str) -> str:
    """tc's '1gbit', '20mbit' -> '1 Gbit', '20 Mbit'."""
    return rate.replace("gbit", " Gbit").replace("mbit", " Mbit")


def lib_name(lib: str) -> str:
    base, _, variant = lib.partition("-")
    if base == "pyring" and variant.startswith("tcp") and variant[3:].isdigit():
        return f"{variant[3:]} connections"
    return LIB.get(lib, f"`{lib}`")


def table(header: Sequence[str], rows: Iterable[Sequence[str]], align: str = "") -> list[str]:
    """A Markdown table; align holds one letter per column, 'r' right, anything else left."""
    def line(cells: Sequence[str]) -> str:
        return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"

    return [line(header), "|" + "|".join("--:" if align[i:i + 1] == "r" else "---"
                                         for i in range(len(header))) + "|",
            *(line(r) for r in rows)]
