"""The tcp rendezvous against strangers on its ports (tests/test_strangers.py, bench/soak.py):
`job` starts 4 ranks, one of them late, while silent, garbage, forged and wrong-secret clients
knock on every listening port of the ranks that wait (csrc/transport/tcp/tcp_handshake.h)."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import struct
import threading
import time

import torch

import pyring

CHALLENGE = struct.Struct("<IHH32s")  # magic, version, nstreams, nonce
HELLO = struct.Struct("<IiiHH32s32s")  # magic, from, to, stream, nstreams, nonce, mac
HELLO_MAGIC = 0x50524748
LATE_S = 1.5


def _hello(key: bytes, challenge_nonce: bytes, frm: int, to: int) -> bytes:
    nonce = os.urandom(32)
    fields = struct.pack("<iiHH", frm, to, 0, 1)  # stream 0 of 1
    mac = hmac.new(key, b"pyring-hello\0" + challenge_nonce + fields + nonce,
                   hashlib.sha256).digest()
    return HELLO.pack(HELLO_MAGIC, frm, to, 0, 1, nonce, mac)


def _stranger(kind: str, port: int, to: int, answered: list) -> None:
    """One client of the given kind on 127.0.0.1:port; appends what the listener sent back
    after the handshake (b'' when it hung up) for the wrong-secret client."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        if kind == "garbage":
            s.sendall(os.urandom(200))
        elif kind == "forged":  # the right shape, a MAC made without the secret or the nonce
            s.sendall(_hello(os.urandom(32), bytes(32), 0, to))
        elif kind == "wrong_secret":
            data = b""
            while len(data) < CHALLENGE.size:
                chunk = s.recv(CHALLENGE.size - len(data))
                if not chunk:
                    answered.append(b"")
                    return
                data += chunk
            _, _, _, nonce = CHALLENGE.unpack(data)
            s.sendall(_hello(os.urandom(32), nonce, 0, to))
            try:
                answered.append(s.recv(64))
            except OSError:
                answered.append(b"")
        time.sleep(8 if kind == "silent" else 0.5)
    except OSError:  # the listener hung up on it, as it should
        if kind == "wrong_secret" and not answered:
            answered.append(b"")
    finally:
        s.close()


def _ports(store, rank: int) -> list[int]:
    info = json.loads(store.get(f"pyring/1/peer/{rank}"))
    # Each channel's endpoint publishes its tcp address as "host:port".
    return [int(info["endpoints"][channel]["tcp"].rsplit(":", 1)[1]) for channel in ("", "p2p")]


def job(rank, world, store, strangers):
    threads: list[threading.Thread] = []
    answered: list = []
    if rank == world - 1:
        if strangers:  # every listening port of the ranks already waiting for this one
            store.wait([f"pyring/1/peer/{r}" for r in range(world - 1)])
            for r in range(world - 1):
                for port in _ports(store, r):
                    for kind in ("silent", "garbage", "forged", "wrong_secret"):
                        t = threading.Thread(target=_stranger, args=(kind, port, r, answered),
                                             daemon=True)
                        t.start()
                        threads.append(t)
        time.sleep(LATE_S)
    start = time.time()
    comm = pyring.init(rank, world, store, set_default=False, timeout=60)
    t = torch.full((8,), float(rank + 1))
    comm.all_reduce(t)
    end = time.time()
    for th in threads:
        th.join(timeout=15)
    dropped = comm.rendezvous_dropped
    comm.close()
    return start, end, float(t[0]), dropped, answered


def delay(results) -> float:
    """Seconds from the late rank's init to the last rank's first result."""
    return max(r[1] for r in results) - results[-1][0]
