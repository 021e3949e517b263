"""The tcp rendezvous against strangers on its ports: silent, garbage, forged and wrong-secret
clients delay no rank and are never accepted (csrc/transport/tcp/tcp_handshake.h; the scenario
is pyring.testing.strangers)."""

from __future__ import annotations

import hashlib
import hmac
import os

from pyring import _C
from pyring.launch import run_ranks
from pyring.testing.strangers import delay as _delay
from pyring.testing.strangers import job as _job


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
