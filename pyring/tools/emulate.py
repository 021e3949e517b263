"""Emulated hosts for tests and benchmarks: one Linux network namespace per host.

    ok, why = available()
    with EmulatedHosts(hosts=2, rate="1gbit") as hosts:
        results = hosts.run(2, [sys.executable, "job.py"])   # ranks call report(obj)

Each host is a network namespace with ``lo`` up and one interface ``eth0`` holding
``hosts.addresses[h]`` from a private /24 that no interface or route of this machine uses.
Two hosts are joined by one veth pair; more hosts by veth pairs to a bridge in one more
namespace. With ``rate`` set, every veth end shapes its egress with ``tc tbf``. Each host's
ranks run under one launcher in their own IPC and mount namespace with a private tmpfs on
/dev/shm (``shared_shm=True`` keeps the machine's /dev/shm), as a real host's ranks would.

Ownership: an EmulatedHosts removes exactly the namespaces it created (removing a namespace
removes its interfaces) and kills the processes it started, on close(), on exceptions inside
``with``, at exit and on SIGTERM/SIGINT (whose previous handlers then run). It needs root.

The launcher (pyring/tools/emulate_launch.py) is run by path and imports only the standard library.
"""

from __future__ import annotations

import atexit
import ipaddress
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any, Callable

IFNAME = "eth0"  # the host's interface inside its namespace
RESULT_ENV, HOST_ENV = "PYRING_EMULATE_RESULT", "PYRING_EMULATE_HOST"
_counter = itertools.count()
_live: set[EmulatedHosts] = set()
_old_handlers: dict[int, Any] = {}
_probed: dict[bool, tuple[bool, str]] = {}
_PRIVATE_SHM = 'mount -t tmpfs -o mode=1777 tmpfs /dev/shm && exec "$@"'


def report(obj: Any) -> None:
    """Called once by a rank: stores its JSON-serialisable result for EmulatedHosts.run."""
    path = os.environ.get(RESULT_ENV)
    if not path:
        raise RuntimeError(f"report(): {RESULT_ENV} is not set; run under EmulatedHosts.run")
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f)
    os.replace(path + ".tmp", path)


def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def available(shaping: bool = False) -> tuple[bool, str]:
    """(True, '') when this process can emulate hosts (and shape links, with ``shaping``),
    else (False, why). Probes once per process by creating and removing a namespace."""
    if shaping not in _probed:
        _probed[shaping] = _probe(shaping)
    return _probed[shaping]


def _probe(shaping: bool) -> tuple[bool, str]:
    tools = ("ip", "unshare", "mount", "sh") + (("tc",) if shaping else ())
    missing = [t for t in tools if shutil.which(t) is None]
    if sys.platform != "linux":
        return False, f"network namespaces need Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return False, "emulated hosts need root (network namespaces, tc, mount)"
    if missing:
        return False, f"not found on PATH: {', '.join(missing)}"
    ns = f"pyr{os.getpid()}probe{next(_counter)}"
    try:
        _sh("ip", "netns", "add", ns)
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        return False, f"cannot create a network namespace: {e}"
    try:
        _sh("ip", "netns", "exec", ns, "unshare", "--ipc", "--mount", "--propagation", "private",
            "sh", "-c", _PRIVATE_SHM, "sh", "true")
        if shaping:
            _sh("tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "tbf", "rate", "1gbit",
                "burst", "64kb", "latency", "10ms")
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        return False, str(e)
    finally:
        _sh("ip", "netns", "del", ns, check=False)
    return True, ""


def rate_bits(rate: str) -> int:
    """'1gbit', '500mbit', '10Gbit', '100kbit' or a number of bit/s -> bit/s."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmg]?)(?:bit)?", rate.strip().lower())
    if not m:
        raise ValueError(f"rate {rate!r}: expected e.g. '1gbit', '10gbit', '500mbit'")
    return int(float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)])


def default_burst(rate: str) -> int:
    """tbf bucket in bytes: 1 ms at the rate, at least 64 KiB. Measured on a 2-core VM with
    one TCP flow: 1gbit reaches 0.96 Gbit/s from 32 KiB up; 10gbit gets 6 Gbit/s with 64 KiB
    and 9.4-9.6 Gbit/s from 256 KiB up (9.55 with 1.25 MB)."""
    return max(64 * 1024, rate_bits(rate) // 8000)


def _used_networks() -> list[ipaddress.IPv4Network]:
    nets = []
    for line in _sh("ip", "-4", "-o", "addr", "show").stdout.splitlines():
        m = re.search(r"inet (\S+)", line)
        if m:
            nets.append(ipaddress.ip_interface(m.group(1)).network)
    for line in _sh("ip", "-4", "route", "show", "table", "all").stdout.splitlines():
        words = line.split() or ["-"]
        dst = words[1] if words[0] in ("local", "broadcast", "unicast") else words[0]
        try:
            nets.append(ipaddress.ip_network(dst, strict=False))
        except ValueError:  # "default", "unreachable", ...
            pass
    return nets


def _pick_subnet(seed: int) -> ipaddress.IPv4Network:
    used = _used_networks()
    for i in range(256 * 56):
        n = (seed + i) % (256 * 56)
        net = ipaddress.ip_network(f"10.{200 + n // 256}.{n % 256}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError("no free /24 in 10.200.0.0-10.255.255.0 for emulated hosts")


# One host's launcher, run by path inside the host's namespaces (standard library only).
_LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "emulate_launch.py")


def _tail(path: str, chars: int = 3000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-chars:]
    except OSError:
        return ""


class EmulatedHosts:
    """``hosts`` network namespaces joined by veth pairs; see the module docstring."""

    def __init__(self, hosts: int = 2, rate: str | None = None, burst: int | str | None = None,
                 latency: str = "10ms") -> None:
        if hosts < 1:
            raise ValueError(f"EmulatedHosts: hosts must be >= 1, got {hosts}")
        if rate is not None:
            rate_bits(rate)
        self.hosts, self.rate, self.latency = hosts, rate, latency
        self.burst = burst if burst is not None or rate is None else default_burst(rate)
        self._pid = os.getpid()
        self._n = next(_counter)
        self.prefix = f"pyr{self._pid}x{self._n}_"
        self.namespaces = [f"{self.prefix}h{i}" for i in range(hosts)]
        self.addresses: list[str] = []
        self.subnet: ipaddress.IPv4Network | None = None
        self._made: list[str] = []  # namespaces created so far, in creation order
        self._procs: list[subprocess.Popen] = []  # launchers of the current run
        self._tmp: str | None = None  # the current run's specs, logs and results
        self._runs = 0

    @property
    def link(self) -> dict[str, Any]:
        """The link settings, for benchmark records."""
        return {"hosts": self.hosts, "rate": self.rate, "burst_bytes": self.burst,
                "latency": self.latency if self.rate else None, "subnet": str(self.subnet),
                "topology": "veth pair" if self.hosts == 2 else "veth star on a bridge"}

    def __enter__(self) -> EmulatedHosts:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def start(self) -> None:
        """Creates the namespaces and links; on failure removes what it made and raises."""
        ok, why = available(self.rate is not None)
        if not ok:
            raise RuntimeError(f"cannot emulate hosts: {why}")
        _register(self)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _netns(self, name: str) -> None:
        _sh("ip", "netns", "add", name)
        self._made.append(name)
        _sh("ip", "-n", name, "link", "set", "lo", "up")

    def _shape(self, ns: str, dev: str) -> None:
        if self.rate:
            _sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", self.rate,
                "burst", str(self.burst), "latency", self.latency)

    def _build(self) -> None:
        self.subnet = _pick_subnet(self._pid * 7 + self._n)
        hosts = list(self.subnet.hosts())
        self.addresses = [str(hosts[i]) for i in range(self.hosts)]
        for ns in self.namespaces:
            self._netns(ns)
        if self.hosts == 2:
            a, b = self.namespaces
            _sh("ip", "-n", a, "link", "add", IFNAME, "type", "veth", "peer", "name", IFNAME,
                "netns", b)
        elif self.hosts > 2:
            br = f"{self.prefix}br"
            self._netns(br)
            _sh("ip", "-n", br, "link", "add", "br0", "type", "bridge")
            _sh("ip", "-n", br, "link", "set", "br0", "up")
            for i, ns in enumerate(self.namespaces):
                port = f"p{i}"
                _sh("ip", "-n", br, "link", "add", port, "type", "veth", "peer", "name", IFNAME,
                    "netns", ns)
                _sh("ip", "-n", br, "link", "set", port, "master", "br0")
                _sh("ip", "-n", br, "link", "set", port, "up")
                self._shape(br, port)
        if self.hosts >= 2:
            for ns, addr in zip(self.namespaces, self.addresses):
                _sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", IFNAME)
                _sh("ip", "-n", ns, "link", "set", IFNAME, "up")
                self._shape(ns, IFNAME)
        else:
            _sh("ip", "-n", self.namespaces[0], "addr", "add", f"{self.addresses[0]}/32",
                "dev", "lo")

    def _kill(self) -> None:
        for p in self._procs:
            try:  # the launcher leads its ranks' process group, which outlives a dead launcher
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._procs = []

    def _end_run(self) -> None:
        self._kill()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def close(self) -> None:
        """Kills this object's processes and removes its namespaces; idempotent."""
        if os.getpid() != self._pid:  # a forked child owns nothing
            return
        self._end_run()
        for ns in reversed(self._made):
            _sh("ip", "netns", "del", ns, check=False)
        self._made = []
        _unregister(self)

    def run(self, ranks_per_host: int | Sequence[int], argv: Sequence[str],
            env: dict[str, str] | None = None, timeout: float = 120.0, *,
            shared_shm: bool = False, grace: float = 5.0,
            progress: Callable[[], None] | None = None) -> list[Any]:
        """Runs ``argv`` as every rank and returns what each passed to report(), in rank order.

        ``ranks_per_host``: k (every host) or one count per host; host h runs the next
        ranks in order. Every rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
        MASTER_ADDR (host 0), MASTER_PORT, GLOO_SOCKET_IFNAME, PYRING_EMULATE_HOST and
        PYRING_EMULATE_RESULT over this process's environment, then ``env`` over those.
        Raises pyring.launch.RankFailure naming every rank that failed or left no result: ``grace``
        seconds after the first failure, or at ``timeout``, every process still running is
        killed. ``progress`` is called about every 50 ms while the ranks run."""
        if not self._made:
            raise RuntimeError("EmulatedHosts.run: call start() or enter the with block first")
        counts = [ranks_per_host] * self.hosts if isinstance(ranks_per_host, int) \
            else list(ranks_per_host)
        if len(counts) != self.hosts or min(counts) < 1:
            raise ValueError(f"ranks_per_host: {self.hosts} counts >= 1 needed, got {counts}")
        world, port = sum(counts), 29500 + self._runs % 1000
        self._runs += 1
        self._tmp = tmp = tempfile.mkdtemp(prefix=self.prefix)
        try:
            self._spawn(counts, list(argv), env or {}, tmp, port, shared_shm)
            return self._wait(world, tmp, timeout, grace, progress)
        finally:
            self._end_run()

    def _spawn(self, counts: list[int], argv: list[str], env: dict[str, str], tmp: str,
               port: int, shared_shm: bool) -> None:
        first, world = 0, sum(counts)
        for h, k in enumerate(counts):
            ranks = []
            for local in range(k):
                r = first + local
                renv = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world),
                            LOCAL_RANK=str(local), LOCAL_WORLD_SIZE=str(k),
                            MASTER_ADDR=self.addresses[0], MASTER_PORT=str(port),
                            GLOO_SOCKET_IFNAME=IFNAME if self.hosts > 1 else "lo",
                            **{HOST_ENV: str(h), RESULT_ENV: os.path.join(tmp, f"rank{r}.json")})
                renv.update(env)
                ranks.append({"rank": r, "argv": argv, "env": renv,
                              "out": os.path.join(tmp, f"rank{r}.out"),
                              "err": os.path.join(tmp, f"rank{r}.err"),
                              "rc": os.path.join(tmp, f"rank{r}.rc")})
            spec = os.path.join(tmp, f"host{h}.json")
            with open(spec, "w") as f:
                json.dump(ranks, f)
            launcher = [sys.executable, "-I", _LAUNCHER, spec]
            prefix = ["unshare", "--ipc"]
            if not shared_shm:
                prefix = [*prefix, "--mount", "--propagation", "private", "sh", "-c",
                          _PRIVATE_SHM, "sh"]
            with open(os.path.join(tmp, f"host{h}.log"), "w") as log:
                self._procs.append(subprocess.Popen(
                    ["ip", "netns", "exec", self.namespaces[h], *prefix, *launcher],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True))
            first += k

    def _wait(self, world: int, tmp: str, timeout: float, grace: float,
              progress: Callable[[], None] | None) -> list[Any]:
        def path(r: int, ext: str) -> str:
            return os.path.join(tmp, f"rank{r}.{ext}")

        deadline, failed_at, note = time.monotonic() + timeout, None, ""
        rcs: dict[int, int] = {}
        while True:
            if progress is not None:
                progress()
            for r in range(world):
                if r not in rcs and os.path.exists(path(r, "rc")):
                    with open(path(r, "rc")) as f:
                        rcs[r] = int(f.read())
            bad = any(rc != 0 or not os.path.exists(path(r, "json")) for r, rc in rcs.items())
            dead_launcher = any(p.poll() not in (None, 0) for p in self._procs)
            now = time.monotonic()
            if len(rcs) == world:
                break
            if (bad or dead_launcher) and failed_at is None:
                failed_at = now
            if failed_at is not None and now - failed_at > grace:
                note = f"; the others were killed {grace:g} s after the first failure"
                break
            if now > deadline:
                note = f"; killed at the timeout of {timeout:g} s"
                break
            time.sleep(0.05)
        self._kill()
        failures, results = {}, []
        for r in range(world):
            rc = rcs.get(r)
            if rc == 0 and os.path.exists(path(r, "json")):
                with open(path(r, "json")) as f:
                    results.append(json.load(f))
                continue
            why = ("still running, killed" if rc is None else
                   f"exit status {rc}" + (", no result reported" if rc == 0 else ""))
            failures[r] = ("Hang" if rc is None else "Exit", why, _tail(path(r, "err")))
        if failures:
            # Here, not at the top: this file also runs by path where pyring is not built.
            from pyring.launch import RankFailure

            logs = [_tail(os.path.join(tmp, f"host{h}.log"), 1500) for h in range(self.hosts)]
            logs = "".join(f"--- launcher of host {h}:\n{t}\n" for h, t in enumerate(logs) if t)
            raise RankFailure(failures, note + ("\n" + logs if logs else ""))
        return results


def _cleanup_all() -> None:
    for hosts in list(_live):
        hosts.close()


def _on_signal(signum: int, frame: Any) -> None:
    old = _old_handlers.get(signum, signal.SIG_DFL)
    _cleanup_all()  # also restores every handler we replaced
    if callable(old):
        old(signum, frame)
    elif old == signal.SIG_DFL:
        os.kill(os.getpid(), signum)


def _register(hosts: EmulatedHosts) -> None:
    if not _live and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            # A signal the process ignores (SIGINT in a background job) stays ignored.
            if signal.getsignal(sig) is not signal.SIG_IGN:
                _old_handlers[sig] = signal.signal(sig, _on_signal)
    _live.add(hosts)


def _unregister(hosts: EmulatedHosts) -> None:
    _live.discard(hosts)
    if not _live and threading.current_thread() is threading.main_thread():
        for sig, old in list(_old_handlers.items()):
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
        _old_handlers.clear()


atexit.register(_cleanup_all)
