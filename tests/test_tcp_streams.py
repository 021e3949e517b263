"""Several TCP connections per link (PYRING_SOCKET_NSTREAMS, csrc/transport/tcp/
tcp_striped_link.h): every collective and point-to-point message arrives whole and in order
whatever order the streams land its stripes in, each stream carries its share, and a job
whose ranks disagree on the count fails naming both."""

from __future__ import annotations

import os
import socket
import struct
import time

import pytest
import torch

import pyring
from pyring import config
from pyring.launch import run_ranks

MIN_STRIPE = 64 * 1024  # kMinStripeBytes
TCPI_BYTES_RECEIVED = 128  # offset of tcpi_bytes_received in struct tcp_info


def _pattern(n: int, rank: int, salt: int, dtype: torch.dtype) -> torch.Tensor:
    return ((torch.arange(n, dtype=torch.float64) * 7 + salt) % 251 * (rank + 1)).to(dtype)


def _every_collective(rank, world, store, algo):
    comm = pyring.init(rank, world, store, algo=algo, set_default=False)
    bad = []
    # Under a stripe, one stripe and a tail, uneven stripes, and several stripes per piece.
    sizes = [5, MIN_STRIPE // 4 + 3, 3 * MIN_STRIPE // 4 + 1, 2**20 + 7, 3 * 2**20 // 4]
    for salt, n in enumerate(sizes):
        for dtype in (torch.float32, torch.float64, torch.int32):
            x = _pattern(n, rank, salt, dtype)
            comm.all_reduce(x)
            want = sum(_pattern(n, r, salt, dtype) for r in range(world))
            if not torch.equal(x, want):
                bad.append(("all_reduce", n, str(dtype)))
        g = torch.empty(world * n, dtype=torch.float32)
        comm.all_gather_into_tensor(g, _pattern(n, rank, salt, torch.float32))
        if not torch.equal(g, torch.cat([_pattern(n, r, salt, torch.float32)
                                         for r in range(world)])):
            bad.append(("all_gather", n))
        b = _pattern(n, rank, salt, torch.float32)
        comm.broadcast(b, src=world - 1)
        if not torch.equal(b, _pattern(n, world - 1, salt, torch.float32)):
            bad.append(("broadcast", n))
        peer_to, peer_from = (rank + 1) % world, (rank - 1) % world
        got = torch.empty(n, dtype=torch.float32)
        send = comm.isend(_pattern(n, rank, salt, torch.float32), peer_to)
        comm.recv(got, peer_from)
        send.wait()
        if not torch.equal(got, _pattern(n, peer_from, salt, torch.float32)):
            bad.append(("send/recv", n))
    links = comm.stats()["links"]
    comm.close()
    return bad, {p: (v["transport"], v.get("connections")) for p, v in links.items()}


@pytest.mark.parametrize("world,algo,streams", [(2, "direct", 3), (3, "ring", 3), (3, "ring", 1),
                                               (4, "tree", 3)])
def test_striped_links_deliver_every_collective(monkeypatch, world, algo, streams):
    monkeypatch.setenv("PYRING_TRANSPORT", "tcp")
    monkeypatch.setenv("PYRING_SOCKET_NSTREAMS", str(streams))
    # Staging pieces shorter than a stripe: a staged stripe is delivered in several pieces.
    monkeypatch.setenv("PYRING_SEGMENT_BYTES", "24k")
    if algo == "tree":
        monkeypatch.setenv("PYRING_TOPOLOGY", "0,1|2,3")
    for rank, (bad, links) in enumerate(run_ranks(world, _every_collective, algo)):
        assert bad == [], f"rank {rank} ({algo}): wrong results {bad}"
        assert links and all(v == ("tcp", streams) for v in links.values()), (rank, links)


def _socket_receipts(rank, world, store, nbytes):
    comm = pyring.init(rank, world, store, algo="direct", set_default=False)
    x = torch.full((nbytes // 4,), float(rank + 1))
    comm.all_reduce(x)
    ok = bool((x == 3.0).all())
    # Bytes each of this process's TCP sockets received, from the kernel's own count.
    received = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if s.type == socket.SOCK_STREAM and s.family == socket.AF_INET:
                info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
                received.append(struct.unpack_from("Q", info, TCPI_BYTES_RECEIVED)[0])
        except OSError:
            pass
        finally:
            s.close()
    comm.close()
    return ok, received


def test_each_stream_carries_its_share(monkeypatch):
    monkeypatch.setenv("PYRING_TRANSPORT", "tcp")
    monkeypatch.setenv("PYRING_SOCKET_NSTREAMS", "4")
    nbytes = 8 * 2**20
    for rank, (ok, received) in enumerate(run_ranks(2, _socket_receipts, nbytes)):
        assert ok, f"rank {rank}: wrong sum"
        # The direct allreduce moves the whole buffer each way, a quarter on each stream.
        busy = sorted(r for r in received if r >= nbytes // 8)
        assert len(busy) == 4, (rank, sorted(received))
        assert busy[0] > busy[-1] * 0.8, (rank, busy)
        assert sum(busy) >= nbytes, (rank, busy)


def _init_with_streams(rank, world, store):
    os.environ["PYRING_SOCKET_NSTREAMS"] = str(2 + rank)
    t0 = time.monotonic()
    try:
        pyring.init(rank, world, store, set_default=False)
    except pyring.Error as e:
        return type(e).__name__, str(e), time.monotonic() - t0
    return None


def test_ranks_that_disagree_on_the_stream_count_fail_naming_both(monkeypatch):
    monkeypatch.setenv("PYRING_TRANSPORT", "tcp")
    monkeypatch.setenv("PYRING_TIMEOUT", "10")
    results = run_ranks(2, _init_with_streams, timeout=60)
    # Rank 0 reads rank 1's count in its challenge, rank 1 rank 0's in its hello: both fail
    # at once, not at the deadline.
    for rank, want in [(0, "rank 1 opens 3 tcp stream(s) per link and rank 0 (this process) 2"),
                       (1, "rank 0 opens 2 tcp stream(s) per link and rank 1 (this process) 3")]:
        assert results[rank] is not None, results
        kind, message, seconds = results[rank]
        assert kind == "CommError" and want in message, results
        assert "set PYRING_SOCKET_NSTREAMS to the same value on every rank" in message, results
        assert seconds < 5, results


@pytest.mark.parametrize("value", ["0", "17", "two", "-1"])
def test_a_bad_stream_count_is_a_value_error(monkeypatch, value):
    monkeypatch.setenv("PYRING_SOCKET_NSTREAMS", value)
    with pytest.raises(ValueError, match=r"PYRING_SOCKET_NSTREAMS=.* not valid \(valid: 1 to 16"):
        config.resolve()
