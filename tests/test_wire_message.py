"""One message of float32 values on each wire of the registry (codecs/message.h), the
parameter server's pushes: a decoded message is the encoding's values, the float32 residual
keeps what the encoding dropped (so repeated messages of one value add up to it), a payload of
the wrong size is refused naming the wire, and a non-finite value leaves no residual."""

from __future__ import annotations

import pytest
import torch

from pyring import _C
from pyring.errors import CommError
from pyring.optim.compression import WIRES


def encode(wire, g, residual):
    out = torch.empty(max(1, _C.wire_message_max_bytes(wire, g.numel())), dtype=torch.uint8)
    k = _C.wire_encode_message(wire, g.data_ptr(), 0 if residual is None else
                               residual.data_ptr(), g.numel(), out.data_ptr())
    assert 0 < k <= out.numel()
    return out[:k].clone()


def decode(wire, payload, n):
    out = torch.full((n,), float("nan"))
    _C.wire_decode_message(wire, payload.data_ptr(), payload.numel(), n, out.data_ptr())
    return out


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("n", [1, 255, 1000, 4099])
def test_the_residual_keeps_what_each_message_dropped(wire, n):
    g = torch.randn(n, generator=torch.Generator().manual_seed(n))
    residual = torch.zeros(n)
    total = torch.zeros(n)
    for _ in range(20):
        before = g + residual
        got = decode(wire, encode(wire, g, residual), n)
        # What arrived and what stayed behind make up what was sent, to a rounding.
        torch.testing.assert_close(got + residual, before, rtol=1e-6, atol=1e-6)
        total += got
    # Error feedback: 20 messages of g sum to 20 g, less the last residual alone.
    torch.testing.assert_close(total + residual, 20 * g, rtol=1e-5, atol=1e-4)
    if wire == "fp32":
        assert torch.equal(got, g) and not residual.any()


@pytest.mark.parametrize("wire", WIRES)
def test_without_a_residual_a_message_is_encoded_alone(wire):
    g = torch.randn(300, generator=torch.Generator().manual_seed(1))
    once = decode(wire, encode(wire, g, None), 300)
    assert torch.isfinite(once).all()
    assert torch.equal(once, decode(wire, encode(wire, g, None), 300))


@pytest.mark.parametrize("wire", WIRES)
def test_a_payload_of_the_wrong_size_is_refused_naming_the_wire(wire):
    payload = encode(wire, torch.ones(64), None)
    short = payload[:-1].clone()
    out = torch.zeros(64)
    with pytest.raises(CommError, match=f"a {wire} message of {short.numel()} bytes is not an "
                                        "encoding of 64 values"):
        _C.wire_decode_message(wire, short.data_ptr(), short.numel(), 64, out.data_ptr())
    assert not out.any()  # refused before writing


def test_an_unknown_wire_is_refused_naming_the_valid_ones():
    with pytest.raises(ValueError, match="unknown wire 'fp8'.*int8"):
        _C.wire_message_max_bytes("fp8", 4)


@pytest.mark.parametrize("wire", [w for w in WIRES if w != "fp32"])
def test_a_non_finite_value_leaves_no_residual(wire):
    g = torch.randn(512, generator=torch.Generator().manual_seed(2))
    g[7] = float("inf")
    residual = torch.zeros(512)
    encode(wire, g, residual)
    assert torch.isfinite(residual).all(), residual[~torch.isfinite(residual)]
