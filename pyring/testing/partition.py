"""A silent network partition in the middle of a 64 MiB allreduce, on emulated hosts: every
packet between the hosts is dropped (tc tbf with a burst smaller than any packet, on every
host's interface), so no reset ever arrives.

    results, addresses = run_partition(hosts=2, ranks_per_host=2, timeout_s=5)
    problems = check_partition(results, addresses, ranks_per_host=2, timeout_s=5, slack_s=2)

As a rank (``python .../pyring/testing/partition.py``, under EmulatedHosts.run): init, one
allreduce of 64 MiB together, then each rank creates its trigger file (the trigger path and
its rank) and keeps calling the allreduce until one raises; the parent cuts the link on its
next progress tick (50 ms) after every rank's file exists, so that no rank is still in the
first call (one rank's call can end while bytes to another are in flight).
Each rank reports its error, the seconds its failing call took, and how many calls succeeded
after the trigger; then it exits.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

TRIGGER_ENV = "PYRING_PARTITION_TRIGGER"
COUNT = 16 << 20  # float32 values: 64 MiB


def _rank() -> None:
    import torch

    import pyring
    from pyring.tools.emulate import report

    comm = pyring.init(set_default=False)
    rank = comm.rank
    x = torch.ones(COUNT)
    comm.all_reduce(x)
    with open(f"{os.environ[TRIGGER_ENV]}.{rank}", "w"):
        pass
    error, calls = None, 0
    for _ in range(200):
        start = time.monotonic()
        try:
            comm.all_reduce(x)
            calls += 1
        except pyring.CommError as e:
            error = (type(e).__name__, str(e), time.monotonic() - start)
            break
    report({"rank": rank, "error": error, "calls_after_trigger": calls})
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the store's host may be unreachable: no teardown that talks to it


def run_partition(hosts: int, ranks_per_host: int, timeout_s: float, rate: str = "1gbit",
                  env: dict | None = None) -> tuple[list[dict], list[str]]:
    """One trial: every rank's report and every host's address. Raises
    pyring.launch.RankFailure when a rank fails to report (hangs or dies)."""
    from pyring.tools.emulate import IFNAME, EmulatedHosts

    fd, trigger = tempfile.mkstemp(prefix="pyring-partition-")
    os.close(fd)
    os.unlink(trigger)
    cut = []
    ready = [f"{trigger}.{r}" for r in range(hosts * ranks_per_host)]

    def tick(h: EmulatedHosts) -> None:
        if not cut and all(os.path.exists(p) for p in ready):
            for ns in h.namespaces:
                subprocess.run(["tc", "-n", ns, "qdisc", "replace", "dev", IFNAME, "root", "tbf",
                                "rate", "8bit", "burst", "1", "latency", "1ms"], check=True)
            cut.append(time.monotonic())

    try:
        with EmulatedHosts(hosts=hosts, rate=rate) as h:
            # By path, not -m: a source tree in the working directory would shadow the package.
            results = h.run(ranks_per_host, [sys.executable, os.path.abspath(__file__)],
                            env={TRIGGER_ENV: trigger, "PYRING_TIMEOUT": str(timeout_s),
                                 **(env or {})},
                            timeout=timeout_s * 4 + 60, progress=lambda: tick(h))
            return results, list(h.addresses)
    finally:
        for p in ready:
            if os.path.exists(p):
                os.unlink(p)


def check_partition(results: list[dict], addresses: list[str], ranks_per_host: int,
                    timeout_s: float, slack_s: float) -> list[str]:
    """Every rank must raise within timeout_s + slack_s of entering the call, naming at least
    one rank of another host and that host's address."""
    bad = []
    for r in results:
        rank = r["rank"]
        if r["error"] is None:
            bad.append(f"rank {rank}: no error after {r['calls_after_trigger']} calls")
            continue
        kind, message, took = r["error"]
        if took > timeout_s + slack_s:
            bad.append(f"rank {rank}: raised after {took:.2f} s")
        host = rank // ranks_per_host
        others = [o for o in range(len(results)) if o // ranks_per_host != host]
        if not any(f"rank {o}" in message for o in others):
            bad.append(f"rank {rank}: names no rank of another host: {message}")
        if not any(f" at {a}" in message for i, a in enumerate(addresses) if i != host):
            bad.append(f"rank {rank}: names no other host's address: {message}")
    return bad


if __name__ == "__main__":
    _rank()
