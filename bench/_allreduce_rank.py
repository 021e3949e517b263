"""One rank of bench/allreduce.py: every library's in-place float32 sum allreduce on the same
buffer, the libraries taking turns block by block (the method is in allreduce.py's docstring).

`run(rank, world, store, cfg, mpi)` measures every size of cfg and returns, on rank 0, one raw
entry per size (the blocks in order with the slowest rank's median time per block); other
ranks return None. The ranks gather their times through `store`, so any launcher works:
pyring.launch (local ranks), mpirun (when Open MPI is timed: `mpi` is then MPI.COMM_WORLD) or
pyring.tools.emulate (emulated hosts).
"""

from __future__ import annotations

import json
import os
import resource
import socket
import statistics
import threading
import time
from typing import Any, Callable

PYRING_VARIANTS = {"cached": ("PYRING_SHM_COPY", "cached"),
                   "streaming": ("PYRING_SHM_COPY", "streaming"),
                   "ring": ("PYRING_ALGO", "ring"), "direct": ("PYRING_ALGO", "direct"),
                   "tree": ("PYRING_ALGO", "tree"), "symmetric": None}
TCP_CHUNK = 1 << 20


def variant_env(name: str) -> tuple[str, str] | None:
    """The setting of pyring-<variant>: pyring-cached / -streaming (PYRING_SHM_COPY), pyring-tcpN
    (PYRING_SOCKET_NSTREAMS=N), pyring-ring / -direct / -tree (PYRING_ALGO); None for
    pyring-symmetric, whose buffers are pyring.empty tensors (the zero-copy path)."""
    variant = name.removeprefix("pyring-")
    if variant.startswith("tcp"):
        return "PYRING_SOCKET_NSTREAMS", variant.removeprefix("tcp")
    return PYRING_VARIANTS[variant]


def iters_for(nbytes: int, iters: int, warmup: int) -> tuple[int, int]:
    """(timed, warm-up) calls per block: as given up to 1 MiB, fewer above, at least 3."""
    scale = max(1, nbytes // (1 << 20))
    return max(3, iters // scale), max(1, warmup // scale)


class BareTcp:
    """The tcp ceiling of a 2-rank allreduce: the buffer's bytes each way over one TCP
    connection (a sender thread, the caller receiving), no reduction."""

    def __init__(self, rank: int, store: Any, nbytes: int) -> None:
        if rank == 0:
            listener = socket.create_server((os.environ.get("MASTER_ADDR", "127.0.0.1"), 0))
            store.set("allreduce/tcp", json.dumps(listener.getsockname()[:2]))
            self.sock, _ = listener.accept()
            listener.close()
        else:
            host, port = json.loads(store.get("allreduce/tcp"))
            self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.inbox = memoryview(bytearray(nbytes))

    def barrier(self) -> None:
        self.sock.sendall(b"b")
        self.sock.recv(1)

    def exchange(self, out: memoryview) -> None:
        n = len(out)

        def send() -> None:
            for o in range(0, n, TCP_CHUNK):
                self.sock.sendall(out[o:o + TCP_CHUNK])

        th = threading.Thread(target=send)
        th.start()
        got = 0
        while got < n:
            got += self.sock.recv_into(self.inbox[got:n], n - got)
        th.join()

    def close(self) -> None:
        self.sock.close()


def _wire_bytes() -> int:
    with open("/sys/class/net/eth0/statistics/tx_bytes") as f:
        return int(f.read())


def _cpu_s() -> float:
    """User and system seconds of every thread of this process so far."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def _sent_to(comm: Any, peers: list[int]) -> int:
    links = comm.stats()["links"]
    return sum(links.get(p, {}).get("bytes_sent", 0) for p in peers)


def run(rank: int, world: int, store: Any, cfg: dict[str, Any], mpi: Any = None) -> Any:
    import torch
    import torch.distributed as dist

    import pyring

    torch.set_num_threads(1)
    names: list[str] = cfg["libs"]
    comm = pyring.init(rank, world, store)
    comms = {"pyring": comm}
    for name in names:
        if name.startswith("pyring-"):
            setting = variant_env(name)
            if setting is None:
                comms[name] = pyring.init(rank, world, store, set_default=False)
                continue
            var, value = setting
            before = os.environ.get(var)
            os.environ[var] = value
            comms[name] = pyring.init(rank, world, store, set_default=False)
            if before is None:
                del os.environ[var]
            else:
                os.environ[var] = before
    if "gloo" in names:
        dist.init_process_group("gloo", store=dist.PrefixStore("gloo", store), rank=rank,
                                world_size=world)
    tcp = BareTcp(rank, store, max(cfg["sizes"])) if "tcp" in names else None
    layout = cfg.get("layout")  # ranks per emulated host
    host = [h for h, k in enumerate(layout) for _ in range(k)] if layout else [0] * world
    away = [p for p in range(world) if host[p] != host[rank]]
    count_wire = bool(layout) and int(os.environ.get("LOCAL_RANK", "0")) == 0
    want = world * (world + 1) / 2
    clock = time.perf_counter
    per_size = []
    for k, nbytes in enumerate(cfg["sizes"]):
        t = torch.empty(nbytes // 4, dtype=torch.float32)
        a = t.numpy()
        copy_dst = torch.empty_like(t) if "memcpy" in names else None
        # Out of place, the result lands in o; gloo has none, so its time includes o.copy_(t).
        o = torch.empty_like(t) if cfg.get("out_of_place") else t
        b = o.numpy()
        # Each library's (input, output): pyring-symmetric's are symmetric tensors.
        bufs = {name: (t, o) for name in names}
        if "pyring-symmetric" in comms:
            st = comms["pyring-symmetric"].empty(nbytes // 4)
            bufs["pyring-symmetric"] = (st, comms["pyring-symmetric"].empty(nbytes // 4)
                                        if o is not t else st)
        libs: dict[str, tuple[Callable, Callable]] = {
            name: (c.barrier, (lambda t=bufs[name][0], c=c: c.all_reduce(t)) if o is t else
                   (lambda t=bufs[name][0], c=c, o=bufs[name][1]: c.all_reduce(t, out=o)))
            for name, c in comms.items()}
        if mpi is not None:
            from mpi4py import MPI

            libs["mpi"] = (mpi.Barrier, (lambda a=a: mpi.Allreduce(MPI.IN_PLACE, a)) if o is t
                           else (lambda a=a, b=b: mpi.Allreduce(a, b)))
        if "gloo" in names:
            libs["gloo"] = (dist.barrier, (lambda t=t: dist.all_reduce(t)) if o is t else
                            (lambda t=t, o=o: dist.all_reduce(o.copy_(t))))
        if "memcpy" in names:
            libs["memcpy"] = (comm.barrier, lambda t=t, d=copy_dst: d.copy_(t))
        if tcp is not None:
            view = memoryview(a).cast("B")
            libs["tcp"] = (tcp.barrier, lambda v=view: tcp.exchange(v))
        iters, warmup = iters_for(nbytes, cfg["iters"], cfg["warmup"])
        for name, (barrier, call) in libs.items():  # pyring's timed choices settle
            src = bufs.get(name, (t, o))[0]
            for _ in range(cfg.get("settle", 0)):
                src.fill_(rank + 1)
                barrier()
                call()
        if "pyring-symmetric" in comms:
            comms["pyring-symmetric"].reset_stats()
        blocks: list[tuple[str, list[float], int, int, float]] = []
        wrong = dict.fromkeys(names, 0)
        comm.reset_stats()
        for b in range(cfg["blocks"] * len(names)):
            r, i = divmod(b, len(names))
            name = names[(r + i) % len(names)]  # each round starts one library later
            barrier, call = libs[name]
            times, waits, starts = [], [], []
            sent = wire = 0
            cpu = 0.0
            t, o = bufs[name]
            for i in range(warmup + iters):
                t.fill_(rank + 1)
                if o is not t:
                    o.fill_(float("nan"))
                b0 = clock()
                barrier()
                timed = i >= warmup
                if timed and away and name in comms:
                    s0 = _sent_to(comms[name], away)
                w0 = _wire_bytes() if timed and count_wire else 0
                c0 = _cpu_s()
                t0 = clock()
                call()
                t1 = clock()
                if timed:
                    cpu += _cpu_s() - c0
                    times.append(t1 - t0)
                    waits.append(t0 - b0)
                    starts.append(t0)
                    if away and name in comms:
                        sent += _sent_to(comms[name], away) - s0
                    if count_wire:
                        wire += _wire_bytes() - w0
            if name not in ("memcpy", "tcp"):  # the entries that leave the buffer as it is
                wrong[name] += int((o != want).sum())
                if o is not t:  # the input stays as it was
                    wrong[name] += int((t != rank + 1).sum())
            blocks.append((name, times, sent // iters, wire // iters, cpu / sum(times), waits,
                           starts))
        links = comm.stats()["links"].values()
        streamed = (sum(v.get("bytes_streamed", 0) for v in links)
                    / max(1, sum(v["bytes_sent"] for v in links)))
        sym = comms.get("pyring-symmetric")
        zero_copy = sym.stats()["zero_copy"] if sym is not None else None
        store.set(f"allreduce/{k}/{rank}", json.dumps([blocks, wrong, streamed, zero_copy]))
        if rank == 0:
            per_size.append(_gather(store, k, world, nbytes, iters, names))
    for c in comms.values():
        c.close()
    if tcp is not None:
        tcp.close()
    if "gloo" in names:
        dist.destroy_process_group()
    return per_size if rank == 0 else None


def _gather(store: Any, k: int, world: int, nbytes: int, iters: int,
            names: list[str]) -> dict[str, Any]:
    """Size k's raw entry from every rank's blocks: per block the median over its calls of the
    slowest rank's time, the bytes that crossed to other hosts per call, per rank the cores
    its process kept busy during the calls (user + system seconds over wall seconds), and the
    medians over its calls of the slowest rank's barrier before the call and of the spread of
    the ranks' starts after it (the ranks' clocks are the host's monotonic clock)."""
    from pyring.tools.timing import slowest_per_iteration

    ranks = [json.loads(store.get(f"allreduce/{k}/{r}")) for r in range(world)]
    out = []
    for b, (name, *_) in enumerate(ranks[0][0]):
        slowest = slowest_per_iteration([g[0][b][1][:iters] for g in ranks])
        out.append({"lib": name, "median_us": statistics.median(slowest) * 1e6,
                    "min_us": min(slowest) * 1e6,
                    "sent_across_per_call": sum(g[0][b][2] for g in ranks),
                    "wire_per_call": sum(g[0][b][3] for g in ranks),
                    "cores_busy": [round(g[0][b][4], 3) for g in ranks],
                    "barrier_us": statistics.median(slowest_per_iteration(
                        [g[0][b][5][:iters] for g in ranks])) * 1e6,
                    "entry_skew_us": statistics.median(
                        max(s) - min(s) for s in zip(*(g[0][b][6][:iters] for g in ranks))) * 1e6})
    return {"bytes": nbytes, "iters": iters, "blocks": out,
            "pyring_streamed_fraction": [g[2] for g in ranks],
            # pyring-symmetric's stats()["zero_copy"] per rank, since the size's settling calls
            "symmetric_zero_copy": [g[3] for g in ranks],
            "wrong": {n: sum(g[1][n] for g in ranks) for n in names}}
