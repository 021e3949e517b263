"""The one-bit wire format's kernels (csrc/kernels/onebit.*) against a numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

from pyring import _C


def _encode(x: np.ndarray, residual: np.ndarray | None) -> np.ndarray:
    out = np.zeros(_C.onebit_max_bytes(x.size), np.uint8)
    n = _C.onebit_encode(x.ctypes.data, 0 if residual is None else residual.ctypes.data, x.size,
                         out.ctypes.data)
    return out[:n]


def _decode(enc: np.ndarray, n: int, alpha: float = 1.0, out: np.ndarray | None = None):
    acc = out is not None
    out = np.zeros(n, np.float32) if out is None else out
    _C.onebit_decode(enc.ctypes.data, n, alpha, acc, out.ctypes.data)
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
    assert enc.size == 8 + (n + 7) // 8  # no exact zero: signs only
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
        assert enc.size == 8 + 2 * 2  # signs and the zero mask
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
