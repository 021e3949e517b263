"""Several hosts emulated with network namespaces (pyring.tools.emulate): host detection, shm inside
a host and tcp across, allreduce results per algorithm, bytes on the links between hosts, and
cleanup of every namespace, also when a rank fails or the test process is signalled."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from pyring.launch import RankFailure
from pyring.tools import emulate as _emulate
from pyring.tools.emulate import EmulatedHosts

OK, WHY = _emulate.available()
pytestmark = pytest.mark.skipif(not OK, reason=WHY)
JOB = os.path.join(os.path.dirname(__file__), "scripts", "hosts_job.py")
ALGOS = ["ring", "tree", "auto"]
HEADER_ALLOWANCE = 256  # bytes per collective per link, beyond the payload


def namespaces(prefix: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return sorted(line.split()[0] for line in out.stdout.splitlines() if line.startswith(prefix))


@pytest.fixture
def hosts():
    with EmulatedHosts(hosts=2) as h:
        assert namespaces(h.prefix) == sorted(h.namespaces)
        yield h
    assert namespaces(h.prefix) == [], "namespaces outlived their EmulatedHosts"


def run_job(h: EmulatedHosts, layout, cfg: dict, **kw) -> list[dict]:
    res = h.run(layout, [sys.executable, JOB, json.dumps(cfg)], env={"OMP_NUM_THREADS": "1"},
                timeout=100, **kw)
    wrong = [w for r in res for w in r["wrong"]]
    assert not wrong, "\n".join(wrong[:20])
    return res


def host_of(layout: list[int]) -> list[int]:
    return [h for h, k in enumerate(layout) for _ in range(k)]


def check_hosts(res: list[dict], layout: list[int], private_shm: bool = True) -> None:
    """Each host's ranks share one IPC and network namespace (and /dev/shm when private)
    that no other host's ranks have."""
    where = host_of(layout)
    assert [r["host"] for r in res] == where
    for key in ("ipc_ns", "net_ns") + (("shm_dev",) if private_shm else ()):
        per_host = [{r[key] for r in res if r["host"] == h} for h in range(len(layout))]
        assert all(len(s) == 1 for s in per_host), (key, per_host)
        assert len(set.union(*per_host)) == len(layout), (key, per_host)
    mine = os.stat("/dev/shm").st_dev
    assert all((r["shm_dev"] != mine) == private_shm for r in res)
    for r in res:
        assert r["local"] == [where[: r["rank"]].count(where[r["rank"]]), layout[where[r["rank"]]]]
        world = len(res)
        for peer in ((r["rank"] - 1) % world, (r["rank"] + 1) % world):
            assert r["transports"][str(peer)] is not None, f"rank {r['rank']}: no link to {peer}"
        for peer, kind in r["transports"].items():
            want = "shm" if where[int(peer)] == r["host"] else "tcp"
            assert kind in (None, want), f"rank {r['rank']} -> {peer}: {kind}, want {want}"


def check_groups(res: list[dict], layout: list[int]) -> None:
    want, first = [], 0
    for k in layout:
        want.append(list(range(first, first + k)))
        first += k
    for r in res:
        assert r["groups"][-1] == want, r


def crossing(res: list[dict], algo: str, layout: list[int], src: int) -> tuple[int, int]:
    """(bytes sent by host ``src``'s ranks to the other host's ranks, links that carried any)
    during the counted allreduce of ``algo``."""
    where = host_of(layout)
    sent = [(n, int(p)) for r in res if r["host"] == src
            for p, n in r["sent"][algo].items() if where[int(p)] != src]
    return sum(n for n, _ in sent), sum(1 for n, _ in sent if n > 0)


def check_counters(res: list[dict], layout: list[int]) -> None:
    """tree: each host sends 2(H-1)/H * S = S across (H = 2); ring: every ring edge that
    crosses the host boundary carries 2(N-1)/N * S, in each direction."""
    size, world = res[0]["count_bytes"], len(res)
    for src in (0, 1):
        out, links = crossing(res, "tree", layout, src)
        assert links >= 1 and size <= out <= size + HEADER_ALLOWANCE * links, (src, out, links)
        out, links = crossing(res, "ring", layout, src)
        per_link = 2 * (world - 1) * size // world
        assert links >= 1, "the ring never crosses the host boundary"
        assert per_link * links <= out <= (per_link + HEADER_ALLOWANCE) * links, (src, out, links)


def test_two_hosts_of_two(hosts):
    layout = [2, 2]
    res = run_job(hosts, 2, {"mode": "check", "algos": ALGOS, "counters": True})
    check_hosts(res, layout)
    check_groups(res, layout)
    assert res[0]["groups"][-1] == [[0, 1], [2, 3]]
    assert (res[0]["transports"]["1"], res[0]["transports"]["3"]) == ("shm", "tcp")
    check_counters(res, layout)


def test_two_hosts_of_three(hosts):
    res = run_job(hosts, 3, {"mode": "check", "algos": ALGOS, "counters": True})
    check_hosts(res, [3, 3])
    check_groups(res, [3, 3])
    check_counters(res, [3, 3])


def test_uneven_hosts_explicit_topology(hosts):
    layout = [3, 2]
    res = run_job(hosts, layout, {"mode": "check", "algos": ALGOS, "counters": True,
                                  "topology": "0,1,2|3,4"})
    check_hosts(res, layout)
    check_groups(res, layout)
    check_counters(res, layout)


def test_hosts_sharing_dev_shm(hosts):
    """Hosts that see one /dev/shm (but not one IPC namespace) still run apart: no segment has
    a name there (core/shared_file.h), and the host key keeps each host's ranks to their own."""
    res = run_job(hosts, 2, {"mode": "check", "algos": ["ring", "tree"]}, shared_shm=True)
    check_hosts(res, [2, 2], private_shm=False)


def test_failing_rank_is_reported_and_cleaned_up(hosts):
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        hosts.run(2, [sys.executable, JOB, json.dumps({"mode": "fail", "fail_rank": 1})],
                  timeout=60, grace=1.0)
    assert time.monotonic() - start < 30
    assert set(info.value.failures) == {0, 1, 2, 3}
    assert "fails on purpose" in info.value.failures[1][2]
    assert all("killed" in info.value.failures[r][1] for r in (0, 2, 3))


def test_timeout_kills_every_rank(hosts):
    with pytest.raises(RankFailure, match="timeout of 2 s"):
        hosts.run(1, [sys.executable, JOB, json.dumps({"mode": "fail", "fail_rank": -1})],
                  timeout=2)


_SIGNALLED = """
import importlib.util, signal, sys, time
# Python's own SIGINT handler, even where the test runs as a background job (SIGINT ignored).
signal.signal(signal.SIGINT, signal.default_int_handler)
spec = importlib.util.spec_from_file_location("emulate", sys.argv[1])
emulate = importlib.util.module_from_spec(spec)
spec.loader.exec_module(emulate)
h = emulate.EmulatedHosts(hosts=3, rate="1gbit")
h.start()
print(h.prefix, flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_removes_namespaces(sig):
    with subprocess.Popen([sys.executable, "-c", _SIGNALLED, _emulate.__file__],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            prefix = proc.stdout.readline().strip()
            assert prefix.startswith("pyr"), proc.stderr.read()
            assert len(namespaces(prefix)) == 4  # 3 hosts and the bridge
            proc.send_signal(sig)
            rc = proc.wait(timeout=20)
        finally:
            proc.kill()
            proc.communicate()
    assert rc != 0  # the previous handler ran: default exit or KeyboardInterrupt
    assert namespaces(prefix) == []
