"""The soak's chaos mode: 4 ranks under torchrun (elastic, restarts allowed) run the verified
random mix (_soak_mix.py) plus symmetric-memory allocations, while the driver injects faults
at random times:

- ``kill``: SIGKILL a rank; torchrun restarts the whole group, which must come back and run;
- ``stop``: SIGSTOP a rank past pyring's deadline, then SIGCONT it; every rank must raise a
  typed error (``pyring.Error``), the stopped one once it runs again;
- ``store``: kill the store the ranks met through and start a fresh one on the same port;
  the ranks must survive (pyring uses the store only to meet) or raise a typed error;
- ``close``: a rank closes its communicator while a future's callback of its own runs; that
  rank's next call and every peer's must raise a typed error.

After a typed error, every rank closes its communicator, meets the others at a generation
barrier on the store, and builds a new communicator in the same process; a rank that cannot
(the barrier's deadline passed) exits, and torchrun restarts the group. Each rank writes one
JSON line per event (``log.<rank>``) with its fds, resident memory and pyring's segments in
``/dev/shm`` at each generation's start (and what a cyclic collection then frees: a cycle
holding a failed communicator showed there). The driver matches every injected fault with the
ranks' events (``judge``). Targets (issue 56), for a 10-minute run of 4 ranks: at least
CHAOS_FAULTS_TARGET faults; every fault typed, restarted or survived; 0 wrong results; fds
across a process's generations unchanged and its memory within RSS_GROWTH_KIB; nothing left
in ``/dev/shm``; the driver's fds unchanged.
"""

from __future__ import annotations

import gc
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
FAULTS = ("kill", "stop", "store", "close")
CHECK_EVERY = 20  # calls between the ranks' agreement on stopping (and the close fault's turn)
RESYNC_S = 40.0  # the generation barrier's deadline: past any SIGSTOP and any restart
CHAOS_FAULTS_TARGET = 50  # in a 10-minute run (issue 56)
RSS_GROWTH_KIB = 16 * 1024  # the most a rank's memory may grow across its generations
SYMMETRIC_EVERY = 7  # calls between symmetric allocations, freed after one collective


def _shm_count() -> int:
    try:
        return sum(n.startswith("pyring-") for n in os.listdir("/dev/shm"))
    except OSError:
        return -1


def _store_server(port_file: str) -> None:
    """A store's host process: serves until killed; writes its port once listening."""
    import torch.distributed as dist

    port = int(os.environ.get("CHAOS_PORT", "0"))
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                          use_libuv=True)
    with open(port_file + ".tmp", "w") as f:
        f.write(str(store.port))
    os.replace(port_file + ".tmp", port_file)
    while True:
        time.sleep(3600)


# ---------------------------------------------------------------------------- the ranks


class _Rank:
    def __init__(self, folder: str, port: int, timeout: float, seed: int, until: float):
        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        self.restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.folder, self.port, self.timeout, self.seed, self.until = \
            folder, port, timeout, seed, until
        self.log = open(os.path.join(folder, f"log.{self.rank}"), "a")
        self.store: Any = None
        self.symmetric_frees = 0
        pid_file = os.path.join(folder, f"pid.{self.rank}")
        with open(pid_file + ".tmp", "w") as f:
            f.write(f"{os.getpid()} {self.restart}")
        os.replace(pid_file + ".tmp", pid_file)

    def note(self, event: str, **kw: Any) -> None:
        self.log.write(json.dumps({"t": time.time(), "rank": self.rank, "restart": self.restart,
                                   "event": event, **kw}) + "\n")
        self.log.flush()

    def connect(self) -> Any:
        """A client of the current store, retried while the driver replaces a dropped one."""
        import datetime

        import torch.distributed as dist

        end = time.monotonic() + RESYNC_S
        while True:
            try:
                return dist.TCPStore("127.0.0.1", self.port, is_master=False,
                                     timeout=datetime.timedelta(seconds=RESYNC_S))
            except Exception:
                if time.monotonic() > end:
                    raise
                time.sleep(0.2)

    def resync(self, gen: int) -> bool:
        """The generation barrier (the store may have been replaced since the last one): True
        when the ranks go on to a new communicator, False when the run's time is up. A rank
        that cannot meet the others exits (status 3), and torchrun restarts the group."""
        key = f"r{self.restart}/g{gen}"
        for attempt in range(3):
            try:
                if self.store is None:
                    self.store = self.connect()
                if self.store.add(key + "/out", 1) == self.world:  # the last one decides
                    self.store.set(key + "/go", b"1" if time.time() < self.until else b"0")
                self.store.wait([key + "/go"])
                return self.store.get(key + "/go") == b"1"
            except Exception as e:
                self.store = None
                if attempt == 2:
                    self.note("desync", gen=gen, type=type(e).__name__, msg=str(e)[:300])
                    os._exit(3)
        return False

    def run(self) -> None:
        import torch
        from _soak_mix import Mix

        import pyring

        torch.set_num_threads(1)
        gen = 0
        go = time.time() < self.until
        while go:
            # fds and memory as left by the last communicator; then what a cyclic collection
            # finds and frees (a cycle that holds a communicator delays its release)
            fds, rss = _fds(), _rss_kib()
            found = gc.collect()
            self.note("gen", gen=gen, fds=fds, rss=rss, shm=_shm_count(), gc_found=found,
                      fds_after_gc=_fds(), rss_after_gc=_rss_kib())
            comm = None
            try:
                if self.store is None:
                    self.store = self.connect()
                import torch.distributed as dist

                comm = pyring.init(self.rank, self.world,
                                   dist.PrefixStore(f"r{self.restart}/g{gen}", self.store),
                                   set_default=False, timeout=self.timeout,
                                   topology="0,1|2,3")
                if self.loop(comm, Mix(comm, self.seed + 7919 * self.restart + gen), gen):
                    self.note("done", gen=gen)
                    return
            except pyring.Error as e:
                self.note("error", gen=gen, type=type(e).__name__, msg=str(e)[:300])
            except Exception as e:  # a store that went away while meeting
                self.note("error", gen=gen, type=type(e).__name__, msg=str(e)[:300],
                          untyped=True)
                self.store = None
            finally:
                if comm is not None:
                    comm.close()
                del comm
            go = self.resync(gen)
            gen += 1

    def loop(self, comm: Any, mix: Any, gen: int) -> bool:
        """Runs the mix until the ranks agree to stop (True) or a call raises."""
        import torch

        close_file = os.path.join(self.folder, f"close.{self.rank}")
        calls = 0
        while True:
            wrong = mix.step()
            calls += 1
            if wrong:
                self.note("wrong", call=mix.call, elements=wrong)
            if calls % SYMMETRIC_EVERY == 0:
                self.symmetric(comm, calls)
            if calls % CHECK_EVERY:
                continue
            self.note("progress", gen=gen, calls=calls, symmetric=self.symmetric_frees)
            flag = torch.tensor([float(time.time() >= self.until)])
            if os.path.exists(close_file):
                self.close_in_callback(comm, flag, close_file)
            comm.broadcast(flag, src=0)
            if flag.item():
                return True

    def symmetric(self, comm: Any, calls: int) -> None:
        """One allocation in symmetric memory, one verified all_reduce on it, then freed."""
        n = 1 + (calls * 977) % 70000
        t = comm.empty(n)
        t.fill_(self.rank + 1)
        comm.all_reduce(t)
        want = self.world * (self.world + 1) / 2
        bad = int((t != want).sum())
        if bad:
            self.note("wrong", call=-calls, elements=bad, symmetric=True)
        del t
        self.symmetric_frees += 1

    def close_in_callback(self, comm: Any, flag: Any, close_file: str) -> None:
        """The close fault: the agreement's broadcast gets a callback that runs for a while,
        and the communicator is closed while it runs; the next call here must raise."""
        import threading

        fault = open(close_file).read().strip()
        os.unlink(close_file)
        running = threading.Event()

        def callback(fut: Any) -> None:
            running.set()
            time.sleep(0.05)

        work = comm.broadcast(flag, src=0, async_op=True)
        work.get_future().then(callback)
        running.wait(self.timeout)
        comm.close()
        self.note("closed", fault=fault, during_callback=running.is_set())
        comm.barrier()  # must raise pyring.Error
        self.note("wrong", call=-1, elements=0, closed_call_returned=True)
        raise RuntimeError("a call on a closed communicator returned")


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _rss_kib() -> int:
    """Resident memory after glibc has returned its free heap pages."""
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def worker_main(argv: list[str]) -> None:
    folder, port, timeout, seed, until = argv
    sys.path.insert(0, HERE)
    _Rank(folder, int(port), float(timeout), int(seed), float(until)).run()


# ---------------------------------------------------------------------------- the driver


class _Store:
    """The ranks' store, in a process of its own so that it can be dropped and replaced."""

    def __init__(self, folder: str, port: int = 0):
        self.file = os.path.join(folder, "store.port")
        if os.path.exists(self.file):
            os.unlink(self.file)
        env = dict(os.environ, CHAOS_PORT=str(port))
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "store", self.file], env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        end = time.monotonic() + 60
        while not os.path.exists(self.file):
            if self.proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"chaos: the store did not start on port {port}")
            time.sleep(0.05)
        self.port = int(open(self.file).read())

    def drop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _pids(folder: str, world: int) -> dict[int, tuple[int, int]]:
    out = {}
    for r in range(world):
        try:
            pid, restart = open(os.path.join(folder, f"pid.{r}")).read().split()
            out[r] = (int(pid), int(restart))
        except (OSError, ValueError):
            pass
    return out


def _events(folder: str, world: int) -> list[dict]:
    rows = []
    for r in range(world):
        try:
            with open(os.path.join(folder, f"log.{r}")) as f:
                rows += [json.loads(line) for line in f if line.strip()]
        except OSError:
            pass
    return sorted(rows, key=lambda e: e["t"])


def _steady(folder: str, world: int, since: float) -> bool:
    """Every rank of the newest restart is running the mix, in a generation begun after
    `since` or continuing past it: its last event is a progress event later than its last
    generation start, and later than `since`."""
    pids = _pids(folder, world)
    if len(pids) < world or len({r for _, r in pids.values()}) != 1:
        return False
    restart = next(iter(pids.values()))[1]
    last: dict[int, dict] = {}
    for e in _events(folder, world):
        if e["restart"] == restart:
            last[e["rank"]] = e
    return len(last) == world and all(e["event"] == "progress" and e["t"] > since
                                      for e in last.values())


def _inject(kind: str, rank: int, pid: int, fault: int, store: _Store, folder: str,
            timeout: float) -> _Store:
    if kind == "kill":
        os.kill(pid, signal.SIGKILL)
    elif kind == "stop":
        os.kill(pid, signal.SIGSTOP)
        time.sleep(timeout + 1.5)
        os.kill(pid, signal.SIGCONT)
    elif kind == "store":
        port = store.port
        store.drop()
        time.sleep(0.5)
        store = _Store(folder, port)
    elif kind == "close":
        with open(os.path.join(folder, f"close.{rank}.tmp"), "w") as f:
            f.write(str(fault))
        os.replace(os.path.join(folder, f"close.{rank}.tmp"),
                   os.path.join(folder, f"close.{rank}"))
    return store


def chaos(world: int, seconds: float, seed: int, timeout: float) -> dict:
    """The chaos soak; returns its record with ``ok``."""
    rng = random.Random(seed)
    shm_before = {n for n in os.listdir("/dev/shm") if n.startswith("pyring-")}
    fds_before = _fds()
    folder = tempfile.mkdtemp(prefix="pyring-chaos-")
    store = _Store(folder)
    start = time.time()
    until = start + seconds
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={world}", "--max-restarts=1000", "--monitor-interval=0.1",
           __file__, "worker", folder, str(store.port), str(timeout), str(seed), str(until)]
    job = subprocess.Popen(cmd, stdout=open(os.path.join(folder, "torchrun.out"), "w"),
                           stderr=subprocess.STDOUT, start_new_session=True)
    faults: list[dict] = []
    stuck = []
    order: list[str] = []
    try:
        last = start
        while time.time() < until - 20 and job.poll() is None:
            wait_end = time.monotonic() + 90
            while not _steady(folder, world, last) and time.monotonic() < wait_end:
                time.sleep(0.5)
            if not _steady(folder, world, last):
                stuck.append(round(time.time() - start, 1))
                last = time.time()
                continue
            time.sleep(rng.uniform(0.5, 3.0))
            if not order:
                order = list(FAULTS)
                rng.shuffle(order)
            kind = order.pop()
            pids = _pids(folder, world)
            rank = rng.randrange(world)
            pid, restart = pids[rank]
            at = time.time()
            store = _inject(kind, rank, pid, len(faults), store, folder, timeout)
            faults.append({"id": len(faults), "kind": kind, "rank": rank, "restart": restart,
                           "t": at})
            print(f"chaos {at - start:6.1f} s: fault {len(faults) - 1} {kind} rank {rank}",
                  flush=True)
            last = time.time()
        rc = job.wait(timeout=max(60.0, until - time.time() + 120))
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        store.drop()
    time.sleep(0.5)
    events = _events(folder, world)
    record = judge(faults, events, world, timeout, start)
    shm_left = sorted({n for n in os.listdir("/dev/shm") if n.startswith("pyring-")}
                      - shm_before)
    record.update({"world": world, "seconds": seconds, "timeout_s": timeout,
                   "torchrun_exit": rc, "not_steady_at_s": stuck, "shm_left": shm_left,
                   "driver_fds": [fds_before, _fds()], "folder": folder})
    record["ok"] = (record["ok"] and rc == 0 and not stuck and not shm_left
                    and _fds() == fds_before and len(faults) >= 1)
    return record


def judge(faults: list[dict], events: list[dict], world: int, timeout: float,
          start: float) -> dict:
    """Matches each fault with the ranks' events between it and the next fault."""
    bound = {"stop": 2 * timeout + 4.0, "close": timeout + 2.0, "kill": 60.0,
             "store": timeout + 2.0}
    rows = []
    for i, f in enumerate(faults):
        end = faults[i + 1]["t"] if i + 1 < len(faults) else float("inf")
        window = [e for e in events if f["t"] <= e["t"] < end]
        errors = {e["rank"]: e for e in window if e["event"] == "error"
                  and e["restart"] == f["restart"]}
        restarted = any(e["restart"] > f["restart"] for e in window)
        ran_again = {e["rank"] for e in window if e["event"] == "progress"
                     and (e["restart"] > f["restart"] or e["rank"] in errors
                          and e["t"] > errors[e["rank"]]["t"])}
        untyped = [e for e in errors.values() if e.get("untyped")]
        late = {r: round(e["t"] - f["t"], 2) for r, e in errors.items()
                if e["t"] - f["t"] > bound[f["kind"]]}
        if f["kind"] == "kill":
            outcome = "restart" if restarted else "none"
            ok = restarted and len({e["rank"] for e in window if e["event"] == "progress"
                                    and e["restart"] > f["restart"]}) == world
        elif f["kind"] == "store":
            outcome = "typed" if errors else "survived"
            progressed = {e["rank"] for e in window if e["event"] == "progress"}
            ok = not untyped and len(progressed) == world
        else:
            if f["kind"] == "close":  # the closing rank closed while its callback ran
                untyped += [e for e in window if e["event"] == "closed"
                            and not e["during_callback"]]
            outcome = "typed" if len(errors) == world else "restart" if restarted else \
                f"{len(errors)} of {world} raised"
            ok = (len(errors) == world and not untyped and not late
                  and len(ran_again) == world) or (restarted and not untyped)
        rows.append({**f, "t": round(f["t"] - start, 2), "outcome": outcome, "ok": ok,
                     "raised": sorted({e["type"] for e in errors.values()}),
                     "slowest_raise_s": round(max((e["t"] - f["t"] for e in errors.values()),
                                                  default=-1), 2), "late": late})
    wrong = [e for e in events if e["event"] == "wrong"]
    desync = [e for e in events if e["event"] == "desync"]
    reached: dict[tuple, int] = {}  # calls verified per communicator (rank 0's)
    for e in events:
        if e["event"] == "progress" and e["rank"] == 0:
            key = (e["restart"], e["gen"])
            reached[key] = max(reached.get(key, 0), e["calls"])
    calls = sum(reached.values())
    gens = [e for e in events if e["event"] == "gen"]
    drift = {}
    for r in range(world):  # fds and memory across in-process generations, per process
        mine = [e for e in gens if e["rank"] == r]
        for restart in sorted({e["restart"] for e in mine}):
            seq = [e for e in mine if e["restart"] == restart][1:]  # after one communicator
            if len(seq) >= 2:
                drift.setdefault(r, []).append({"restart": restart, "generations": len(seq),
                                                "fds": [seq[0]["fds"], seq[-1]["fds"]],
                                                "rss_kib": [seq[0]["rss"], seq[-1]["rss"]]})
    fd_growth = max((d["fds"][1] - d["fds"][0] for ds in drift.values() for d in ds),
                    default=0)
    rss_growth = max((d["rss_kib"][1] - d["rss_kib"][0] for ds in drift.values() for d in ds),
                     default=0)
    by_kind = {k: sum(f["kind"] == k for f in faults) for k in FAULTS}
    symmetric = max((e.get("symmetric", 0) for e in events if e["event"] == "progress"),
                    default=0)
    return {"faults": len(faults), "faults_by_kind": by_kind,
            "faults_ok": sum(r["ok"] for r in rows), "wrong_results": len(wrong),
            "desyncs": len(desync), "untyped_errors": [e for e in events
                                                     if e["event"] == "error"
                                                     and e.get("untyped")][:10],
            "calls_checked": calls, "symmetric_allocations_max_per_process": symmetric,
            "fd_growth_across_generations": fd_growth,
            "rss_growth_across_generations_kib": rss_growth, "drift": drift,
            "ok": (all(r["ok"] for r in rows) and not wrong and not desync
                   and fd_growth <= 0 and rss_growth <= RSS_GROWTH_KIB),
            "rows": rows}


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker_main(sys.argv[2:])
    elif sys.argv[1] == "store":
        _store_server(sys.argv[2])
