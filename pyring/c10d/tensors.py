"""How the ``pyring`` backend hands torch's tensors to a Communicator where they are not
what its collectives take: non-contiguous ones through contiguous copies, complex and bool
reductions through views that reduce the same way (as gloo computes them)."""

from __future__ import annotations

from typing import Any

try:
    import torch
except ImportError:  # the backend registers nothing without torch
    torch = None


class _Dense:
    """Contiguous stand-ins for a call's non-contiguous tensors (transposed views,
    channels_last), which gloo takes too: an input is copied in now; an output (an in-place
    tensor too) is copied in and copied back by ``finish()`` once the call has completed."""

    def __init__(self) -> None:
        self.back: list = []

    @staticmethod
    def input(t: Any) -> Any:
        return t.contiguous() if isinstance(t, torch.Tensor) and not t.is_contiguous() else t

    def output(self, t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or t.is_contiguous():
            return t
        c = t.contiguous()
        self.back.append((t, c))
        return c

    def finish(self, then: Any = None) -> Any:
        """What the Work runs at completion: ``then`` (a copy-out of its own), then the
        copies back; None when there is nothing to run."""
        if not self.back:
            return then
        back = self.back

        def run() -> None:
            if then is not None:
                then()
            for t, c in back:
                t.copy_(c)

        return run


def _real(t: Any, op: Any) -> tuple:
    """``(tensor, op)`` that pyring reduces as gloo does ``t`` with ``op``: a complex SUM or
    AVG as the same reduction of its real view (what torch's own all_reduce hands a
    backend); a bool SUM/PRODUCT/MAX/MIN as MAX/MIN/MAX/MIN of its bytes (any/all); anything
    else as it is."""
    from ..ops import op_code

    if not isinstance(t, torch.Tensor):
        return t, op
    code = op_code(op, "reduce")
    if t.is_complex() and code in (op_code("sum"), op_code("avg")):
        return torch.view_as_real(t), op
    if t.dtype == torch.bool:
        as_bytes = {op_code("sum"): "max", op_code("prod"): "min", op_code("max"): "max",
                    op_code("min"): "min"}
        if code not in as_bytes:
            raise ValueError("pyring backend: bool tensors reduce with SUM, PRODUCT, MAX or MIN")
        return t.view(torch.uint8), as_bytes[code]
    return t, op
