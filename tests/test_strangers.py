"""The tcp rendezvous against strangers on its ports: silent, garbage, forged and wrong-secret
clients delay no rank and are never accepted (csrc/transport/tcp/tcp_handshake.h)."""

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
from multiproc import run_ranks

import pyring
from pyring import _C

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


def _job(rank, world, store, strangers):
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


def _delay(results) -> float:
    """Seconds from the late rank's init to the last rank's first result."""
    return max(r[1] for r in results) - results[-1][0]


def test_strangers_delay_nothing_and_are_never_accepted():
    env = {"PYRING_TRANSPORT": "tcp", "OMP_NUM_THREADS": "1"}
    world = 4
    quiet = run_ranks(world, _job, False, env=env, timeout=120)
    noisy = run_ranks(world, _job, True, env=env, timeout=120)
    total = world * (world + 1) / 2
    for res in (quiet, noisy):
        assert all(r[2] == total for r in res), [r[2] for r in res]
    assert _delay(noisy) - _delay(quiet) < 1.0, (_delay(quiet), _delay(noisy))
    # Ranks 1 and 2 accept lower ranks on both ports, so every kind of stranger reached them.
    for rank in (1, 2):
        d = noisy[rank][3]
        assert d["silent"] >= 1 and d["garbage"] >= 1 and d["bad_mac"] >= 1, (rank, d)
    answered = noisy[-1][4]
    assert answered and all(a == b"" for a in answered), answered
    assert not any(quiet[r][3].get("bad_mac") for r in range(world))


def test_hmac_matches_python():
    for n in (0, 1, 55, 56, 64, 65, 1000):
        for key_len in (0, 32, 64, 65, 200):
            key, data = os.urandom(key_len), os.urandom(n)
            assert _C.hmac_sha256(key, data) == hmac.new(key, data, hashlib.sha256).digest()
