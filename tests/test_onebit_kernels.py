"""The one-bit wire format's kernels (csrc/kernels/onebit.*) against a numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

import pyring
from pyring import _C

HEADER = 16


def _ptr(a: np.ndarray | None) -> int:
    return 0 if a is None else a.ctypes.data


def _encode(x: np.ndarray, residual: np.ndarray | None, cache: np.ndarray | None = None):
    out = np.zeros(_C.onebit_max_bytes(x.size), np.uint8)
    n = _C.onebit_encode(x.ctypes.data, _ptr(residual), x.size, out.ctypes.data, _ptr(cache))
    return out[:n]


def _decode(enc: np.ndarray, n: int, alpha: float = 1.0, out: np.ndarray | None = None,
            cache: np.ndarray | None = None):
    acc = out is not None
    out = np.zeros(n, np.float32) if out is None else out
    _C.onebit_decode(enc.ctypes.data, n, alpha, acc, out.ctypes.data, _ptr(cache))
    return out


def _reference(v: np.ndarray) -> tuple[np.ndarray, float]:
    nz = v != 0
    scale = np.float32(np.sqrt((v[nz].astype(np.float64) ** 2).mean())) if nz.any() else 0.0
    return np.where(nz, np.where(np.signbit(v), -scale, scale), 0).astype(np.float32), scale


@pytest.mark.parametrize("n", [1, 7, 8, 9, 63, 4096, 4097, 100_003])
@pytest.mark.parametrize("feedback", [False, True])
def test_encode_decode_match_reference(n, feedback):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    res = rng.standard_normal(n).astype(np.float32) * 0.1 if feedback else None
    v = x + res if feedback else x.copy()
    want, scale = _reference(v)
    enc = _encode(x, res)
    assert enc.size == HEADER + (n + 7) // 8  # no exact zero: signs only
    got = _decode(enc, n)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    if feedback:
        # The new residual is exactly what the wire dropped.
        np.testing.assert_array_equal(res, v - got)
    # The decoded segment keeps the input's L2 norm.
    assert np.isclose(np.linalg.norm(got), np.linalg.norm(v), rtol=1e-4)


def test_exact_zeros_stay_zero_without_a_mask_from_the_user():
    x = np.array([0.0, 1.5, -2.0, 0.0, -0.0, 3.0, 0.0, 0.0, 0.5], np.float32)
    res = np.zeros_like(x)
    for step in range(5):  # error feedback never leaks into the zeros
        enc = _encode(x, res)
        assert enc.size == HEADER + 2 * 2  # signs and the zero mask
        got = _decode(enc, x.size)
        assert (got[x == 0] == 0).all() and (res[x == 0] == 0).all()
        if step == 0:
            assert (np.sign(got[x != 0]) == np.sign(x[x != 0])).all()
    all_zero = np.zeros(13, np.float32)
    assert (_decode(_encode(all_zero, None), 13) == 0).all()


def test_decode_accumulates_with_alpha():
    x = np.array([1.0, -1.0, 2.0, -2.0], np.float32)
    enc = _encode(x, None)
    out = np.full(4, 10.0, np.float32)
    _decode(enc, 4, alpha=0.5, out=out)
    scale = np.sqrt(2.5)
    np.testing.assert_allclose(out, 10 + 0.5 * scale * np.sign(x), rtol=1e-6)


def test_error_feedback_loses_nothing():
    """Over many rounds, what was sent plus what is still owed equals what was given: each
    round carries what the previous one dropped."""
    rng = np.random.default_rng(0)
    g = rng.standard_normal(1000).astype(np.float32)
    res = np.zeros_like(g)
    sent = np.zeros(g.size, np.float64)
    for _ in range(200):
        sent += _decode(_encode(g, res), g.size)
    np.testing.assert_allclose(sent + res, 200.0 * g, atol=1e-2)
    # The average sent per round approaches g.
    assert np.abs(sent / 200 - g).mean() < 0.05


def test_mask_cache_sends_an_unchanged_mask_once():
    rng = np.random.default_rng(1)
    n = 1001
    zero = rng.random(n) < 0.3
    enc_cache = np.zeros(_C.onebit_cache_bytes(n), np.uint8)
    dec_cache = np.zeros_like(enc_cache)
    sizes = []
    for step in range(5):
        x = np.where(zero, 0, rng.standard_normal(n)).astype(np.float32)
        if step == 2:  # another mask for one step: it travels, and so does the first after it
            x[~zero] = np.where(rng.random((~zero).sum()) < 0.5, 0, x[~zero])
        enc = _encode(x, None, enc_cache)
        sizes.append(enc.size)
        # Decoded through the caches exactly as without them.
        np.testing.assert_array_equal(_decode(enc, n, cache=dec_cache), _reference(x)[0])
    signs = HEADER + (n + 7) // 8
    full = signs + (n + 7) // 8
    assert sizes == [full, signs, full, full, signs], sizes


def test_mask_cache_out_of_step_is_refused():
    x = np.array([0.0, 1.0, -2.0, 0.0, 3.0], np.float32)
    enc_cache = np.zeros(_C.onebit_cache_bytes(x.size), np.uint8)
    _encode(x, None, enc_cache)
    cached = _encode(x, None, enc_cache)
    assert cached.size == HEADER + 1
    with pytest.raises(pyring.CommError, match="never received"):
        _decode(cached, x.size, cache=np.zeros_like(enc_cache))
    with pytest.raises(pyring.CommError, match="never received"):
        _decode(cached, x.size)  # a decoder with no cache at all
    other = np.zeros_like(enc_cache)
    _decode(_encode(np.array([1.0, 0, 0, 0, 1.0], np.float32), None), x.size, cache=other)
    _decode(_encode(np.array([1.0, 0, 0, 0, 1.0], np.float32), None, other.copy()), x.size,
            cache=other)
    with pytest.raises(pyring.CommError, match="does not hold"):
        _decode(cached, x.size, cache=other)
    with pytest.raises(pyring.CommError, match="holds 5 values, the decoder expects 6"):
        _decode(_encode(x, None), 6)


def _kept(v: np.ndarray) -> np.ndarray:
    """bfloat16 bits of float32 v, rounded to nearest even (torch's cast)."""
    import torch

    return torch.from_numpy(v).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def _kept_value(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)


def _settled(b: np.ndarray, scale: float) -> np.ndarray:
    r = _kept_value(b)
    return (r - np.where(r == 0, 0, np.where(np.signbit(r), -scale, scale))).astype(np.float32)


@pytest.mark.parametrize("n", [1, 9, 4097, 100_003])
def test_kept_residual_rounds_what_it_encodes_to_bfloat16(n):
    # Reference: v = x + the settled residual in float32, rounded to bfloat16; the bytes are
    # those of encoding that v with no residual, the residual keeps its bits, the scale waits.
    rng = np.random.default_rng(n)
    kept = _kept((rng.standard_normal(n) * 0.1).astype(np.float32))
    pending = np.full(1, 0.25, np.float32)
    for step in range(4):
        x = rng.standard_normal(n).astype(np.float32)
        x[::5] = 0.0
        if step == 2:  # the whole segment exactly zero (with a zero residual): scale 0
            x[:] = 0.0
            kept[:] = 0
        want_bits = _kept(x + _settled(kept, pending[0]))
        want = _encode(_kept_value(want_bits), None)
        out = np.zeros(_C.onebit_max_bytes(n), np.uint8)
        got = _C.onebit_encode_deferred(x.ctypes.data, kept.ctypes.data, pending.ctypes.data, n,
                                        out.ctypes.data, 0)
        np.testing.assert_array_equal(out[:got], want)
        np.testing.assert_array_equal(kept, want_bits)
        assert pending[0] == np.frombuffer(want[:4].tobytes(), np.float32)[0]
        settled = np.zeros(n, np.float32)
        _C.onebit_settled_copy(kept.ctypes.data, n, float(pending[0]), settled.ctypes.data)
        np.testing.assert_array_equal(settled, _settled(kept, pending[0]))
        if step == 2:
            assert pending[0] == 0 and not settled.any()


def test_kept_residual_keeps_nan_and_signed_zero():
    x = np.array([np.nan, -0.0, 0.0, 1.0, -np.inf, 3.0e38, -1e-45, 2.0], np.float32)
    kept = np.zeros(8, np.uint16)
    pending = np.zeros(1, np.float32)
    out = np.zeros(_C.onebit_max_bytes(8), np.uint8)
    _C.onebit_encode_deferred(x.ctypes.data, kept.ctypes.data, pending.ctypes.data, 8,
                              out.ctypes.data, 0)
    v = _kept_value(kept)
    # -0.0 plus the settled zero residual is +0.0, as in float32; the rest as torch rounds.
    assert np.isnan(v[0]) and v[1] == 0 and v[4] == -np.inf and v[7] == 2.0
    np.testing.assert_array_equal(kept[2:], _kept(x)[2:])
    assert kept[6] == 0x8000  # -1e-45 rounds to -0.0


def _aligned(n: int, offset: int) -> np.ndarray:
    """n float32 starting `offset` floats past a 32-byte boundary."""
    raw = np.zeros(n + 16, np.float32)
    skip = (-raw.ctypes.data % 32) // 4 + offset
    return raw[skip:skip + n]


def test_large_overwriting_decode_matches_at_any_alignment():
    # From 2**18 values an overwriting decode into 32-byte-aligned memory streams its stores
    # (kernels/onebit_avx2.cc); the values are those of the ordinary stores.
    n = (1 << 18) + 13
    rng = np.random.default_rng(5)
    x = rng.standard_normal(n).astype(np.float32)
    x[::11] = 0.0
    enc = _encode(x, None)
    want, _ = _reference(x)
    for offset in (0, 1, 4):
        out = _aligned(n, offset)
        out[:] = np.nan
        _C.onebit_decode(enc.ctypes.data, n, 1.0, False, out.ctypes.data, 0)
        np.testing.assert_allclose(out, want, rtol=1e-6)
        assert np.array_equal(out, _decode(enc, n)), offset


_SIMD_SCRIPT = """
import pickle, sys
import numpy as np
from pyring import _C
rng = np.random.default_rng(0)
out = []
for n in (1, 7, 8, 9, 4095, 4096, 4097, 100003):
    x = rng.standard_normal(n).astype(np.float32)
    x[::13] = 0
    x[::29] = -0.0
    r = (rng.standard_normal(n) * 0.1).astype(np.float32)
    enc = np.zeros(_C.onebit_max_bytes(n), np.uint8)
    b = _C.onebit_encode(x.ctypes.data, r.ctypes.data, n, enc.ctypes.data, 0)
    dec = rng.standard_normal(n).astype(np.float32)
    _C.onebit_decode(enc.ctypes.data, n, 0.5, True, dec.ctypes.data, 0)
    out.append((enc[:b].tobytes(), r.tobytes(), dec.tobytes()))
    # Kept: two encodings, the second settling the first's residual in its sweep.
    d = ((rng.standard_normal(n) * 0.1).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    d[::3] = 0
    p = np.zeros(1, np.float32)
    for _ in range(2):
        b = _C.onebit_encode_deferred(x.ctypes.data, d.ctypes.data, p.ctypes.data, n,
                                      enc.ctypes.data, 0)
        out.append((enc[:b].tobytes(), d.tobytes(), p.tobytes()))
    s = np.zeros(n, np.float32)
    _C.onebit_settled_copy(d.ctypes.data, n, float(p[0]), s.ctypes.data)
    out.append((s.tobytes(),))
# The owner's step: every unrolled copy count and the loop past them, every way of dividing
# (none, by a power of two, by any other count), copies with and without zeros.
for n in (8, 4096, 12296):
    for copies in (1, 2, 3, 4, 6):
        encs = []
        for k in range(copies):
            c = rng.standard_normal(n).astype(np.float32)
            if k % 2:
                c[::7] = 0
            e = np.zeros(_C.onebit_max_bytes(n), np.uint8)
            _C.onebit_encode(c.ctypes.data, 0, n, e.ctypes.data, 0)
            encs.append(e)
        for divisor in (1, 2, 3, 4, copies + 1):
            own = rng.standard_normal(n).astype(np.float32)
            own[::11] = 0
            r = ((rng.standard_normal(n) * 0.1).astype(np.float32).view(np.uint32) >> 16)
            r = r.astype(np.uint16)
            r[::5] = 0
            p = np.full(1, 0.25, np.float32)
            res = np.zeros(_C.onebit_max_bytes(n), np.uint8)
            b = _C.onebit_reduce_encode(own.ctypes.data, divisor, [e.ctypes.data for e in encs],
                                        [0] * copies, n, r.ctypes.data, p.ctypes.data,
                                        res.ctypes.data, 0)
            out.append((n, copies, divisor, res[:b].tobytes(), r.tobytes(), p.tobytes()))
sys.stdout.buffer.write(pickle.dumps(out))
"""


def test_avx2_and_sse_kernels_give_the_same_bytes(tmp_path):
    import os
    import pickle
    import subprocess
    import sys

    runs = {}
    for simd in ("default", "sse"):
        env = {**os.environ, "PYRING_SIMD": simd}
        # Out of the source tree: its pyring/ has no core built where the package is installed.
        out = subprocess.run([sys.executable, "-c", _SIMD_SCRIPT], env=env, capture_output=True,
                             timeout=120, cwd=tmp_path)
        assert out.returncode == 0, out.stderr.decode()[-2000:]
        runs[simd] = pickle.loads(out.stdout)
    assert runs["default"] == runs["sse"]
