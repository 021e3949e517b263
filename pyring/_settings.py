"""Every PYRING_* variable, written once: its name, the values it takes, its default, its
meaning and its parser.

`read` gives a variable's value (the environment's, else the default) through the row's
parser, so that a keyword argument of init() and the variable parse alike; the numeric
defaults are the core's own (`Options` in csrc/core/communicator.h, exported by `_C`). The
configuration page (docs/configuration.md) carries the two tables that `markdown()` writes:
`python -c "import pyring._settings as s; s.write_page()"` renews them, and tests/test_docs.py
fails while the page and this table differ.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from . import _C
from .runtime import affinity as _affinity

TRANSPORTS: tuple[str, ...] = ("auto",) + tuple(_C.TRANSPORT_NAMES)
ALGOS: tuple[str, ...] = tuple(_C.ALGO_NAMES)  # index = the core's code
DEBUG_LEVELS = ("WARN", "INFO", "DETAIL")
SHM_COPIES: tuple[str, ...] = tuple(_C.SHM_COPY_NAMES)  # index = the core's code
MAX_SOCKET_NSTREAMS: int = _C.MAX_TCP_STREAMS
START_METHODS = ("spawn", "forkserver")  # pyring.launch's ways to start rank processes
_BEGIN, _END = "<!-- settings table: begin -->", "<!-- settings table: end -->"


def seconds(value: Any, source: str) -> float:
    """Positive seconds: a number, its text, or a timedelta."""
    if isinstance(value, datetime.timedelta):
        s = value.total_seconds()
    else:
        try:
            s = float(value)
        except (TypeError, ValueError):
            raise ValueError(
                f"{source}: timeout must be seconds or a timedelta, got {value!r}") from None
    if not s > 0:
        raise ValueError(f"{source}: timeout must be positive, got {value!r}")
    return s


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


def _bytes_or_zero(value: Any, source: str) -> int:
    return 0 if str(value).strip() == "0" else parse_bytes(value, source)


def _choice(valid: tuple[str, ...], upper: bool = False) -> Callable[[Any, str], str]:
    def parse(value: Any, source: str) -> str:
        v = str(value).upper() if upper else str(value).lower()
        if v not in valid:
            raise ValueError(f"{source}={value!r} is not valid (valid: {', '.join(valid)})")
        return v
    return parse


def _count(low: int, high: int | None, what: str) -> Callable[[Any, str], int]:
    def parse(value: Any, source: str) -> int:
        text = str(value).strip()
        if not (text.isdigit() and int(text) >= low and (high is None or int(text) <= high)):
            raise ValueError(f"{source}={value!r} is not valid (valid: {what})")
        return int(text)
    return parse


def _text(value: Any, source: str) -> str:
    return str(value).strip()


@dataclass(frozen=True)
class Setting:
    variable: str
    values: str  # the spellings it takes, for the page
    default: Any  # the value when unset; None: decided at init, as `meaning` says
    meaning: str
    parse: Callable[[Any, str], Any] = _text
    for_tests: bool = False


def _kib(n: int) -> str:
    return f"{n >> 20} MiB" if n % (1 << 20) == 0 else f"{n >> 10} KiB"


_DEFAULT_SEGMENT = int(_C.DEFAULT_SEGMENT_BYTES)
# A waiting rank's polling before it sleeps, when PYRING_SPIN_US is unset: long while every
# local rank has a core of its own (a sleep and wake-up costs tens of microseconds), short
# when ranks share cores (a polling rank would take the core from the rank it waits for).
SPIN_US_OWN_CORE, SPIN_US_SHARED_CORES = 1000, 20
# The device links' slot (cuda_ipc) unless segment_bytes is given. Each slot costs a copy, a
# kernel and two hand-offs between the ranks' progress threads, and ranks sharing a GPU take
# turns on it: a 64 MiB all_reduce of 2 ranks on one H200 took 1.96 ms with 2 MiB slots and
# 0.88 ms with 16 MiB (4 ranks: 6.36 and 2.49 ms; bench/results/ipc_slots_h200.json). A rank
# holds 8 slots in device memory, for its ring's left neighbour alone (128 MiB, whatever the
# number of ranks per host).
DEFAULT_DEVICE_SEGMENT_BYTES = 16 << 20

SETTINGS: tuple[Setting, ...] = (
    Setting("PYRING_TIMEOUT", "seconds", float(_C.DEFAULT_TIMEOUT_S),
            "deadline of the rendezvous and of every collective", seconds),
    Setting("PYRING_TRANSPORT", ", ".join(f"`{t}`" for t in TRANSPORTS), "auto",
            "`auto`: the transport registry picks per pair (shared memory within a host, TCP "
            "across hosts); a name forces that transport for every pair", _choice(TRANSPORTS)),
    Setting("PYRING_DEVICE", "`cuda:N`, `cuda`", None,
            "the device each rank binds at init when `init(device=...)` is not given; `cuda` is "
            "the current CUDA device (`torch.cuda.set_device`). Bound at init, ranks of one host "
            "move device buffers device to device over cuda_ipc, also through the `pyring` torch "
            "backend ([GPUs](gpus.md))"),
    Setting("PYRING_SEGMENT_BYTES", "bytes (`64k`, `1M`)", _DEFAULT_SEGMENT,
            f"pipelining unit: shm slot and TCP staging size; also the cuda_ipc slot when given "
            f"(else {_kib(DEFAULT_DEVICE_SEGMENT_BYTES)})",
            parse_bytes),
    Setting("PYRING_ALGO", ", ".join(f"`{a}`" for a in ALGOS), "auto",
            "allreduce algorithm: `ring` (reduce-scatter + allgather), `direct` (every input "
            "travels the ring, each rank reduces locally: half the hops), `tree` (reduce inside "
            "each group first; see [Topology](transports.md)), `auto` (the selector decides per "
            "call); `tree` also makes reduce-scatter and allgather take the tree on an even "
            "topology", _choice(ALGOS)),
    Setting("PYRING_TOPOLOGY", "`auto`, `flat`, `0,1;2,3\\|4,5;6,7`", "auto",
            "the tree of groups; see [Topology](transports.md)"),
    Setting("PYRING_LINK_MODEL", "`tcp=25/2.9,shm=4/4.9`", None,
            "the selector's figures per link class: latency in µs / bandwidth in GB/s "
            "(`reduce=0/2` for the local reduction rate); unset: each transport's own"),
    Setting("PYRING_SOCKET_IFNAME", "interface name", None,
            "the interface whose IPv4 address TCP links listen on"),
    Setting("PYRING_SOCKET_NSTREAMS", f"`1` to `{MAX_SOCKET_NSTREAMS}`", 1,
            "TCP connections per tcp link, each direction's bytes dealt to them in turn in 64 "
            "KiB stripes; for paths that limit each flow (many cloud networks) or spread flows "
            "over NIC queues. Every rank must set the same value (where two ranks differ, both "
            "fail at once naming both counts). On one host's loopback it does not help "
            "([results](results.md#side-by-side-in-the-same-processes-interleaved_json))",
            _count(1, MAX_SOCKET_NSTREAMS, f"1 to {MAX_SOCKET_NSTREAMS} TCP connections per "
                   "link")),
    Setting("PYRING_SPIN_US", "microseconds", None,
            f"how long a waiting rank polls before it sleeps on a futex (unset: "
            f"{SPIN_US_OWN_CORE} when every local rank has a core of its own, else "
            f"{SPIN_US_SHARED_CORES}); on the progress thread (async calls, which overlap the "
            f"caller's compute) at most {_C.PROGRESS_SPIN_US}. A single-connection TCP link "
            f"does not poll when its next piece is not expected within 100 us (from how its "
            f"recent bytes arrived): it sleeps in poll() until the piece, or 64 KiB of it, "
            f"is there",
            _count(0, None, "a count of microseconds")),
    Setting("PYRING_AFFINITY", ", ".join(f"`{m}`" for m in _affinity.MODES), "auto",
            "`auto`: where every local rank may run on the same CPUs (torchrun, `mp.spawn`: the "
            "launcher bound nothing), each rank's init thread is bound at init to its contiguous "
            "share of them, as `mpirun --bind-to` would, and pyring's threads and those it "
            "starts later inherit it: two ranks never share a core for a whole run, which "
            "otherwise made a 4 KiB allreduce 20x slower in some runs. Left alone where the "
            "launcher gave the ranks different CPUs, or fewer CPUs than local ranks. `off`: no "
            "binding. `PYRING_DEBUG=INFO` logs what was done ([Latency](latency.md))",
            _choice(_affinity.MODES)),
    Setting("PYRING_SHM_COPY", ", ".join(f"`{c}`" for c in SHM_COPIES), "auto",
            "how sends are copied into a local peer's shm slots: memcpy, non-temporal stores, "
            "or `auto` (measured per link, see [Transports](transports.md))",
            _choice(SHM_COPIES)),
    Setting("PYRING_SINGLE_COPY_BYTES", "bytes (`64k`), `0`", int(_C.DEFAULT_SINGLE_COPY_BYTES),
            "gather, scatter and all-to-all blocks from this size up are read single copy "
            "between ranks of one host; `0` never", _bytes_or_zero),
    Setting("PYRING_DEBUG", ", ".join(f"`{d}`" for d in DEBUG_LEVELS), "WARN",
            "log level; `INFO` logs the topology (once, rank 0), each rank's links, each "
            "distinct selector decision with its reason, and connections dropped during the "
            "rendezvous; `DETAIL` also checks that every rank calls the same collective "
            "([Reliability](reliability.md))", _choice(DEBUG_LEVELS, upper=True)),
    Setting("PYRING_IPC_TRACE", "path prefix", None,
            "each cuda_ipc link notes when each slot's copy was queued and published and when "
            "each slot from its peer was handed on and released, and writes them as it closes "
            "to `PREFIX.<pid>.<local rank>-<peer's>.csv`; `bench/probes/ipc_slots.py --trace` "
            "summarises them ([GPUs](gpus.md))"),
    Setting("PYRING_FLIGHT_RECORDER", "count, `0`", int(_C.DEFAULT_FLIGHT_ENTRIES),
            "collectives each rank's flight recorder keeps; `0` none",
            _count(0, None, "a count of collectives to keep, 0 for none")),
    Setting("PYRING_START_METHOD", ", ".join(f"`{m}`" for m in START_METHODS), "spawn",
            "how `pyring.launch` (the main job, `bench/`) starts local rank processes: "
            "`forkserver` forks them from a server that imported torch and pyring once, so a "
            "rank starts in milliseconds rather than seconds; quicker where many jobs start in "
            "turn or ranks outnumber cores. The tests use it", _choice(START_METHODS)),
    Setting("PYRING_SIM_DEVICES", "count", int(_C.SIM_DEFAULT_DEVICES),
            "sim devices the sim runtime offers; the sim device is for tests only "
            "([GPUs](gpus.md))", for_tests=True),
    Setting("PYRING_SIM_DELAY_US", "microseconds", None,
            "set: every operation queued on a sim stream first waits a random 0 to this many "
            "microseconds, so that a missing stream wait shows as a wrong result",
            for_tests=True),
    Setting("PYRING_SIM_IPC", "`refuse`", None,
            "the sim runtime refuses IPC handles, as a runtime without IPC does: device links "
            "fall back to staging", for_tests=True),
    Setting("PYRING_SIM_STREAM_MEMOPS", "`off`", None,
            "the sim device has no stream memory operations, as a driver that disables them: "
            "the first device collective raises CudaError saying what to do", for_tests=True),
    Setting("PYRING_SIM_CAPACITY", "bytes", None,
            "each sim device holds at most this many bytes of device memory; past it an "
            "allocation fails as cudaMalloc's out of memory does", for_tests=True),
    Setting("PYRING_SIMD", "`sse`", None,
            "the host's one-bit codec and float16 wire casts keep to their SSE2 and scalar "
            "forms where the CPU has AVX2; the two give the same bits, and tests check it",
            for_tests=True),
    Setting("PYRING_EMULATE_HOST", "host name", None,
            "set by `pyring.tools.emulate` in each emulated host's ranks: the host identity they "
            "publish at rendezvous", for_tests=True),
    Setting("PYRING_EMULATE_RESULT", "path", None,
            "set by `pyring.tools.emulate`: where an emulated host's rank writes its result",
            for_tests=True),
    Setting("PYRING_SANITIZED", "`address,undefined`, `undefined`, `thread`", None,
            "set by `pyring.testing.sanitize` in the processes it runs on a sanitizer build: "
            "tests scale the deadlines they size to the work, and skip memory checks that a "
            "sanitizer's quarantine defeats ([Sanitizers](sanitizers.md))", for_tests=True),
)
BY_VARIABLE: dict[str, Setting] = {s.variable: s for s in SETTINGS}


def read(variable: str, env: Mapping[str, str] | None = None) -> Any:
    """The variable's parsed value from `env` (default os.environ), else its default; an empty
    value counts as unset. A malformed value is a ValueError naming the variable."""
    s = BY_VARIABLE[variable]
    text = (os.environ if env is None else env).get(variable, "").strip()
    return s.parse(text, variable) if text else s.default


def given(variable: str, env: Mapping[str, str] | None = None) -> bool:
    return bool((os.environ if env is None else env).get(variable, "").strip())


def _default_text(s: Setting) -> str:
    if s.default is None:
        return "unset"
    if s.parse in (parse_bytes, _bytes_or_zero):
        return _kib(s.default)
    if isinstance(s.default, float) and s.default.is_integer():
        return f"`{int(s.default)}`"
    return f"`{s.default}`"


def markdown(for_tests: bool) -> str:
    """The configuration page's table of the users' variables, or of those for tests."""
    rows = ["| variable | values | default | meaning |", "|---|---|---|---|"]
    rows += [f"| `{s.variable}` | {s.values} | {_default_text(s)} | {s.meaning} |"
             for s in SETTINGS if s.for_tests == for_tests]
    return "\n".join(rows)


def render_page(page: str) -> str:
    """`page` with the text between each pair of markers replaced by its table, the users'
    first and then the tests'."""
    parts = page.split(_BEGIN)
    if len(parts) != 3 or any(_END not in p for p in parts[1:]):
        raise ValueError(f"the configuration page needs two {_BEGIN} ... {_END} blocks")
    out = parts[0]
    for part, tests in zip(parts[1:], (False, True)):
        out += f"{_BEGIN}\n{markdown(tests)}\n{_END}" + part.split(_END, 1)[1]
    return out


PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def write_page(page: Path | None = None) -> None:
    """Renews the tables of the configuration page of a source tree: ``page``, else the
    working folder's docs/configuration.md (run from a clone's root, where pyring loads from
    the installed copy), else the one beside this package. Raises FileNotFoundError naming
    where it looked."""
    if page is None:
        here = Path.cwd() / "docs" / "configuration.md"
        page = here if here.exists() else PAGE
    if not page.exists():
        raise FileNotFoundError(f"no configuration page at {page}: run this from a clone's "
                                f"root, or pass write_page(page=...)")
    page.write_text(render_page(page.read_text()))
